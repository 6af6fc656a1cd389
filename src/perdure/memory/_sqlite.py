"""One SQLite connection used from worker threads, with driver errors translated.

Blocking SQLite work runs in ``asyncio.to_thread`` so it never blocks an event
loop; a ``threading.Lock`` (not an asyncio primitive, which would bind to one loop)
serialises use of the connection, so the owning object may be awaited from any
event loop and any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from perdure._runtime.sqlite import (
    DRIVER_ERRORS,
    SQLiteBugError,
    schema_difference,
    sqlite_fault,
    sqlite_fault_text,
)
from perdure._runtime.threads import PerProcess, ProcessLock
from perdure.memory.errors import MemoryStoreError

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000


class SQLiteConnection:
    """A lazily opened SQLite connection in WAL mode, shared by worker threads.

    Args:
        path: the database file (its directory is created), or ``":memory:"``.
        schema: SQL run once when the connection opens.
        what: how error messages name the owner ("memory store …").
        synchronous: the ``PRAGMA synchronous`` level; ``FULL`` makes every commit
            durable across a power cut, not only a process crash.
    """

    def __init__(self, path: Path | str, schema: str, what: str, *, synchronous: str = "FULL"):
        self.path = path
        self._schema = schema
        self._what = what
        self._synchronous = synchronous
        self._lock = ProcessLock()
        # This process's connection: a child made by fork() opens its own file
        # connection, leaving the parent's alone (SQLite forbids using it there;
        # closing it could disturb the parent's locks). An in-memory database exists
        # only in the connection, so a child goes on with its copy of it.
        self._conns: PerProcess[sqlite3.Connection | None] = PerProcess(
            lambda: None, carry=(lambda conn: conn) if str(path) == ":memory:" else None
        )
        self._closed = False

    @property
    def _conn(self) -> sqlite3.Connection | None:
        return self._conns.value

    @_conn.setter
    def _conn(self, conn: sqlite3.Connection | None) -> None:
        self._conns.value = conn

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise MemoryStoreError(f"{self._what} is closed")
        if self._conn is None:
            if str(self.path) != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
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
            self._conn = conn
        return self._conn

    def run_sync(self, work: Callable[[sqlite3.Connection], T], doing: str) -> T:
        """Run ``work(connection)`` under the lock; sqlite3 errors become MemoryStoreError."""
        with self._lock:
            try:
                return work(self._open())
            except DRIVER_ERRORS as exc:
                raise self._translated(exc, doing, self._conn) from exc

    def _translated(
        self,
        exc: sqlite3.Error | UnicodeDecodeError,
        doing: str,
        conn: sqlite3.Connection | None,
    ) -> Exception:
        """The memory store's error for a driver error, sorted by :func:`sqlite_fault`.

        A database locked past the busy timeout, a damaged file and any other
        failure are :class:`MemoryStoreError`, told apart by ``details["fault"]``
        (``busy``, ``damage``, ``failure``); a statement SQLite refuses is a bug in
        perdure (:class:`SQLiteBugError`), never reported as damage.
        """
        fault = sqlite_fault(exc)
        text = sqlite_fault_text(exc)
        if fault == "bug" and conn is not None:
            # Refused by SQLite: perdure's bug, unless the stored schema is damaged.
            try:
                differs = schema_difference(conn, self._schema)
            except DRIVER_ERRORS:
                differs = "the schema cannot be read"
            if differs is not None:
                fault, text = "damage", f"{text} ({differs})"
        if fault == "bug":
            return SQLiteBugError(f"{self._what}: {doing}: perdure's SQL failed: {text}")
        what = {"busy": "the database stayed locked", "damage": "the database is damaged"}
        reason = f" ({what[fault]})" if fault in what else ""
        return MemoryStoreError(
            f"{self._what}: {doing} failed{reason}: {text}",
            details={"fault": fault, "file": str(self.path)},
        )

    async def run(self, work: Callable[[sqlite3.Connection], T], doing: str) -> T:
        """:meth:`run_sync` in a worker thread of the calling event loop."""
        return await asyncio.to_thread(self.run_sync, work, doing)

    def close(self) -> None:
        """Close the connection; later use raises MemoryStoreError. Idempotent."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None


def write_transaction(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
    """Run ``work`` inside ``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back if it raises)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work()
    except BaseException:
        # SQLite may have rolled back already (it does on some errors, a damaged
        # page say): the error that stopped the work is the one to report.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


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
