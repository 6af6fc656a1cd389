"""The seed-004 production layout against the real servers (SPEC §7, §9).

``Session(RedisSessionStore(url, ttl=1800), id, checkpoints=PostgresCheckpointStore(dsn))``:
the live log in Redis, with a TTL; checkpoints in PostgreSQL, without one. Checkpoint,
restore and fork work across the two, and once Redis expired the session the
checkpoints still restore it. Each test has a Redis key prefix and a PostgreSQL
schema of its own, deleted after it; skipped without either server, failed under
CI=true.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from perdure import Agent
from perdure.errors import SessionNotFoundError
from perdure.maintenance import gc_checkpoints, gc_store
from perdure.models import ScriptedModel
from perdure.session import Session
from perdure.testing.checkpoints import put_aged
from postgres_server import DSN, execute, import_psycopg, schema_fixture
from redis_server import client, drop_prefix, import_redis, new_prefix, require_server

import_redis()
import_psycopg()
from perdure.session import PostgresCheckpointStore, RedisSessionStore  # noqa: E402


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def prefix() -> Iterator[str]:
    require_server()
    name = new_prefix()
    yield name
    drop_prefix(name)


@pytest.fixture
def layout(prefix: str, schema: str) -> Iterator[Any]:
    """Opens (Redis session store, PostgreSQL checkpoint store) pairs; closed after."""
    opened: list[Any] = []

    def open_layout(ttl: float) -> tuple[RedisSessionStore, PostgresCheckpointStore]:
        pair = (
            RedisSessionStore(require_server(), prefix=prefix, ttl=ttl),
            PostgresCheckpointStore(DSN, schema=schema),
        )
        opened.extend(pair)
        return pair

    yield open_layout
    for store in opened:
        store.close()


def texts(messages: list[Any]) -> list[str]:
    return [m["content"][0]["text"] for m in messages]


def test_checkpoint_restore_and_fork_work_across_redis_and_postgres(
    layout: Any, prefix: str, schema: str
) -> None:
    store, checkpoints = layout(1800)
    session = Session(store, "s", checkpoints=checkpoints)
    agent = Agent(model=ScriptedModel(["one", "two", "three"]), session_manager=session)
    agent("first")
    meta = asyncio.run(session.checkpoint("after the first turn"))
    agent("second")
    assert texts(asyncio.run(store.get("s")).messages) == ["first", "one", "second", "two"]

    # The checkpoint is a PostgreSQL row, and no Redis key holds it.
    rows = execute(f"SELECT session_id, checkpoint_id FROM {schema}.perdure_checkpoints")
    assert rows == [("s", meta.checkpoint_id)]
    assert asyncio.run(store.checkpoints.list("s")) == []
    assert [m.checkpoint_id for m in asyncio.run(session.list_checkpoints())] == [
        meta.checkpoint_id
    ]
    # The live log expires in Redis: its head and messages carry the 30 min TTL.
    with client() as redis:
        ttls = [redis.pttl(f"{prefix}{{s}}:{part}") for part in ("h", "m")]
    assert all(0 < ttl <= 1_800_000 for ttl in ttls), ttls

    result = asyncio.run(session.restore(meta.checkpoint_id))
    assert (result.status, result.from_messages, result.to_messages) == ("restored", 4, 2)
    assert texts(agent.messages) == ["first", "one"]
    assert texts(asyncio.run(store.get("s")).messages) == ["first", "one"]
    listed = asyncio.run(checkpoints.list("s"))
    assert [m.trigger for m in listed] == ["manual", "pre_restore"]
    assert listed[1].checkpoint_id == result.pre_restore_checkpoint_id
    agent("third")  # the restored session goes on in Redis
    assert texts(asyncio.run(store.get("s")).messages) == ["first", "one", "third", "three"]

    forked = asyncio.run(session.fork(meta.checkpoint_id))
    assert texts(asyncio.run(store.get(forked)).messages) == ["first", "one"]
    branch = Agent(
        model=ScriptedModel(["on the branch"]),
        session_manager=Session(store, forked, checkpoints=checkpoints),
    )
    branch("elsewhere")
    assert texts(asyncio.run(store.get(forked)).messages)[2:] == ["elsewhere", "on the branch"]
    assert len(asyncio.run(store.get("s")).messages) == 4  # the source untouched


def test_after_redis_expires_the_session_its_postgres_checkpoints_restore_it(
    layout: Any, schema: str
) -> None:
    store, checkpoints = layout(1)
    session = Session(store, "s", checkpoints=checkpoints)
    agent = Agent(model=ScriptedModel(["noted: 42"]), session_manager=session)
    agent("remember 42")
    meta = asyncio.run(session.checkpoint("remembered"))
    assert asyncio.run(store.checkpoints.list("s")) == []  # in PostgreSQL only
    assert execute(f"SELECT checkpoint_id FROM {schema}.perdure_checkpoints") == [
        (meta.checkpoint_id,)
    ]

    time.sleep(2.0)  # Redis expires the session natively after 1 s without a commit
    with pytest.raises(SessionNotFoundError) as info:
        Session.resume(store, "s")
    assert info.value.details["reason"] == "expired"

    fresh = Session(store, "s", checkpoints=checkpoints)  # a new, empty session
    again = Agent(model=ScriptedModel([]), session_manager=fresh)
    assert again.messages == []
    assert [m.checkpoint_id for m in asyncio.run(fresh.list_checkpoints())] == [meta.checkpoint_id]
    result = asyncio.run(fresh.restore(meta.checkpoint_id))
    assert (result.status, result.from_messages, result.to_messages) == ("restored", 0, 2)
    assert texts(again.messages) == ["remember 42", "noted: 42"]
    assert texts(asyncio.run(store.get("s")).messages) == ["remember 42", "noted: 42"]
    assert [m.trigger for m in asyncio.run(fresh.list_checkpoints())] == [
        "manual",
        "pre_restore",
    ]


def test_gc_checkpoints_prunes_the_checkpoints_of_sessions_redis_forgot(layout: Any) -> None:
    store, checkpoints = layout(1800)
    kept = Session(store, "live", checkpoints=checkpoints)
    Agent(model=ScriptedModel(["hi"]), session_manager=kept)("hello")
    recent = asyncio.run(kept.checkpoint("recent"))
    # Checkpoints made 100 days ago of a session Redis no longer holds.
    forgotten = [asyncio.run(put_aged(checkpoints, "forgotten", hours=2400)) for _ in range(2)]
    assert [m.session_id for m in asyncio.run(store.list())] == ["live"]
    # gc over the session store walks the sessions Redis lists: it never sees them.
    report = asyncio.run(gc_store(store, max_checkpoint_age=90 * 86400, dry_run=False))
    assert report.pruned == ()
    report = asyncio.run(gc_checkpoints(checkpoints, max_checkpoint_age=90 * 86400, dry_run=False))
    assert sorted(p.checkpoint_id for p in report.pruned) == [
        r.meta.checkpoint_id for r in forgotten
    ]
    assert asyncio.run(checkpoints.checkpoint_sessions()) == ["live"]
    assert [m.checkpoint_id for m in asyncio.run(kept.list_checkpoints())] == [recent.checkpoint_id]
