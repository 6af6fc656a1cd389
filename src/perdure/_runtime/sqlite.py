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

__all__ = [
    "DRIVER_ERRORS",
    "SQLiteBugError",
    "SQLiteFault",
    "schema_difference",
    "sqlite_fault",
    "sqlite_fault_text",
]

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
