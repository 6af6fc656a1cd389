"""The session index behind the sorted and filtered list (server-side paging)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import conversation, fill

from perdure.server import listing
from perdure.server.listing import SessionIndex
from perdure.session import SessionStore


async def test_pages_sorted_by_update_time_and_filtered(store: SessionStore) -> None:
    await fill(store, "z-newest", conversation(0))
    index = SessionIndex(store)
    page, total, _ = await index.page(order="updated", contains=None, offset=0, limit=2)
    assert ([m.session_id for m in page], total) == (["z-newest", "s2"], 3)
    page, total, _ = await index.page(order="id", contains="S", offset=1, limit=5)
    assert ([m.session_id for m in page], total) == (["s2", "z-newest"], 3)
    page, total, _ = await index.page(order="updated", contains="NEW", offset=0, limit=5)
    assert ([m.session_id for m in page], total) == (["z-newest"], 1)


async def test_a_fast_store_is_read_again_after_a_write(store: SessionStore) -> None:
    index = SessionIndex(store)
    assert len((await index.sessions())[0]) == 2
    await fill(store, "s3", conversation(0))
    assert len((await index.sessions())[0]) == 2  # within max_age, no write seen here
    index.invalidate()
    assert len((await index.sessions())[0]) == 3


async def test_a_slow_store_answers_from_its_copy_while_it_is_read_again(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "FRESH_SCAN", 0.0)  # every full read counts as slow
    index = SessionIndex(store)
    first, read_at = await index.sessions()  # the first read is always waited for
    assert len(first) == 2
    await fill(store, "s3", conversation(0))
    index.invalidate()
    stale, stale_at = await index.sessions()
    assert (len(stale), stale_at) == (2, read_at)  # the copy, with its time
    for _ in range(100):
        await asyncio.sleep(0.01)
        fresh, fresh_at = await index.sessions()
        if len(fresh) == 3:
            break
    assert len(fresh) == 3
    assert fresh_at >= read_at
    await index.close()
