"""SQLiteStorage: blobs in one SQLite table (WAL, one writer, ``BEGIN IMMEDIATE``).

The database holds ``perdure_blobs(key TEXT PRIMARY KEY, data BLOB, version TEXT)``
and ``PRAGMA user_version = 2`` (a version-1 file, without the ``version`` column, is
upgraded on first use: each blob gets a random version). Every write gives its blob
a new version, 32 random hex digits, so a key never has a version twice; ``write_if``
(:class:`~perdure.storage.ConditionalStorage`) compares and writes in one
``BEGIN IMMEDIATE`` transaction, which no other writer of the file can interleave.

It runs in WAL mode with ``synchronous=FULL`` (a write that returned survives power
loss) and a busy timeout, so several processes can share the file: readers never
block, writers queue. Within one ``SQLiteStorage`` a single
connection per process, guarded by a lock, serves every call from a worker thread
(``asyncio.to_thread``): no coroutine binds to an event loop.

``sqlite3`` errors never leave this module; they are sorted by perdure's one
translation (:func:`perdure._runtime.sqlite.translate`): a database that stays
locked past the busy timeout raises :class:`~perdure.errors.StorageLockedError`; a
damaged file or one that is not a database raises
:class:`~perdure.errors.SessionCorruptedError`; a statement SQLite refuses (a bug in
perdure, never damage) raises :class:`~perdure._runtime.sqlite.SQLiteBugError`; any
other failure (disk full, a file it cannot open, …) raises
:class:`~perdure.errors.StorageError`. Each names the file, and the original error
is chained as ``__cause__``. A schema that is not ours is refused on connect.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from perdure._runtime.sqlite import (
    DRIVER_ERRORS,
    ConnectionSlot,
    SQLiteErrors,
    transaction,
    translate,
)
from perdure.crypto import Cipher, check_cipher
from perdure.errors import SessionCorruptedError, StorageError, StorageLockedError
from perdure.storage.encrypted import open_blob, seal_blob
from perdure.storage.keys import (
    check_expected,
    prefix_upper_bound,
    validate_key,
    validate_list_args,
    version_conflict,
)

__all__ = ["SQLiteStorage"]

T = TypeVar("T")

SCHEMA_VERSION = 2


_ERRORS = SQLiteErrors(busy=StorageLockedError, damage=SessionCorruptedError, failure=StorageError)
"""This layer's error for each fault of a driver error."""


class SQLiteStorage:
    """Store blobs in a SQLite database file; writes are atomic and durable.

    Args:
        path: The database file (created, with its table, on first use).
        timeout: Seconds to wait for another process's write lock before raising
            :class:`~perdure.errors.StorageLockedError`.
        cipher: a :class:`~perdure.crypto.Cipher`: every blob is stored encrypted
            (:func:`~perdure.storage.encrypted.seal_blob`); a read of a blob that does
            not decrypt raises :class:`~perdure.errors.DecryptionError`.

    After ``write`` returns the blob is committed (``synchronous=FULL``); a crash
    during ``write`` leaves the previous blob. Call :meth:`close` when done (it is
    also safe to let the process exit).

    Raises (from every method):
        StorageLockedError: another process held the write lock past the timeout.
        SessionCorruptedError: the file is not a SQLite database or is damaged.
        StorageError: any other failure (I/O, a full disk, a file it cannot open).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 10.0, cipher: Cipher | None = None
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a path, got {type(path).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ValueError(f"timeout must be a number >= 0, got {timeout!r}")
        self.path = Path(path).absolute()
        self.timeout = float(timeout)
        self.cipher = check_cipher(cipher)
        self._slot = ConnectionSlot()  # this process's connection and its lock
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteStorage({str(self.path)!r})"

    # -------------------------------------------------------------- plumbing

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(f"SQLiteStorage {str(self.path)!r} is closed")
        if self._slot.conn is not None:
            return self._slot.conn
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
                with transaction(conn):
                    # Read again under the write lock: another process may have
                    # upgraded the file meanwhile.
                    version = conn.execute("PRAGMA user_version").fetchone()[0]
                    if version == 0:
                        conn.execute(
                            "CREATE TABLE IF NOT EXISTS perdure_blobs ("
                            "key TEXT PRIMARY KEY NOT NULL, data BLOB NOT NULL, "
                            "version TEXT NOT NULL)"
                        )
                    elif version == 1:  # blobs without versions: give each one
                        conn.execute("ALTER TABLE perdure_blobs ADD COLUMN version TEXT")
                        conn.execute(
                            "UPDATE perdure_blobs SET version = lower(hex(randomblob(16)))"
                        )
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            columns = sorted(row[1] for row in conn.execute("PRAGMA table_info(perdure_blobs)"))
            if columns != ["data", "key", "version"]:
                raise self._damaged("its perdure_blobs table is missing or not ours")
        except BaseException:
            conn.close()
            raise
        self._slot.conn = conn
        return conn

    def _damaged(self, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"SQLite storage {str(self.path)!r}: the database is damaged: {detail}",
            details={"file": str(self.path), "fault": "damage", "kind": "bad_database"},
        )

    def _translated(self, exc: sqlite3.Error | UnicodeDecodeError | OSError) -> Exception:
        return translate(exc, _ERRORS, what="SQLite storage", path=self.path, timeout=self.timeout)

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._slot.lock:
            try:
                return work(self._connect())
            except (*DRIVER_ERRORS, OSError) as exc:
                raise self._translated(exc) from exc

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._run, work)

    def close(self) -> None:
        """Close the connection; later calls raise ``StorageError``. Idempotent."""
        with self._slot.lock:
            self._closed = True
            if self._slot.conn is not None:
                conn, self._slot.conn = self._slot.conn, None
                try:
                    conn.close()
                except sqlite3.Error as exc:
                    raise self._translated(exc) from exc

    # ------------------------------------------------------------------ API

    async def write(self, key: str, data: bytes) -> None:
        """Atomically replace the blob under ``key``; committed when this returns."""
        validate_key(key)
        blob = seal_blob(self.cipher, data)

        def work(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute(
                    "INSERT INTO perdure_blobs (key, data, version) VALUES (?, ?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET data = excluded.data, "
                    "version = excluded.version",
                    (key, blob, secrets.token_hex(16)),
                )

        await self._call(work)

    async def version(self, key: str) -> str | None:
        """The version of the blob under ``key``, or ``None`` when there is none."""
        validate_key(key)

        def work(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT version FROM perdure_blobs WHERE key = ?", (key,)).fetchone()
            if row is not None and not isinstance(row[0], str):
                raise self._damaged(f"the version of key {key!r} is not text")
            return None if row is None else row[0]

        return await self._call(work)

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version is ``expected``
        (``None``: only if there is none); return the new version.

        The comparison and the write are one ``BEGIN IMMEDIATE`` transaction.

        Raises:
            StorageConflictError: the version is not ``expected``; nothing was written.
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes, ``expected`` neither a str nor None.
        """
        validate_key(key)
        blob = seal_blob(self.cipher, data)
        check_expected(expected)
        made = secrets.token_hex(16)

        def work(conn: sqlite3.Connection) -> str | None:
            with transaction(conn):
                row = conn.execute(
                    "SELECT version FROM perdure_blobs WHERE key = ?", (key,)
                ).fetchone()
                found = None if row is None else row[0]
                if found != expected:
                    return str(found) if found is not None else None
                conn.execute(
                    "INSERT INTO perdure_blobs (key, data, version) VALUES (?, ?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET data = excluded.data, "
                    "version = excluded.version",
                    (key, blob, made),
                )
                return made

        found = await self._call(work)
        if found != made:
            raise version_conflict(f"SQLite storage {str(self.path)!r}", key, expected, found)
        return made

    async def read(self, key: str) -> bytes | None:
        """Return the blob under ``key``, or ``None``."""
        validate_key(key)

        def work(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT data FROM perdure_blobs WHERE key = ?", (key,)).fetchone()
            if row is not None and not isinstance(row[0], bytes):
                raise self._damaged(f"the value of key {key!r} is not a blob")
            return None if row is None else row[0]

        return open_blob(self.cipher, await self._call(work))

    async def delete(self, key: str) -> None:
        """Remove ``key`` (idempotent); committed when this returns."""
        validate_key(key)

        def work(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute("DELETE FROM perdure_blobs WHERE key = ?", (key,))

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
        upper = prefix_upper_bound(prefix)
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
