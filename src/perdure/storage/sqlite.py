"""SQLiteStorage: blobs in one SQLite table (WAL, one writer, ``BEGIN IMMEDIATE``).

The database holds ``perdure_blobs(key TEXT PRIMARY KEY, data BLOB)`` and
``PRAGMA user_version = 1``. It runs in WAL mode with ``synchronous=FULL`` (a write
that returned survives power loss) and a busy timeout, so several processes can share
the file: readers never block, writers queue. Within one ``SQLiteStorage`` a single
connection, guarded by a ``threading.Lock``, serves every call from a worker thread
(``asyncio.to_thread``): no coroutine binds to an event loop.

``sqlite3`` errors never leave this module: a database that stays locked past the
busy timeout raises :class:`~perdure.errors.SessionLockedError`; a damaged file or
one that is not a database raises :class:`~perdure.errors.SessionCorruptedError`;
a statement SQLite refuses (a bug in perdure, never damage) raises
:class:`~perdure._runtime.sqlite.SQLiteBugError`; any other failure (disk full,
read-only file, …) raises :class:`~perdure.errors.StorageError`. The original error
is chained as ``__cause__``. A schema that is not ours is refused on connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from perdure._runtime.sqlite import DRIVER_ERRORS, SQLiteBugError, sqlite_fault, sqlite_fault_text
from perdure._runtime.threads import PerProcess, ProcessLock
from perdure.errors import (
    SessionCorruptedError,
    SessionLockedError,
    StorageError,
)
from perdure.storage.keys import check_data, validate_key, validate_list_args

__all__ = ["SQLiteStorage"]

T = TypeVar("T")

SCHEMA_VERSION = 1


def _translate(exc: sqlite3.Error | UnicodeDecodeError, path: Path, timeout: float) -> Exception:
    """Map a driver error to perdure's error tree (sorted by :func:`sqlite_fault`)."""
    fault = sqlite_fault(exc)
    text = sqlite_fault_text(exc)
    if fault == "busy":
        return SessionLockedError(
            f"SQLite database {str(path)!r} stayed locked by another writer for more "
            f"than {timeout:g} s: {text}"
        )
    if fault == "damage":
        return SessionCorruptedError(
            f"SQLite database {str(path)!r} is damaged: {text}",
            details={"file": str(path), "kind": "bad_database"},
        )
    if fault == "bug":
        return SQLiteBugError(f"SQLite storage {str(path)!r}: perdure's SQL failed: {text}")
    return StorageError(f"SQLite storage {str(path)!r} failed: {text}")


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is open; the error that stopped the work is the one to report.

    (SQLite rolls back by itself on some errors, a damaged page say.)
    """
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _upper_bound(prefix: str) -> str | None:
    """The smallest string above every string starting with ``prefix`` (None: unbounded)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000  # skip surrogates: they cannot be encoded as UTF-8
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


class SQLiteStorage:
    """Store blobs in a SQLite database file; writes are atomic and durable.

    Args:
        path: The database file (created, with its table, on first use).
        timeout: Seconds to wait for another process's write lock before raising
            :class:`~perdure.errors.SessionLockedError`.

    After ``write`` returns the blob is committed (``synchronous=FULL``); a crash
    during ``write`` leaves the previous blob. Call :meth:`close` when done (it is
    also safe to let the process exit).

    Raises (from every method):
        SessionLockedError: another process held the write lock past the timeout.
        SessionCorruptedError: the file is not a SQLite database or is damaged.
        StorageError: any other SQLite failure.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 10.0) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a path, got {type(path).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ValueError(f"timeout must be a number >= 0, got {timeout!r}")
        self.path = Path(path).absolute()
        self.timeout = float(timeout)
        self._lock = ProcessLock()
        # This process's connection: a child made by fork() opens its own, leaving
        # the parent's alone (SQLite forbids using it there; closing it could disturb
        # the parent's locks).
        self._conns: PerProcess[sqlite3.Connection | None] = PerProcess(lambda: None)
        self._closed = False

    @property
    def _conn(self) -> sqlite3.Connection | None:
        return self._conns.value

    @_conn.setter
    def _conn(self, conn: sqlite3.Connection | None) -> None:
        self._conns.value = conn

    def __repr__(self) -> str:
        return f"SQLiteStorage({str(self.path)!r})"

    # -------------------------------------------------------------- plumbing

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(f"SQLiteStorage {str(self.path)!r} is closed")
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=self.timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"SQLite storage {str(self.path)!r} has schema version {version}; this "
                    f"perdure reads version {SCHEMA_VERSION} (upgrade perdure)"
                )
            if version < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS perdure_blobs ("
                        "key TEXT PRIMARY KEY NOT NULL, data BLOB NOT NULL)"
                    )
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
            columns = sorted(row[1] for row in conn.execute("PRAGMA table_info(perdure_blobs)"))
            if columns != ["data", "key"]:
                raise self._damaged("its perdure_blobs table is missing or not ours")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _damaged(self, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"SQLite database {str(self.path)!r} is damaged: {detail}",
            details={"file": str(self.path), "kind": "bad_database"},
        )

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return work(self._connect())
            except DRIVER_ERRORS as exc:
                raise _translate(exc, self.path, self.timeout) from exc

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._run, work)

    def close(self) -> None:
        """Close the connection; later calls raise ``StorageError``. Idempotent."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                conn, self._conn = self._conn, None
                try:
                    conn.close()
                except sqlite3.Error as exc:
                    raise _translate(exc, self.path, self.timeout) from exc

    # ------------------------------------------------------------------ API

    async def write(self, key: str, data: bytes) -> None:
        """Atomically replace the blob under ``key``; committed when this returns."""
        validate_key(key)
        blob = check_data(data)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO perdure_blobs (key, data) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET data = excluded.data",
                    (key, blob),
                )
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

        await self._call(work)

    async def read(self, key: str) -> bytes | None:
        """Return the blob under ``key``, or ``None``."""
        validate_key(key)

        def work(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT data FROM perdure_blobs WHERE key = ?", (key,)).fetchone()
            if row is not None and not isinstance(row[0], bytes):
                raise self._damaged(f"the value of key {key!r} is not a blob")
            return None if row is None else row[0]

        return await self._call(work)

    async def delete(self, key: str) -> None:
        """Remove ``key`` (idempotent); committed when this returns."""
        validate_key(key)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM perdure_blobs WHERE key = ?", (key,))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

        await self._call(work)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        """Return sorted keys starting with ``prefix`` after ``start_after`` (see ``Storage``).

        SQLite compares TEXT as UTF-8 bytes, which orders like Python code points.
        """
        validate_list_args(prefix, limit, start_after)
        if limit == 0:
            return []
        clauses = ["key >= ?"]
        params: list[object] = [prefix]
        upper = _upper_bound(prefix)
        if upper is not None:
            clauses.append("key < ?")
            params.append(upper)
        if start_after is not None:
            clauses.append("key > ?")
            params.append(start_after)
        sql = f"SELECT key FROM perdure_blobs WHERE {' AND '.join(clauses)} ORDER BY key"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)

        def work(conn: sqlite3.Connection) -> list[str]:
            keys = [row[0] for row in conn.execute(sql, params)]
            if not all(isinstance(k, str) for k in keys):
                raise self._damaged("a key is not text")
            return keys

        return await self._call(work)
