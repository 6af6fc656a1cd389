"""OpenAI Agents SDK items in perdure stores, and migration from the SDK's ``SQLiteSession``.

The SDK's sessions hold *items*: the Responses API's input items (messages with a
``role``, ``function_call``, ``function_call_output``, ``reasoning``, computer and
file-search calls, …), JSON objects. perdure's stores hold Converse-style messages
(SPEC §2), so an item is stored **whole inside one message**, in a ``json`` block::

    {"role": "assistant", "content": [{"json": {"openai_agents_item": <item>}}]}

The mapping is reversible by construction: reading takes the item back out of the
block, equal to the one stored (a JSON round trip of it, as the SDK's own
``SQLiteSession`` gives back). The message's role says who produced the item, so that
perdure's tools (``perdure sessions show``, the history pages) read naturally:
``"assistant"`` for an item with ``role: assistant`` and for the model's own output
items without a role (``function_call``, ``reasoning``, …); ``"user"`` for every other
role (``user``, ``system``, ``developer``) and for the outputs sent back to the model
(a ``type`` ending in ``_output``). A message of any other shape was not written by
this mapping (a perdure ``Agent`` session, say): reading it raises
:class:`~perdure.errors.SessionMismatchError`, never a guess.

:func:`migrate_openai_agents` copies every session of a ``SQLiteSession`` database
(``agent_sessions`` and ``agent_messages`` tables, or the names given) into a perdure
store in that shape, in the order of the rows' ``id`` (the order ``SQLiteSession``
returns them), then reads each session back from the store and checks that every
item is equal to its source row and that ``verify_store`` finds no damage in it.
Each session keeps its creation time (the SDK's ``created_at``, UTC).
A row that is not a JSON object (``SQLiteSession`` skips such rows when it reads) is
not imported and is listed in the report with its id and the reason — nothing is
dropped silently. The database is opened read-only.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from perdure.errors import (
    PerdureError,
    SessionCorruptedError,
    SessionMismatchError,
    SessionNotFoundError,
)
from perdure.maintenance import verify_store
from perdure.migrate.report import (
    MigrationStatus,
    count_status,
    open_readonly_sqlite,
    sqlite_tables,
    status_counts,
)
from perdure.session.ids import validate_session_id
from perdure.session.rules import PastOffset, creation_time
from perdure.session.store import SessionStore
from perdure.types import Message

__all__ = [
    "ITEM_KEY",
    "PEEK_OFFSET",
    "ItemsAfter",
    "OpenAIAgentsMigration",
    "OpenAIAgentsMigrationReport",
    "SkippedRow",
    "item_to_message",
    "message_to_item",
    "migrate_openai_agents",
    "normalize_item",
]

ITEM_KEY = "openai_agents_item"
"""The key, inside a message's ``json`` block, that holds an OpenAI Agents item."""

PEEK_OFFSET = 2**31 - 1
"""An offset past the end of any real history: ``store.get(id, offset=PEEK_OFFSET)``
reads a session's metadata and tail without its messages (a 32-bit signed int, which
every backend's index column takes)."""


def normalize_item(item: Any, where: str) -> dict[str, Any]:
    """``item`` as the SDK's ``SQLiteSession`` would give it back: a JSON round trip.

    Tuples become lists and non-string keys strings, exactly as ``json.dumps`` then
    ``json.loads`` make them; the copy also keeps the caller's later changes to its
    dict out of what is stored.

    Raises:
        TypeError: ``item`` is not a dict, or holds a value JSON cannot encode
            (``bytes``, an object); the message starts with ``where``.
    """
    if not isinstance(item, dict):
        raise TypeError(f"{where} must be a dict (an input item), got {type(item).__name__}")
    try:
        text = json.dumps(item)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where} cannot be stored as JSON: {exc}") from None
    copied: dict[str, Any] = json.loads(text)
    return copied


def _role(item: dict[str, Any]) -> Literal["user", "assistant"]:
    role = item.get("role")
    if role is not None:
        return "assistant" if role == "assistant" else "user"
    kind = item.get("type")
    if isinstance(kind, str) and kind.endswith("_output"):
        return "user"
    return "assistant"


def item_to_message(item: dict[str, Any]) -> Message:
    """The perdure message that stores ``item`` (see the module docstring)."""
    return {"role": _role(item), "content": [{"json": {ITEM_KEY: item}}]}


def message_to_item(message: Message, session_id: str, index: int) -> dict[str, Any]:
    """The item a message made by :func:`item_to_message` holds.

    Raises:
        SessionMismatchError: the message is not of that shape (``details`` has the
            ``index`` of the message in the history).
    """
    content = message.get("content")
    if isinstance(content, list) and len(content) == 1:
        block = content[0]
        if isinstance(block, dict) and len(block) == 1:
            payload = block.get("json")
            if isinstance(payload, dict) and len(payload) == 1:
                item = payload.get(ITEM_KEY)
                if isinstance(item, dict):
                    return item
    raise SessionMismatchError(
        f"message {index} of session {session_id!r} is not an OpenAI Agents item: the "
        "session was written by something else than PerdureSession (a perdure Agent?)",
        details={"session_id": session_id, "index": index, "reason": "not_openai_agents_item"},
    )


ItemsAfter = PastOffset
"""The history a ``PerdureSession`` commit hands its store: stored items, then new ones."""


# --------------------------------------------------------------------------- migration


@dataclass(frozen=True)
class SkippedRow:
    """A row of the source database that was not imported, and why."""

    session_id: str
    row_id: int
    reason: str


@dataclass
class OpenAIAgentsMigration:
    """What the migration did (or would do) with one ``SQLiteSession`` session.

    Attributes:
        session_id: The session id (the same in the source and in perdure).
        status: ``imported``; ``would_import`` (dry run); ``skipped`` (``reason``);
            ``failed`` (``reason``).
        reason: Why it was skipped or failed.
        items_read: Rows read for it.
        items_imported: Items written (and read back equal).
        verified: The store was read back and verified after the copy.
        skipped_rows: Its rows that were not imported, with reasons.
        notes: Other things worth knowing.
    """

    session_id: str
    status: MigrationStatus = "imported"
    reason: str | None = None
    items_read: int = 0
    items_imported: int = 0
    verified: bool = False
    skipped_rows: list[SkippedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class OpenAIAgentsMigrationReport:
    """What :func:`migrate_openai_agents` did, session by session."""

    source: str
    dry_run: bool
    sessions: list[OpenAIAgentsMigration] = field(default_factory=list)

    def count(self, status: MigrationStatus) -> int:
        """How many sessions ended with ``status``."""
        return count_status(self.sessions, status)

    @property
    def skipped_rows(self) -> list[SkippedRow]:
        """Every row not imported, of every session."""
        return [row for entry in self.sessions for row in entry.skipped_rows]

    @property
    def ok(self) -> bool:
        """No session failed and every row was imported (skipped sessions are fine)."""
        return self.count("failed") == 0 and not self.skipped_rows

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary plus every session."""
        return {
            "source": self.source,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "counts": status_counts(self.sessions),
            "sessions": [asdict(entry) for entry in self.sessions],
        }


def _check_table_name(name: Any, argument: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{argument} must be a plain SQL table name, got {name!r}")
    return name


def _read_database(
    path: Path, sessions_table: str, messages_table: str
) -> list[tuple[str, list[tuple[int, str]], Any]]:
    """Every session id, its rows ``(id, message_data)`` in id order, and its
    ``created_at`` from the sessions table (``None`` when there is none) (blocking).

    Raises:
        ValueError: not a ``SQLiteSession`` database (the message says why).
    """
    conn = open_readonly_sqlite(path)
    try:
        tables = sqlite_tables(conn, path)
        if messages_table not in tables:
            raise ValueError(
                f"source {str(path)!r} has no table {messages_table!r}: not a SQLiteSession "
                f"database (tables: {', '.join(sorted(tables)) or 'none'})"
            )
        ids: set[str] = {
            row[0]
            for row in conn.execute(f"SELECT DISTINCT session_id FROM {messages_table}")
            if isinstance(row[0], str)
        }
        created: dict[str, Any] = {}
        if sessions_table in tables:
            try:
                listed = conn.execute(f"SELECT session_id, created_at FROM {sessions_table}")
            except sqlite3.OperationalError:  # a table of the SDK's without created_at
                listed = conn.execute(f"SELECT session_id, NULL FROM {sessions_table}")
            for session_id, stamp in listed:
                if isinstance(session_id, str):
                    ids.add(session_id)
                    created[session_id] = stamp
        found = []
        for session_id in sorted(ids):
            rows = conn.execute(
                f"SELECT id, message_data FROM {messages_table} WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall()
            found.append((session_id, rows, created.get(session_id)))
        return found
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"source {str(path)!r} cannot be read: {exc}") from None
    finally:
        conn.close()


def _created_at(entry: OpenAIAgentsMigration, stamp: Any) -> str | None:
    """The session's creation time from the SDK's ``created_at`` (``None``: unknown).

    The SDK stamps it with SQLite's ``CURRENT_TIMESTAMP``, UTC text without an
    offset (``2025-01-02 03:04:05``), read as UTC. A value that is no time is noted
    and the session is created at the migration time.
    """
    if stamp is None:
        return None
    try:
        if not isinstance(stamp, str):
            raise ValueError("not text")
        moment = _dt.datetime.fromisoformat(stamp)
        if moment.utcoffset() is None:
            moment = moment.replace(tzinfo=_dt.UTC)  # CURRENT_TIMESTAMP is UTC
        return creation_time(moment)
    except ValueError:
        entry.notes.append(
            f"created_at {stamp!r} is no time: the session is created at the migration time"
        )
        return None


def _items(entry: OpenAIAgentsMigration, rows: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for row_id, data in rows:
        try:
            item = json.loads(data)
        except (TypeError, ValueError) as exc:
            entry.skipped_rows.append(SkippedRow(entry.session_id, row_id, f"not JSON: {exc}"))
            continue
        if not isinstance(item, dict):
            entry.skipped_rows.append(
                SkippedRow(entry.session_id, row_id, f"not a JSON object ({type(item).__name__})")
            )
            continue
        items.append(item)
    return items


async def _exists(store: SessionStore, session_id: str) -> bool:
    try:
        await store.get(session_id, offset=PEEK_OFFSET)
    except SessionNotFoundError:
        return False
    except SessionCorruptedError:
        return True
    return True


async def _write_and_verify(
    store: SessionStore,
    entry: OpenAIAgentsMigration,
    items: list[dict[str, Any]],
    created_at: str | None,
    *,
    replace: bool,
) -> None:
    session_id = entry.session_id
    if replace:
        await store.delete(session_id)
    await store.create(session_id, created_at=created_at)
    try:
        async with store.writer_lock(session_id):
            await store.commit(session_id, [item_to_message(item) for item in items])
        record = await store.get(session_id)
        back = [
            message_to_item(message, session_id, index)
            for index, message in enumerate(record.messages)
        ]
        if back != items:
            raise SessionCorruptedError(
                f"session {session_id!r} read back different from its source after the copy"
            )
        report = await verify_store(store, session_ids=[session_id])
        if not report.clean:
            raise SessionCorruptedError(
                f"verify found damage in session {session_id!r} after the copy: "
                + "; ".join(f"{d.kind} at {d.position}: {d.detail}" for d in report.damage)
            )
    except BaseException:
        # Leave no half-imported session behind: a rerun must not find it "existing".
        try:
            await store.delete(session_id)
        except (PerdureError, OSError, ValueError):
            entry.notes.append("the partly written session could not be removed")
        raise
    entry.items_imported = len(back)
    entry.verified = True


async def migrate_openai_agents(
    source: str | Path,
    store: SessionStore,
    *,
    sessions_table: str = "agent_sessions",
    messages_table: str = "agent_messages",
    dry_run: bool = False,
    overwrite: bool = False,
    progress: Callable[[OpenAIAgentsMigration, int, int], None] | None = None,
) -> OpenAIAgentsMigrationReport:
    """Import the sessions of an OpenAI Agents ``SQLiteSession`` database into ``store``.

    Each session keeps its id; its items are stored as the module docstring says,
    so :class:`~perdure.adapters.openai_agents.PerdureSession` reads them back equal.
    After each session is written it is read back, compared item by item with the
    source, and verified (:func:`~perdure.maintenance.verify_store`); a session that
    fails either is deleted again and reported ``failed``.

    Args:
        source: The database file (``SQLiteSession(db_path=…)``).
        store: Where the perdure sessions go.
        sessions_table: The SDK's ``sessions_table`` (default ``agent_sessions``).
        messages_table: The SDK's ``messages_table`` (default ``agent_messages``).
        dry_run: Read and convert everything, write nothing (``would_import``).
        overwrite: Replace sessions that already exist in ``store`` (delete, then
            write; not atomic) instead of skipping them.
        progress: Called as ``progress(entry, done, total)`` after each session.

    Returns:
        The report; ``report.ok`` is false when a row could not be read or a session
        could not be written. Writing errors are reported per session, not raised.

    Raises:
        ValueError: ``source`` is not a readable ``SQLiteSession`` database, or a
            table name is not a plain SQL name.
        TypeError: ``store`` is not a :class:`SessionStore`.
    """
    sessions_table = _check_table_name(sessions_table, "sessions_table")
    messages_table = _check_table_name(messages_table, "messages_table")
    if not isinstance(store, SessionStore):
        raise TypeError(f"store must implement SessionStore, got {type(store).__name__}")
    path = Path(source)
    found = await asyncio.to_thread(_read_database, path, sessions_table, messages_table)
    report = OpenAIAgentsMigrationReport(source=str(path), dry_run=dry_run)
    total = len(found)
    for done, (session_id, rows, stamp) in enumerate(found, start=1):
        entry = OpenAIAgentsMigration(session_id=session_id, items_read=len(rows))
        report.sessions.append(entry)
        items = _items(entry, rows)
        created_at = _created_at(entry, stamp)
        await _migrate_one(store, entry, items, created_at, dry_run=dry_run, overwrite=overwrite)
        if progress is not None:
            progress(entry, done, total)
    return report


async def _migrate_one(
    store: SessionStore,
    entry: OpenAIAgentsMigration,
    items: list[dict[str, Any]],
    created_at: str | None,
    *,
    dry_run: bool,
    overwrite: bool,
) -> None:
    try:
        validate_session_id(entry.session_id)
    except (TypeError, ValueError) as exc:
        entry.status, entry.reason = "failed", f"not a valid perdure session id: {exc}"
        return
    try:
        exists = await _exists(store, entry.session_id)
    except PerdureError as exc:
        entry.status, entry.reason = "failed", f"the store could not be read: {exc}"
        return
    if exists and not overwrite:
        entry.status = "skipped"
        entry.reason = "a session with this id already exists in the store (use overwrite)"
        return
    if dry_run:
        entry.status = "would_import"
        entry.items_imported = len(items)
        if exists:
            entry.notes.append("would replace the existing session")
        return
    try:
        await _write_and_verify(store, entry, items, created_at, replace=exists)
    except (PerdureError, OSError, ValueError, TypeError) as exc:
        entry.status, entry.reason = "failed", f"writing failed: {exc}"
        return
    if exists:
        entry.notes.append("replaced the existing session")
