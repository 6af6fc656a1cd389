"""The memory store and the extraction outbox report each class of SQLite error.

Real database files only (issue 15): a database another connection keeps locked is
``MemoryStoreLockedError`` — never reported as damage; a file of garbage bytes is a
``MemoryStoreError`` with ``fault == "damage"`` naming the file; a database that
cannot be opened is a ``MemoryStoreError`` with ``fault == "failure"``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from perdure.memory import ExtractionOutbox, LocalMemoryStore, MemoryStoreError
from perdure.memory import _sqlite as memory_sqlite
from perdure.memory.errors import MemoryStoreLockedError


@pytest.fixture(autouse=True)
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wait 0.1 s, not 10 s, for a lock (the only thing changed: SQLite's own wait)."""
    monkeypatch.setattr(memory_sqlite, "BUSY_TIMEOUT_MS", 100)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A memory database, with a write lock another connection holds."""
    path = tmp_path / "memory.sqlite"
    sqlite3.connect(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE held (x)")
    other.execute("BEGIN EXCLUSIVE")
    other.execute("INSERT INTO held VALUES (1)")
    try:
        yield path
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_a_locked_memory_database_is_locked_not_damaged(held: Path) -> None:
    store = LocalMemoryStore(held, namespace="alice")
    try:
        with pytest.raises(MemoryStoreLockedError) as info:
            await store.add("the user likes tea")
        error = info.value
        assert error.code == "memory_store_locked"
        assert isinstance(error, MemoryStoreError)
        assert error.details["fault"] == "busy"
        assert error.details["file"] == str(held)
        assert str(held) in error.message
        assert "damaged" not in error.message
    finally:
        store.close()


async def test_a_write_lock_on_a_working_store_is_locked_and_passes(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite"
    store = LocalMemoryStore(path, namespace="alice")
    await store.add("the user likes tea")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(MemoryStoreLockedError, match="locked"):
            await store.add("the user likes coffee")
    finally:
        other.execute("ROLLBACK")
        other.close()
    await store.add("the user likes coffee")
    assert len(await store.search("likes", limit=5)) == 2
    store.close()


async def test_a_locked_outbox_is_locked(held: Path) -> None:
    outbox = ExtractionOutbox(held, "agent")
    try:
        with pytest.raises(MemoryStoreLockedError, match="extraction outbox"):
            await outbox.append({"role": "user", "content": [{"text": "hi"}]})
    finally:
        outbox.close()


async def test_garbage_bytes_are_damage_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite"
    path.write_bytes(os.urandom(8192))
    store = LocalMemoryStore(path, namespace="alice")
    try:
        with pytest.raises(MemoryStoreError) as info:
            await store.search("tea", limit=1)
        assert not isinstance(info.value, MemoryStoreLockedError)
        assert info.value.details["fault"] == "damage"
        assert str(path) in info.value.message
        assert "damaged" in info.value.message
    finally:
        store.close()


@pytest.mark.parametrize("where", ["a directory", "under a plain file"])
async def test_a_database_that_cannot_be_opened_is_an_environment_failure(
    tmp_path: Path, where: str
) -> None:
    if where == "a directory":
        path = tmp_path / "memory.sqlite"
        path.mkdir()
    else:
        (tmp_path / "plain").write_text("not a directory")
        path = tmp_path / "plain" / "memory.sqlite"
    store = LocalMemoryStore(path, namespace="alice")
    try:
        with pytest.raises(MemoryStoreError) as info:
            await store.add("the user likes tea")
        assert type(info.value) is MemoryStoreError
        assert info.value.details["fault"] == "failure"
        assert str(path) in info.value.message
        assert isinstance(info.value.__cause__, OSError | sqlite3.Error)
    finally:
        store.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
async def test_a_read_only_database_is_an_environment_failure(tmp_path: Path) -> None:
    path = tmp_path / "ro" / "memory.sqlite"
    store = LocalMemoryStore(path, namespace="alice")
    await store.add("the user likes tea")
    store.close()
    path.chmod(0o444)
    (tmp_path / "ro").chmod(0o555)
    try:
        store = LocalMemoryStore(path, namespace="alice")
        with pytest.raises(MemoryStoreError) as info:
            await store.add("the user likes coffee")
        assert type(info.value) is MemoryStoreError
        assert info.value.details["fault"] == "failure"
        store.close()
    finally:
        (tmp_path / "ro").chmod(0o755)
        path.chmod(0o644)
