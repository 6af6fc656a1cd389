"""One SQLite connection used from worker threads, with driver errors translated.

Blocking SQLite work runs in ``asyncio.to_thread`` so it never blocks an event
loop; a thread lock (not an asyncio primitive, which would bind to one loop)
serialises use of the connection, so the owning object may be awaited from any
event loop and any thread.

Driver errors go through perdure's one translation
(:func:`perdure._runtime.sqlite.translate`): a database another connection keeps
locked raises :class:`~perdure.errors.MemoryStoreLockedError` (never damage); a
damaged file, or any other failure (I/O, a full disk, a file it cannot open), raises
:class:`~perdure.errors.MemoryStoreError`, told apart by ``details["fault"]``
(``damage`` or ``failure``); a statement SQLite refuses is a bug in perdure
(:class:`~perdure._runtime.sqlite.SQLiteBugError`), never reported as damage.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from perdure._runtime.sqlite import (
    DRIVER_ERRORS,
    ConnectionSlot,
    SQLiteErrors,
    translate,
    write_transaction,
)
from perdure.memory.errors import MemoryStoreError, MemoryStoreLockedError

__all__ = ["BUSY_TIMEOUT_MS", "SQLiteConnection", "stored_json", "write_transaction"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000

_ERRORS = SQLiteErrors(
    busy=MemoryStoreLockedError, damage=MemoryStoreError, failure=MemoryStoreError
)
"""This layer's error for each fault of a driver error."""


class SQLiteConnection:
    """A lazily opened SQLite connection in WAL mode, shared by worker threads.

    Args:
        path: the database file (its directory is created), or ``":memory:"``.
        schema: SQL run once when the connection opens.
        what: how error messages name the owner (``"memory store"``); they also
            name the file.
        synchronous: the ``PRAGMA synchronous`` level; ``FULL`` makes every commit
            durable across a power cut, not only a process crash.
    """

    def __init__(self, path: Path | str, schema: str, what: str, *, synchronous: str = "FULL"):
        self.path = path
        self._schema = schema
        self._what = what
        self._synchronous = synchronous
        # This process's connection and its lock; a child made by fork() opens its
        # own, except of an in-memory database, which exists only in the connection.
        self._slot = ConnectionSlot(carry=str(path) == ":memory:")
        self._closed = False

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise MemoryStoreError(f"{self._what} {str(self.path)!r} is closed")
        if self._slot.conn is None:
            if str(self.path) != ":memory:":
                try:
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise self._translated(exc, "opening", None) from exc
            conn = sqlite3.connect(
                str(self.path),
                timeout=BUSY_TIMEOUT_MS / 1000,
                check_same_thread=False,
                isolation_level=None,  # explicit BEGIN IMMEDIATE / COMMIT
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                if str(self.path) != ":memory:":
                    conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                # Deleted memories and acknowledged messages may hold personal data:
                # overwrite their pages instead of leaving them in the free list.
                conn.execute("PRAGMA secure_delete = ON")
                conn.executescript(self._schema)
            except DRIVER_ERRORS as exc:
                error = self._translated(exc, "opening", conn)
                conn.close()
                raise error from exc
            except BaseException:
                conn.close()
                raise
            self._slot.conn = conn
        return self._slot.conn

    def has_table(self, table: str) -> bool:
        """Whether the database holds ``table``; creates nothing (no file, no schema).

        A path that is no file holds none. A file that is no SQLite database raises
        this layer's error (damage is reported, never taken for absence).
        """
        if str(self.path) == ":memory:":
            return self.run_sync(lambda conn: _holds(conn, table), "looking for the tables")
        if not Path(self.path).is_file():
            return False
        conn = None
        try:
            # An existing file only: connecting writes nothing until asked to.
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000)
            conn.execute("PRAGMA query_only = ON")
            return _holds(conn, table)
        except DRIVER_ERRORS as exc:
            raise self._translated(exc, "looking for the tables", conn) from exc
        finally:
            if conn is not None:
                conn.close()

    def run_sync(self, work: Callable[[sqlite3.Connection], T], doing: str) -> T:
        """Run ``work(connection)`` under the lock; sqlite3 errors become MemoryStoreError."""
        with self._slot.lock:
            try:
                return work(self._open())
            except DRIVER_ERRORS as exc:
                raise self._translated(exc, doing, self._slot.conn) from exc

    def _translated(
        self,
        exc: sqlite3.Error | UnicodeDecodeError | OSError,
        doing: str,
        conn: sqlite3.Connection | None,
    ) -> Exception:
        """The memory store's error for a driver error (see the module docstring)."""
        return translate(
            exc,
            _ERRORS,
            what=self._what,
            path=self.path,
            doing=doing,
            timeout=BUSY_TIMEOUT_MS / 1000,
            conn=conn,
            schema=self._schema,
        )

    async def run(self, work: Callable[[sqlite3.Connection], T], doing: str) -> T:
        """:meth:`run_sync` in a worker thread of the calling event loop."""
        return await asyncio.to_thread(self.run_sync, work, doing)

    def close(self) -> None:
        """Close the connection; later use raises MemoryStoreError. Idempotent."""
        with self._slot.lock:
            self._closed = True
            if self._slot.conn is not None:
                try:
                    self._slot.conn.close()
                finally:
                    self._slot.conn = None


def stored_json(text: Any, what: str) -> Any:
    """Parse JSON text read from the database; damaged text is a ``MemoryStoreError``."""
    try:
        if not isinstance(text, str):
            raise TypeError(f"expected text, got {type(text).__name__}")
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise MemoryStoreError(
            f"{what} is damaged: {type(exc).__name__}", details={"fault": "damage"}
        ) from None


def _holds(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return row is not None
