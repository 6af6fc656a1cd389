"""SQLiteStorage reports each class of SQLite error in its own words (issue 15).

Real database files only: a lock another connection holds, a file of garbage bytes,
a database that cannot be opened. Only damage is reported as damage.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from perdure._runtime.sqlite import transaction
from perdure.errors import (
    SessionCorruptedError,
    SessionLockedError,
    StorageError,
    StorageLockedError,
)
from perdure.storage import SQLiteStorage


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A database in rollback-journal mode that another connection holds EXCLUSIVE."""
    path = tmp_path / "held.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN EXCLUSIVE")
    other.execute("INSERT INTO t VALUES (1)")
    try:
        yield path
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_a_database_locked_by_another_connection_is_locked_not_damaged(held: Path) -> None:
    storage = SQLiteStorage(held, timeout=0.1)
    try:
        with pytest.raises(StorageLockedError) as info:
            await storage.read("k")
        error = info.value
        assert error.code == "storage_locked"
        assert isinstance(error, StorageError)
        assert not isinstance(error, SessionCorruptedError | SessionLockedError)
        assert str(held) in error.message
        assert "damaged" not in error.message
        assert error.details["fault"] == "busy"
        assert error.details["file"] == str(held)
        assert isinstance(error.__cause__, sqlite3.OperationalError)
    finally:
        storage.close()


async def test_a_write_lock_held_in_wal_mode_blocks_writes_only(tmp_path: Path) -> None:
    path = tmp_path / "blobs.db"
    storage = SQLiteStorage(path, timeout=0.1)
    await storage.write("k", b"v")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageLockedError, match=str(path)):
            await storage.delete("k")
        assert await storage.read("k") == b"v"
    finally:
        other.execute("ROLLBACK")
        other.close()
    await storage.delete("k")
    assert await storage.read("k") is None
    storage.close()


async def test_garbage_bytes_are_damage_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(os.urandom(8192))
    storage = SQLiteStorage(path)
    try:
        with pytest.raises(SessionCorruptedError) as info:
            await storage.list("")
        assert str(path) in info.value.message
        assert info.value.details["file"] == str(path)
        assert info.value.details["fault"] == "damage"
        assert not isinstance(info.value, StorageError)
    finally:
        storage.close()


async def test_a_database_that_cannot_be_opened_is_an_environment_failure(tmp_path: Path) -> None:
    # A directory where the database file should be: SQLITE_CANTOPEN.
    (tmp_path / "dir.db").mkdir()
    storage = SQLiteStorage(tmp_path / "dir.db")
    with pytest.raises(StorageError) as info:
        await storage.write("k", b"v")
    error = info.value
    assert type(error) is StorageError
    assert error.details["fault"] == "failure"
    assert str(tmp_path / "dir.db") in error.message
    assert isinstance(error.__cause__, sqlite3.OperationalError)
    storage.close()


async def test_a_database_under_a_plain_file_is_an_environment_failure(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a directory")
    path = tmp_path / "plain" / "blobs.db"
    storage = SQLiteStorage(path)
    with pytest.raises(StorageError) as info:
        await storage.read("k")
    assert type(info.value) is StorageError
    assert str(path) in info.value.message
    assert isinstance(info.value.__cause__, OSError)
    storage.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
async def test_a_read_only_database_is_an_environment_failure(tmp_path: Path) -> None:
    path = tmp_path / "ro" / "blobs.db"
    storage = SQLiteStorage(path)
    await storage.write("k", b"v")
    storage.close()
    path.chmod(0o444)
    (tmp_path / "ro").chmod(0o555)
    try:
        storage = SQLiteStorage(path)
        with pytest.raises(StorageError) as info:
            await storage.write("k", b"w")
        assert type(info.value) is StorageError
        assert info.value.details["fault"] == "failure"
        assert str(path) in info.value.message
        storage.close()
    finally:
        (tmp_path / "ro").chmod(0o755)
        path.chmod(0o644)


def test_a_transaction_rolls_back_and_reports_the_error_that_stopped_it(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")

    def fails() -> None:
        with transaction(conn):
            conn.execute("INSERT INTO t VALUES (1)")
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fails()
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with transaction(conn):
        conn.execute("INSERT INTO t VALUES (2)")
    assert conn.execute("SELECT x FROM t").fetchall() == [(2,)]
    conn.close()
