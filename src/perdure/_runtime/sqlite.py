"""The one translation of ``sqlite3`` errors, for every SQLite user in perdure.

It sits in layer 0 (SPEC §1) and knows no perdure error: the session store, the blob
storage and the memory store each sort a driver error with :func:`sqlite_fault` —
through :func:`translate` — and get back their own public error for its fault. The
four faults:

- ``busy``: another connection held the database past the busy timeout
  (``SQLITE_BUSY``, ``SQLITE_LOCKED``) — the caller's "locked" error.
- ``damage``: the file is not what SQLite wrote (``SQLITE_CORRUPT``,
  ``SQLITE_NOTADB``, ``SQLITE_FORMAT``, ``SQLITE_MISMATCH`` from a damaged record, or
  stored text that is not UTF-8) — the caller's "corrupted" error.
- ``bug``: SQLite refused perdure's own statement (``SQLITE_ERROR``: a syntax error,
  no such table or column; ``SQLITE_CONSTRAINT``; ``SQLITE_RANGE``; misuse). Callers
  check their schema when they connect, so these are perdure's bugs, not damage:
  they are raised as :class:`SQLiteBugError` (a ``RuntimeError``), never reported
  as damaged data.
- ``failure``: the environment failed — I/O (``SQLITE_IOERR``), a full disk
  (``SQLITE_FULL``), a file that cannot be opened or written (``SQLITE_CANTOPEN``,
  ``SQLITE_READONLY``, ``SQLITE_PERM``), out of memory — or anything else SQLite
  says: the caller's general error, never "damaged" nor "locked".

A layer does not sort errors itself: it names its public error for each fault once
(:class:`SQLiteErrors`) and calls :func:`translate` where the driver is met::

    ERRORS = SQLiteErrors(busy=StorageLockedError, damage=SessionCorruptedError,
                          failure=StorageError)
    except DRIVER_ERRORS as exc:
        raise translate(exc, ERRORS, what="SQLite storage", path=path) from exc

Every message names the file; ``details`` carry ``file``, ``fault`` and
``sqlite_error``. :func:`write_transaction` and :func:`rollback` are the one
``BEGIN IMMEDIATE`` … ``COMMIT`` / ``ROLLBACK`` of every SQLite user.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from perdure._runtime.threads import PerProcess, ProcessLock

__all__ = [
    "DRIVER_ERRORS",
    "ErrorFactory",
    "SQLiteBugError",
    "SQLiteErrors",
    "SQLiteFault",
    "rollback",
    "schema_difference",
    "sqlite_fault",
    "sqlite_fault_text",
    "transaction",
    "translate",
    "write_transaction",
]

T = TypeVar("T")

DRIVER_ERRORS = (sqlite3.Error, UnicodeDecodeError)
"""What a ``sqlite3`` call raises: a driver error, or ``UnicodeDecodeError`` when the
message SQLite gives is not UTF-8 (it quotes a damaged schema) — catch both."""

SQLiteFault = Literal["busy", "damage", "bug", "failure"]

# SQLite primary result codes (https://sqlite.org/rescode.html).
_BUSY = frozenset({5, 6})  # BUSY, LOCKED
_DAMAGE = frozenset({11, 20, 24, 26})  # CORRUPT, MISMATCH, FORMAT, NOTADB
_BUG = frozenset({1, 19, 21, 25})  # ERROR, CONSTRAINT, MISUSE, RANGE
# SQLITE_ERROR that reports damage: FTS5 finds its own tables damaged this way.
_DAMAGE_WORDS = ("invalid fts5 file format", "malformed", "corrupt")
# What the driver says when a TEXT value is not UTF-8 (it carries no result code).
_UNDECODABLE = "Could not decode to UTF-8"


class SQLiteBugError(RuntimeError):
    """SQLite refused one of perdure's own statements: a bug in perdure, not damage."""


def _primary_code(exc: sqlite3.Error | UnicodeDecodeError) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def sqlite_fault(exc: sqlite3.Error | UnicodeDecodeError) -> SQLiteFault:
    """Which of the four faults (see the module docstring) ``exc`` is."""
    if isinstance(exc, UnicodeDecodeError) or str(exc).startswith(_UNDECODABLE):
        return "damage"
    primary = _primary_code(exc)
    if primary in _BUSY:
        return "busy"
    if primary in _DAMAGE:
        return "damage"
    if primary == 1 and any(words in str(exc).lower() for words in _DAMAGE_WORDS):
        return "damage"
    if primary in _BUG or isinstance(exc, sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return "bug"
    if primary is None and isinstance(exc, sqlite3.DatabaseError):
        # Without a result code, go by the words SQLite uses for these faults.
        lowered = str(exc).lower()
        if "locked" in lowered or "busy" in lowered:
            return "busy"
        if "malformed" in lowered or "not a database" in lowered or "corrupt" in lowered:
            return "damage"
    return "failure"


def sqlite_fault_text(exc: sqlite3.Error | UnicodeDecodeError) -> str:
    """The driver's message with its result-code name, never stored content.

    (The driver's message for undecodable text quotes the text itself.)
    """
    if isinstance(exc, UnicodeDecodeError):
        return "SQLite's error message is not UTF-8 (it quotes a damaged schema)"
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    if str(exc).startswith(_UNDECODABLE):
        column = str(exc).split("'")[1] if str(exc).count("'") >= 2 else "?"
        return f"{name}: a stored text value (column {column!r}) is not valid UTF-8"
    return f"{name}: {exc}"


def schema_difference(conn: sqlite3.Connection, script: str) -> str | None:
    """How ``conn``'s schema differs from what ``script`` creates; None when it does not.

    Used when SQLite refuses a statement: a schema that differs (a damaged
    definition SQLite still parses, a table gone) makes it damage, not a bug. The
    definitions ``script`` creates in a new database are compared with those stored
    in ``conn``'s, as SQLite keeps them (the text of each ``CREATE``).
    """
    fresh = sqlite3.connect(":memory:")
    try:
        fresh.executescript(script)
        expected = fresh.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    finally:
        fresh.close()
    try:
        stored = {
            (kind, name): sql
            for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master")
        }
    except DRIVER_ERRORS as exc:
        return f"the schema cannot be read ({sqlite_fault_text(exc)})"
    for kind, name, sql in expected:
        if (kind, name) not in stored:
            return f"{kind} {name} is missing from the schema"
        if stored[kind, name] != sql:
            return f"the definition of {kind} {name} differs from perdure's"
    return None


class ErrorFactory(Protocol):
    """Builds a layer's public error: every :class:`~perdure.errors.PerdureError` is one."""

    def __call__(self, message: str, *, details: dict[str, Any] | None = ...) -> Exception:
        """Return the error to raise (its ``__cause__`` is set by the caller)."""
        ...


class SQLiteErrors(NamedTuple):
    """The public error one layer raises for each fault (``bug`` is always
    :class:`SQLiteBugError`)."""

    busy: ErrorFactory
    """Another connection held the database past the busy timeout."""
    damage: ErrorFactory
    """The file is not what SQLite wrote."""
    failure: ErrorFactory
    """The environment failed (I/O, full disk, cannot open, read-only) or anything else."""


def translate(
    exc: sqlite3.Error | UnicodeDecodeError | OSError,
    errors: SQLiteErrors,
    *,
    what: str,
    path: str | os.PathLike[str],
    doing: str | None = None,
    timeout: float | None = None,
    conn: sqlite3.Connection | None = None,
    schema: str | None = None,
) -> Exception:
    """The error a layer raises for a driver error: the one translation of perdure.

    Args:
        exc: What ``sqlite3`` raised (an ``OSError`` from preparing the database's
            directory counts as a ``failure``).
        errors: The layer's error for each fault.
        what: How the message names the owner (``"SQLite storage"``, say).
        path: The database file; every message names it.
        doing: What was being done (``"adding a memory"``), for the message.
        timeout: The busy timeout in seconds, said in a ``busy`` message.
        conn: With ``schema``: when SQLite refuses a statement, a stored schema that
            differs from ``schema`` makes the error damage (see
            :func:`schema_difference`), not a bug.
        schema: The script that creates the layer's tables.

    Returns:
        The error to raise ``from exc``: a ``busy`` error never says damage, and only
        a ``damage`` fault is reported as damage.
    """
    file = os.fspath(path)
    if isinstance(exc, OSError):
        fault: SQLiteFault = "failure"
        name = type(exc).__name__
        text = f"{name}: {exc.strerror or exc}"
    else:
        fault = sqlite_fault(exc)
        name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        text = sqlite_fault_text(exc)
    if fault == "bug" and conn is not None and schema is not None:
        # Refused by SQLite: perdure's bug, unless the stored schema is damaged.
        try:
            differs = schema_difference(conn, schema)
        except DRIVER_ERRORS:
            differs = "the schema cannot be read"
        if differs is not None:
            fault, text = "damage", f"{text} ({differs})"
    head = f"{what} {file!r}" + (f": {doing}" if doing else "")
    if fault == "bug":
        return SQLiteBugError(f"{head}: perdure's SQL failed: {text}")
    details: dict[str, Any] = {"file": file, "fault": fault, "sqlite_error": name}
    if fault == "busy":
        waited = "" if timeout is None else f" for more than {timeout:g} s"
        return errors.busy(
            f"{head}: the database stayed locked by another connection{waited} ({text})",
            details=details,
        )
    if fault == "damage":
        return errors.damage(
            f"{head}: the database is damaged: {text}", details={**details, "kind": "bad_database"}
        )
    return errors.failure(f"{head} failed: {text}", details=details)


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is open, quietly: the error that stopped the work is the one
    to report (SQLite rolls back by itself on some errors, a damaged page say)."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, begin: str | None = "BEGIN IMMEDIATE") -> Iterator[None]:
    """``begin`` … ``COMMIT``; anything raised inside (or by the commit) rolls back.

    ``BEGIN IMMEDIATE`` takes the write lock first, so the transaction never fails
    half-way on a lock another writer took after it began. ``begin=None``: the
    caller began the transaction itself (retrying a busy ``BEGIN``, say).
    """
    if begin is not None:
        conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def write_transaction(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
    """Run ``work`` inside :func:`transaction` and return what it returns."""
    with transaction(conn):
        return work()


class ConnectionSlot:
    """One SQLite connection, used by one thread at a time, in the process that opened it.

    ``lock`` serialises use of ``conn`` (a thread lock, not an asyncio one, so any
    loop and thread may use it). A child made by fork() starts with no connection
    and a free lock: SQLite must not use the parent's connection there, and closing
    it could disturb the parent's locks, so the child leaves it alone (kept alive,
    untouched) and opens its own. With ``carry=True`` (an in-memory database, which
    exists only in its connection) the child goes on with its copy instead.
    """

    __slots__ = ("_conn", "lock")

    def __init__(self, *, carry: bool = False) -> None:
        self.lock = ProcessLock()
        self._conn: PerProcess[sqlite3.Connection | None] = PerProcess(
            lambda: None, carry=(lambda conn: conn) if carry else None
        )

    @property
    def conn(self) -> sqlite3.Connection | None:
        """This process's connection (None until it opens one)."""
        return self._conn.value

    @conn.setter
    def conn(self, conn: sqlite3.Connection | None) -> None:
        self._conn.value = conn
