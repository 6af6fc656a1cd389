"""What every ``perdure migrate`` source shares: statuses, counts, a read-only SQLite.

Each migration (:mod:`~perdure.migrate.strands`, :mod:`~perdure.migrate.openai_agents`,
:mod:`~perdure.migrate.langgraph`) reports one entry per conversation it found, with a
:data:`MigrationStatus`; :func:`status_counts` is the ``counts`` of their JSON
reports. SQLite sources are opened by :func:`open_readonly_sqlite`, so a migration
never writes to what it reads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, Protocol

__all__ = [
    "STATUSES",
    "MigrationStatus",
    "count_status",
    "open_readonly_sqlite",
    "sqlite_tables",
    "status_counts",
]

MigrationStatus = Literal["imported", "would_import", "skipped", "failed"]
"""``imported``; ``would_import`` (a dry run); ``skipped`` (exists, or nothing to
import); ``failed`` (could not be written, or read back different)."""

STATUSES: tuple[MigrationStatus, ...] = ("imported", "would_import", "skipped", "failed")


class _HasStatus(Protocol):
    @property
    def status(self) -> MigrationStatus: ...


def count_status(entries: Iterable[_HasStatus], status: MigrationStatus) -> int:
    """How many ``entries`` ended with ``status``."""
    return sum(1 for entry in entries if entry.status == status)


def status_counts(entries: Iterable[_HasStatus]) -> dict[str, int]:
    """The number of ``entries`` of each status, every status present."""
    found = list(entries)
    return {status: count_status(found, status) for status in STATUSES}


def open_readonly_sqlite(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file ``path`` (blocking).

    Raises:
        ValueError: ``path`` is not a file or SQLite cannot open it (the message names it).
    """
    if not path.is_file():
        raise ValueError(f"source {str(path)!r} is not a file")
    try:
        return sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise ValueError(f"source {str(path)!r} cannot be opened: {exc}") from None


def sqlite_tables(conn: sqlite3.Connection, path: Path) -> set[str]:
    """The tables of a database (blocking).

    Raises:
        ValueError: it is not a readable SQLite database (the message names ``path``).
    """
    try:
        return {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"source {str(path)!r} cannot be read: {exc}") from None
