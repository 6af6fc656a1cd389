"""A Redis session that lost its head hash behind the store's back (SPEC §7.1).

Redis may drop the ``:h`` key alone (an ``allkeys-lru`` or ``volatile-*``
``maxmemory-policy``), or an operator may delete it. Its messages and checkpoints are
still there: the session is damaged, never unknown, and no read, commit, ``create``
or ``Session`` opening deletes what is left. ``list`` shows it damaged, so ``verify``
reports it. What an expiry leaves for a moment (the tombstone there, the key due with
the head) is the only thing a ``create`` clears; checkpoints kept under an id with
no session stay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from perdure.errors import SessionCorruptedError, SessionNotFoundError
from perdure.maintenance import verify_store
from perdure.testing.checkpoints import put_new
from perdure.testing.messages import conversation, text
from redis_server import client, drop_prefix, import_redis, new_prefix, require_server

import_redis()
from perdure.session import RedisSessionStore, Session  # noqa: E402


@pytest.fixture
def prefix() -> Iterator[str]:
    require_server()
    name = new_prefix()
    yield name
    drop_prefix(name)


@pytest.fixture
def opened(prefix: str) -> Iterator[Callable[..., RedisSessionStore]]:
    """Opens stores under the test's prefix; every one is closed after the test."""
    url = require_server()
    stores: list[RedisSessionStore] = []

    def open_one(**options: Any) -> RedisSessionStore:
        store = RedisSessionStore(url, prefix=prefix, **options)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


def _dump(prefix: str) -> dict[bytes, bytes]:
    """Every key under ``prefix`` with its serialized value (``DUMP``)."""
    with client() as c:
        return {key: c.dump(key) for key in c.scan_iter(match=prefix + "*")}


def _check_lost_head(info: pytest.ExceptionInfo[SessionCorruptedError], prefix: str) -> None:
    assert info.value.code == "session_store_corrupted"
    assert info.value.details["missing_key"] == f"{prefix}{{x}}:h"
    assert info.value.details["found_key"] == f"{prefix}{{x}}:m"
    assert f"{prefix}{{x}}:h" in info.value.message


async def test_a_lost_head_is_damage_on_every_path_and_nothing_is_deleted(
    opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store = opened()
    for session_id in ("w", "x", "y"):
        await store.create(session_id)
        await store.commit(session_id, conversation(4))
    checkpoint = await put_new(store.checkpoints, "x")
    with client() as c:
        c.delete(f"{prefix}{{x}}:h")
    left = _dump(prefix)
    assert f"{prefix}{{x}}:m".encode() in left

    with pytest.raises(SessionCorruptedError) as info:
        await store.get("x")
    _check_lost_head(info, prefix)
    with pytest.raises(SessionCorruptedError) as info:
        await store.history_page("x", 0, 2)
    _check_lost_head(info, prefix)
    with pytest.raises(SessionCorruptedError) as info:
        await store.commit("x", [*conversation(4), text("user", "more")])
    _check_lost_head(info, prefix)
    for exist_ok in (True, False):
        with pytest.raises(SessionCorruptedError) as info:
            await store.create("x", exist_ok=exist_ok)
        _check_lost_head(info, prefix)
    with pytest.raises(SessionCorruptedError) as info:
        await Session.resume(store, "x").history()
    _check_lost_head(info, prefix)
    with pytest.raises(SessionCorruptedError) as info:
        await Session(store, "x").history()  # open-or-create: never a fresh session
    _check_lost_head(info, prefix)
    assert _dump(prefix) == left  # nothing deleted, nothing written

    listed = {m.session_id: m for m in await store.list()}
    assert sorted(listed) == ["w", "x", "y"]
    assert listed["w"].damaged is None
    assert listed["y"].message_count == 4
    assert listed["x"].damaged is not None
    assert f"{prefix}{{x}}:h" in listed["x"].damaged
    assert [m.session_id for m in await store.list(after="w", limit=1)] == ["x"]
    report = await verify_store(store)
    assert report.damaged_sessions == ("x",)
    assert [(d.kind, f"{prefix}{{x}}:m" in d.detail) for d in report.damage] == [("bad_meta", True)]
    assert (await store.checkpoints.get("x", checkpoint.meta.checkpoint_id)) == checkpoint

    await store.delete("x")  # what the user asks for, and only then
    assert not [k for k in _dump(prefix) if b"{x}" in k]
    await store.create("x")
    assert (await store.get("x")).message_count == 0


async def test_a_lost_head_under_a_ttl_is_damage_not_expiry(
    opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store = opened(ttl=60)
    await store.create("x")
    await store.commit("x", conversation(2))
    with client() as c:
        c.delete(f"{prefix}{{x}}:h")  # the tombstone stays, the list is due in a minute
    left = _dump(prefix)
    with pytest.raises(SessionCorruptedError) as info:
        await store.get("x")
    _check_lost_head(info, prefix)
    with pytest.raises(SessionCorruptedError) as info:
        await store.create("x")
    _check_lost_head(info, prefix)
    assert set(_dump(prefix)) == set(left)
    assert [m.damaged is not None for m in await store.list()] == [True]


async def test_what_an_expiry_leaves_for_a_moment_goes_and_the_id_starts_afresh(
    opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store = opened(ttl=60)
    await store.create("x")
    await store.commit("x", conversation(2))
    with client() as c:  # Redis dropped the head first; the list goes within 300 ms
        c.delete(f"{prefix}{{x}}:h")
        c.pexpire(f"{prefix}{{x}}:m", 300)
    with pytest.raises(SessionNotFoundError) as info:
        await store.get("x")
    assert info.value.details["reason"] == "expired"
    assert await store.list() == []
    await store.create("x")
    assert (await store.get("x")).message_count == 0
    await store.commit("x", conversation(2))  # the new list is the session's own
    assert (await store.get("x")).messages == conversation(2)


async def test_checkpoints_kept_under_an_id_with_no_session_survive_its_create(
    opened: Callable[..., RedisSessionStore],
) -> None:
    store = opened()
    kept = await put_new(store.checkpoints, "x")  # the checkpoint store on its own
    assert await store.list() == []  # checkpoints alone are no session
    await store.create("x")
    assert [m.checkpoint_id for m in await store.checkpoints.list("x")] == [kept.meta.checkpoint_id]
    assert (await store.checkpoints.get("x", kept.meta.checkpoint_id)) == kept
