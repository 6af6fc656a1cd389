"""The one translation of ``sqlite3`` errors, for every SQLite user in perdure.

It sits with :mod:`perdure.errors` (SPEC §1, layer 1): the session store, the blob
storage and the memory store all call :func:`sqlite_fault` to sort a driver error,
and build their own structured error from the answer. The four faults:

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
- ``failure``: anything else — I/O, permissions, a full disk, out of memory.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

__all__ = ["SQLiteBugError", "SQLiteFault", "sqlite_fault", "sqlite_fault_text"]

SQLiteFault = Literal["busy", "damage", "bug", "failure"]

# SQLite primary result codes (https://sqlite.org/rescode.html).
_BUSY = frozenset({5, 6})  # BUSY, LOCKED
_DAMAGE = frozenset({11, 20, 24, 26})  # CORRUPT, MISMATCH, FORMAT, NOTADB
_BUG = frozenset({1, 19, 21, 25})  # ERROR, CONSTRAINT, MISUSE, RANGE
# What the driver says when a TEXT value is not UTF-8 (it carries no result code).
_UNDECODABLE = "Could not decode to UTF-8"


class SQLiteBugError(RuntimeError):
    """SQLite refused one of perdure's own statements: a bug in perdure, not damage."""


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def sqlite_fault(exc: sqlite3.Error) -> SQLiteFault:
    """Which of the four faults (see the module docstring) ``exc`` is."""
    if str(exc).startswith(_UNDECODABLE):
        return "damage"
    primary = _primary_code(exc)
    if primary in _BUSY:
        return "busy"
    if primary in _DAMAGE:
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


def sqlite_fault_text(exc: sqlite3.Error) -> str:
    """The driver's message with its result-code name, never stored content.

    (The driver's message for undecodable text quotes the text itself.)
    """
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    if str(exc).startswith(_UNDECODABLE):
        column = str(exc).split("'")[1] if str(exc).count("'") >= 2 else "?"
        return f"{name}: a stored text value (column {column!r}) is not valid UTF-8"
    return f"{name}: {exc}"
