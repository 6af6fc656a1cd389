"""The session index behind the sorted and filtered list (server-side paging)."""

from __future__ import annotations

import asyncio

import pytest

from perdure.server import listing
from perdure.server.listing import SessionIndex
from perdure.session import SessionStore
from server_support import conversation, fill


async def test_pages_sorted_by_update_time_and_filtered(store: SessionStore) -> None:
    await fill(store, "z-newest", conversation(0))
    index = SessionIndex(store)
    page, start, total, _ = await index.page(order="updated", offset=0, limit=2)
    assert ([m.session_id for m in page], start, total) == (["z-newest", "s2"], 0, 3)
    page, start, total, _ = await index.page(order="id", contains="S", offset=1, limit=5)
    assert ([m.session_id for m in page], start, total) == (["s2", "z-newest"], 1, 3)
    page, _, total, _ = await index.page(order="updated", contains="NEW", limit=5)
    assert ([m.session_id for m in page], total) == (["z-newest"], 1)
    # a cursor need not name a session: the page starts at the next id
    page, start, _, _ = await index.page(order="id", after="s1x", limit=5)
    assert ([m.session_id for m in page], start) == (["s2", "z-newest"], 1)
    with pytest.raises(ValueError, match="after pages the id order only"):
        await index.page(order="updated", after="s1", limit=5)


async def test_a_fast_store_is_read_again_after_a_write(store: SessionStore) -> None:
    index = SessionIndex(store)
    assert (await index.page(order="id", limit=10))[2] == 2
    await fill(store, "s3", conversation(0))
    assert (await index.page(order="id", limit=10))[2] == 2  # within max_age, unseen
    index.invalidate()
    assert (await index.page(order="id", limit=10))[2] == 3


async def test_a_slow_store_answers_from_its_copy_while_it_is_read_again(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "FRESH_SCAN", 0.0)  # every full read counts as slow
    index = SessionIndex(store)
    _, _, first, read_at = await index.page(order="id", limit=10)  # always waited for
    assert first == 2
    await fill(store, "s3", conversation(0))
    index.invalidate()
    _, _, stale, stale_at = await index.page(order="id", limit=10)
    assert (stale, stale_at) == (2, read_at)  # the copy, with its time
    for _ in range(100):
        await asyncio.sleep(0.01)
        _, _, fresh, fresh_at = await index.page(order="id", limit=10)
        if fresh == 3:
            break
    assert fresh == 3
    assert fresh_at >= read_at
    await index.close()


class CountingLists:
    """A real store whose full listings are counted."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.lists = 0

    async def list(self, **kwargs: object) -> object:
        self.lists += 1
        return await self.store.list(**kwargs)  # type: ignore[arg-type]


async def test_the_first_read_starts_with_the_server_and_is_waited_for_once(
    store: SessionStore,
) -> None:
    counting = CountingLists(store)
    index = SessionIndex(counting)  # type: ignore[arg-type]
    index.warm()
    pages = await asyncio.gather(*(index.page(order="id", limit=1) for _ in range(3)))
    assert [total for _, _, total, _ in pages] == [2, 2, 2]
    assert counting.lists == 1
    await index.close()


async def test_requests_that_find_the_copy_stale_together_share_one_read(
    store: SessionStore,
) -> None:
    counting = CountingLists(store)
    index = SessionIndex(counting)  # type: ignore[arg-type]
    await index.page(order="id", limit=1)
    index.invalidate()
    await asyncio.gather(*(index.page(order="id", limit=1) for _ in range(4)))
    assert counting.lists == 2
