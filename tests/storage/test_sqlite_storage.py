"""SQLiteStorage specifics: WAL, driver errors translated, never leaked."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from perdure.errors import PerdureError, SessionCorruptedError, StorageLockedError
from perdure.storage import SQLiteStorage


async def test_database_is_in_wal_mode_with_schema_version(tmp_path: Path) -> None:
    storage = SQLiteStorage(tmp_path / "db" / "blobs.db")
    await storage.write("k", b"v")
    storage.close()
    conn = sqlite3.connect(tmp_path / "db" / "blobs.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert conn.execute("SELECT key, data FROM perdure_blobs").fetchall() == [("k", b"v")]
    finally:
        conn.close()


async def test_a_version_1_file_is_upgraded_and_its_blobs_get_versions(tmp_path: Path) -> None:
    path = tmp_path / "blobs.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE perdure_blobs (key TEXT PRIMARY KEY NOT NULL, data BLOB NOT NULL)")
    conn.executemany("INSERT INTO perdure_blobs VALUES (?, ?)", [("a", b"1"), ("b", b"2")])
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    storage = SQLiteStorage(path)
    try:
        assert await storage.read("a") == b"1"
        first, second = await storage.version("a"), await storage.version("b")
        assert first is not None
        assert second not in (None, first)
        made = await storage.write_if("a", b"new", expected=first)
        assert made != first
        assert await storage.read("a") == b"new"
    finally:
        storage.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    finally:
        conn.close()


async def test_a_file_that_is_not_a_database_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database, just text " * 200)
    storage = SQLiteStorage(path)
    with pytest.raises(SessionCorruptedError) as info:
        await storage.read("k")
    assert info.value.code == "session_store_corrupted"
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    storage.close()


async def test_a_held_write_lock_past_the_timeout_is_storage_locked(tmp_path: Path) -> None:
    path = tmp_path / "blobs.db"
    storage = SQLiteStorage(path, timeout=0.2)
    await storage.write("k", b"v")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageLockedError) as info:
            await storage.write("k", b"w")
        assert info.value.code == "storage_locked"
        assert await storage.read("k") == b"v"  # WAL: readers are not blocked
    finally:
        other.execute("ROLLBACK")
        other.close()
    await storage.write("k", b"w")
    assert await storage.read("k") == b"w"
    storage.close()


async def test_a_closed_storage_raises_a_perdure_error(tmp_path: Path) -> None:
    storage = SQLiteStorage(tmp_path / "blobs.db")
    await storage.write("k", b"v")
    storage.close()
    storage.close()  # idempotent
    with pytest.raises(PerdureError, match="closed"):
        await storage.read("k")


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "blobs.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 9")
    conn.close()
    storage = SQLiteStorage(path)
    with pytest.raises(PerdureError, match="schema version 9"):
        await storage.list("")
    storage.close()


async def test_two_instances_share_one_file(tmp_path: Path) -> None:
    first = SQLiteStorage(tmp_path / "blobs.db")
    second = SQLiteStorage(tmp_path / "blobs.db")
    await asyncio.gather(*(first.write(f"a/{i}", b"1") for i in range(20)))
    await asyncio.gather(*(second.write(f"b/{i}", b"2") for i in range(20)))
    assert len(await second.list("")) == 40
    assert await first.read("b/3") == b"2"
    first.close()
    second.close()


def test_bad_constructor_arguments() -> None:
    with pytest.raises(TypeError, match="path"):
        SQLiteStorage(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        SQLiteStorage("x.db", timeout=-1)
