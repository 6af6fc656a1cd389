"""The file store's listing cache (``<root>/.listing.json``): rows kept while the
session's files stand still, never trusted over them, rebuilt when damaged."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from perdure.session import FileSessionStore, SessionMeta
from perdure.stores.file import listing

Message = dict[str, object]


def text(n: int) -> Message:
    return {"role": "user", "content": [{"text": f"message {n}"}]}


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short settle time, so files a test just wrote can be cached after a wait."""
    monkeypatch.setattr(listing, "SETTLE_NS", 50_000_000)
    return 0.1


async def filled(root: Path, count: int) -> None:
    store = FileSessionStore(root)
    for n in range(count):
        await store.create(f"s{n}")
        await store.commit(f"s{n}", [text(k) for k in range(n + 1)])


def listed(root: Path) -> list[SessionMeta]:
    """A listing by a store opened afresh (as another process, or a restarted server)."""
    return asyncio.run(FileSessionStore(root).list())


def rows(root: Path) -> dict[str, list[object]]:
    doc = json.loads((root / listing.CACHE_NAME).read_bytes())
    assert doc["format"] == listing.FORMAT
    result: dict[str, list[object]] = doc["rows"]
    return result


def test_a_full_listing_keeps_settled_rows_and_the_next_one_uses_them(
    tmp_path: Path, settled: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(filled(tmp_path, 3))
    time.sleep(settled)
    first = listed(tmp_path)
    assert [(m.session_id, m.message_count) for m in first] == [("s0", 1), ("s1", 2), ("s2", 3)]
    assert sorted(rows(tmp_path)) == ["s0", "s1", "s2"]

    # The next listing reads no session file: every row comes from the cache.
    def unread(self: FileSessionStore, session_id: str) -> SessionMeta:
        raise AssertionError(f"{session_id} was read")

    monkeypatch.setattr(FileSessionStore, "_meta", unread)
    assert listed(tmp_path) == first


def test_a_session_written_since_is_read_again(tmp_path: Path, settled: float) -> None:
    asyncio.run(filled(tmp_path, 2))
    time.sleep(settled)
    before = listed(tmp_path)
    store = FileSessionStore(tmp_path)
    asyncio.run(store.commit("s1", [text(k) for k in range(5)]))
    after = {m.session_id: m for m in listed(tmp_path)}
    assert after["s1"].message_count == 5
    assert after["s1"].updated_at >= before[1].updated_at
    assert after["s0"] == before[0]
    asyncio.run(store.delete("s0"))
    assert [m.session_id for m in listed(tmp_path)] == ["s1"]
    assert "s0" not in rows(tmp_path)  # a full listing forgets what is gone


def test_an_edit_in_place_of_the_same_size_is_seen(tmp_path: Path, settled: float) -> None:
    """Damage that keeps a file's size and inode still changes its ctime: the row is
    read again and the session listed damaged, never from the cache."""
    asyncio.run(filled(tmp_path, 2))
    time.sleep(settled)
    listed(tmp_path)
    assert "s1" in rows(tmp_path)
    meta = FileSessionStore(tmp_path).session_dir("s1") / "meta.json"
    data = bytearray(meta.read_bytes())
    data[data.index(b"created_at") + 20] ^= 0x01  # a digit of the date
    with open(meta, "r+b") as f:  # in place: same inode, same size
        f.write(bytes(data))
    got = {m.session_id: m for m in listed(tmp_path)}
    assert got["s1"].damaged
    assert not got["s0"].damaged
    assert "s1" not in rows(tmp_path)  # a damaged session is never cached


def test_files_written_just_before_the_listing_are_not_cached(tmp_path: Path) -> None:
    """A coarse clock can give two writes one timestamp: a row read within the settle
    time of its files' last change is not kept."""
    asyncio.run(filled(tmp_path, 2))
    assert [m.message_count for m in listed(tmp_path)] == [1, 2]
    assert not (tmp_path / listing.CACHE_NAME).exists() or rows(tmp_path) == {}


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"not json",
        b'{"format": "perdure-listing/1", "rows": []}',
        b'{"format": "something else", "rows": {}}',
        b"[" * 100_000,
    ],
)
def test_a_damaged_cache_is_rebuilt_never_an_error(
    tmp_path: Path, settled: float, damage: bytes
) -> None:
    asyncio.run(filled(tmp_path, 2))
    time.sleep(settled)
    good = listed(tmp_path)
    (tmp_path / listing.CACHE_NAME).write_bytes(damage)
    assert listed(tmp_path) == good
    assert sorted(rows(tmp_path)) == ["s0", "s1"]  # rebuilt


def test_a_malformed_row_is_read_from_the_files(tmp_path: Path, settled: float) -> None:
    asyncio.run(filled(tmp_path, 2))
    time.sleep(settled)
    good = listed(tmp_path)
    doc = json.loads((tmp_path / listing.CACHE_NAME).read_bytes())
    doc["rows"]["s0"] = ["x", "y", -1, 0, "z"]
    doc["rows"]["s1"][2] = 99  # a count no file says, under a digest that no longer fits
    doc["rows"]["s1"][4] = "0" * 24
    (tmp_path / listing.CACHE_NAME).write_text(json.dumps(doc))
    assert listed(tmp_path) == good


def test_an_unwritable_cache_only_costs_time(tmp_path: Path, settled: float) -> None:
    asyncio.run(filled(tmp_path, 2))
    time.sleep(settled)
    (tmp_path / listing.CACHE_NAME).mkdir()  # cannot be replaced by a file
    assert [m.message_count for m in listed(tmp_path)] == [1, 2]
    assert [m.message_count for m in listed(tmp_path)] == [1, 2]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_pages_and_ttl_listings_use_the_same_rows(tmp_path: Path, settled: float) -> None:
    asyncio.run(filled(tmp_path, 4))
    time.sleep(settled)
    full = listed(tmp_path)
    store = FileSessionStore(tmp_path, ttl=3600)
    page = asyncio.run(store.list(limit=2, after="s0"))
    assert [(m.session_id, m.message_count) for m in page] == [("s1", 2), ("s2", 3)]
    assert [m.session_id for m in asyncio.run(store.list())] == [m.session_id for m in full]
    os.utime(tmp_path)  # nothing in the root's own times matters to a row
    assert listed(tmp_path) == full
