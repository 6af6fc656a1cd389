"""Import sessions written by the Strands Agents SDK into a perdure ``SessionStore``.

Two layouts are read under one source directory ``DIR``, as the Strands SDK writes them:

* ``FileSessionManager(storage_dir=DIR)`` — a message log, one JSON file per message::

    DIR/session_<session_id>/session.json
    DIR/session_<session_id>/agents/agent_<agent_id>/agent.json
    DIR/session_<session_id>/agents/agent_<agent_id>/messages/message_<n>.json

  ``agent.json`` holds ``state``, ``conversation_manager_state`` and
  ``_internal_state`` (``interrupt_state``, ``model_state``); each message file holds
  ``{"message", "message_id", "redact_message", "created_at", "updated_at"}``.

* ``SnapshotSessionManager(storage=LocalFileStorage(DIR))`` — whole-agent snapshots
  (``{"scope", "schema_version", "created_at", "data", "app_data"}``)::

    DIR/session/<session_id>/scopes/agent/<agent_id>/snapshots/snapshot_latest.json
    DIR/session/<session_id>/scopes/agent/<agent_id>/snapshots/immutable_history/snapshot_<id>.json

How a Strands agent becomes a perdure session:

* **Ids.** A Strands session with one agent keeps its id; with several agents each
  becomes ``<session_id>.<agent_id>``. An agent found in both layouts is imported
  from the snapshot layout (Strands' ``migrate_from`` moves message logs into
  snapshots and never reads the log again); its message log is reported as
  superseded.
* **Messages** are taken in the order of the integer ``n`` of ``message_<n>.json``
  (not the file names' order); a ``redact_message`` replaces its message (the
  pre-redaction original is not imported); bytes (``{"__bytes_encoded__": true,
  "data": …}``) are decoded; content blocks perdure does not know (``cachePoint``,
  ``guardContent``, …) are dropped and reported; then broken tool pairs are repaired
  with :func:`~perdure.agent.conversation.pairing.repair_tool_pairs` (a placeholder
  error result for a ``toolUse`` that never got one, orphan results dropped).
* **Agent state** becomes perdure's persisted agent state (``perdure-agent-state/1``):
  ``state`` as is; the conversation manager's state when it names a manager perdure
  has (``SlidingWindowConversationManager``, ``SummarizingConversationManager``,
  ``NullConversationManager``), with ``removed_message_count`` kept as the offset of
  the agent's view into the imported history (a Strands summary message is put at
  that offset); Strands interrupt state (``interrupts``, ``activated``, and
  ``context["tool_results"]`` as the completed results); ``model_state``.
* **Snapshot layout.** ``snapshot_latest`` gives the history and the state (the newest
  immutable snapshot stands in when it is missing or unreadable); each immutable
  snapshot becomes a perdure checkpoint (trigger ``"import"``, label ``"strands
  snapshot <id>"``, oldest first) when the store has a checkpoint store. Snapshots
  hold only the messages the agent kept, so their ``removed_message_count`` is reset
  to 0. A stored system prompt is not imported (perdure sessions do not persist it;
  pass it to the ``Agent``) and this is noted.

Guarantees: every file that could not be read or understood is listed in the report
with the reason — nothing is dropped silently; ``dry_run`` reads everything and writes
nothing; a session that already exists in the store is skipped with a reason unless
``overwrite`` (then it is deleted and written again, which is not atomic). Blocking
reads run in a worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from perdure.agent.conversation.null import NullConversationManager
from perdure.agent.conversation.pairing import repair_tool_pairs
from perdure.agent.conversation.sliding_window import SlidingWindowConversationManager
from perdure.agent.conversation.summarizing import SummarizingConversationManager
from perdure.agent.interrupt_state import InterruptState
from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    new_checkpoint_id,
    now_iso,
)
from perdure.errors import (
    PerdureError,
    SessionCorruptedError,
    SessionNotFoundError,
    SnapshotError,
)
from perdure.migrate.report import MigrationStatus, count_status, status_counts
from perdure.session.ids import validate_session_id
from perdure.session.rules import creation_time
from perdure.session.session import AGENT_STATE_FORMAT
from perdure.session.store import SessionStore
from perdure.types import (
    CONTENT_BLOCK_KEYS,
    ContentBlock,
    Message,
    decode_bytes_values,
    validate_message,
)

__all__ = [
    "MigrationReport",
    "MigrationStatus",
    "SessionMigration",
    "SkippedFile",
    "migrate_strands",
]

Layout = Literal["file_session_manager", "snapshot"]

_SESSION_PREFIX = "session_"
_AGENT_PREFIX = "agent_"
_MESSAGE_FILE = re.compile(r"message_(-?\d+)\.json\Z")
_SNAPSHOT_FILE = re.compile(r"snapshot_([\w-]+)\.json\Z")
_LATEST = "snapshot_latest.json"
_HISTORY = "immutable_history"
_KNOWN_MANAGERS = frozenset(
    cls.__name__
    for cls in (
        SlidingWindowConversationManager,
        SummarizingConversationManager,
        NullConversationManager,
    )
)


@dataclass(frozen=True)
class SkippedFile:
    """A file (or a part of one, ``path#where``) that was not imported, and why."""

    path: str
    reason: str


@dataclass
class SessionMigration:
    """What the migration did (or would do) with one Strands agent.

    Attributes:
        session_id: The perdure session it becomes.
        strands_session_id: The Strands session id.
        agent_id: The Strands agent id.
        layout: ``"file_session_manager"`` or ``"snapshot"``.
        source: Its directory, relative to the source directory.
        status: See :data:`MigrationStatus`.
        reason: Why it was skipped or failed.
        messages_read: Messages read from Strands (after redactions).
        messages_imported: Messages in the imported history (after repair).
        placeholders_added: Placeholder results given to ``toolUse`` blocks without one.
        orphans_dropped: ``toolResult`` blocks dropped because nothing asked for them.
        redactions_applied: Messages replaced by their ``redact_message``.
        checkpoints_imported: Immutable snapshots imported as checkpoints.
        strands_created_at: When Strands created the session (``session.json``),
            the imported session's ``created_at``; ``None`` when unknown.
        skipped_files: Files of this agent that were not imported, with reasons.
        notes: Other things worth knowing (dropped blocks, moved offsets, …).
    """

    session_id: str
    strands_session_id: str
    agent_id: str
    layout: Layout
    source: str
    status: MigrationStatus = "imported"
    reason: str | None = None
    messages_read: int = 0
    messages_imported: int = 0
    placeholders_added: int = 0
    orphans_dropped: int = 0
    redactions_applied: int = 0
    checkpoints_imported: int = 0
    strands_created_at: str | None = None
    skipped_files: list[SkippedFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class MigrationReport:
    """What :func:`migrate_strands` did, session by session.

    Attributes:
        source_dir: The directory read.
        dry_run: Nothing was written.
        sessions: One entry per Strands agent found, in source order.
        skipped_files: Files that belong to no importable agent (unreadable session
            metadata, multi-agent orchestrator state, stray files), with reasons.
    """

    source_dir: str
    dry_run: bool
    sessions: list[SessionMigration] = field(default_factory=list)
    skipped_files: list[SkippedFile] = field(default_factory=list)

    def count(self, status: MigrationStatus) -> int:
        """How many sessions ended with ``status``."""
        return count_status(self.sessions, status)

    @property
    def all_skipped_files(self) -> list[SkippedFile]:
        """Every file not imported: the report's own and each session's."""
        return [*self.skipped_files, *(f for s in self.sessions for f in s.skipped_files)]

    @property
    def ok(self) -> bool:
        """No session failed and every file was read (skipped sessions are fine)."""
        return self.count("failed") == 0 and not self.all_skipped_files

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary plus every session and skipped file."""
        return {
            "source_dir": self.source_dir,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "counts": status_counts(self.sessions),
            "sessions": [asdict(entry) for entry in self.sessions],
            "skipped_files": [asdict(entry) for entry in self.skipped_files],
        }


# ----------------------------------------------------------------------------- plan


@dataclass
class _Checkpoint:
    label: str
    created_at: str
    messages: list[Message]
    agent_state: dict[str, Any]


@dataclass
class _Plan:
    """One agent, read and converted, ready to be written."""

    entry: SessionMigration
    messages: list[Message] = field(default_factory=list)
    agent_state: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[_Checkpoint] = field(default_factory=list)
    created_at: str | None = None  # the session's creation time (None: the migration's)


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _children(directory: Path, root: Path, skipped: list[SkippedFile]) -> list[Path]:
    """The entries of ``directory``, sorted; an unreadable directory is reported, not raised."""
    try:
        return sorted(directory.iterdir())
    except OSError as exc:
        skipped.append(SkippedFile(_rel(directory, root), f"unreadable: {exc.strerror or exc}"))
        return []


def _read_json(path: Path) -> Any:
    """Parse a JSON file.

    Raises:
        ValueError: unreadable, not UTF-8 or not JSON (the message says which).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"unreadable: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {exc}") from None


def _clean_blocks(blocks: list[Any], where: str, dropped: list[str]) -> list[ContentBlock]:
    kept: list[ContentBlock] = []
    for index, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise ValueError(f"{where}.content[{index}] is not an object")
        if not CONTENT_BLOCK_KEYS.intersection(block):
            dropped.append(next(iter(block), "empty"))
            continue
        if "toolResult" in block and isinstance(block["toolResult"], dict):
            inner = block["toolResult"].get("content")
            if isinstance(inner, list):
                cleaned = _clean_blocks(inner, f"{where}.toolResult", dropped)
                block = {**block, "toolResult": {**block["toolResult"], "content": cleaned}}
        kept.append(block)  # type: ignore[arg-type]  # checked by validate_message below
    return kept


def _convert_message(raw: Any, where: str) -> tuple[Message | None, list[str]]:
    """A Strands message as a perdure message: bytes decoded, unknown blocks dropped.

    Returns:
        The message (``None`` if nothing perdure can hold was left) and the kinds of
        the blocks dropped.

    Raises:
        ValueError: it is not a message (the message says why).
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not a message object")
    decoded = decode_bytes_values(raw)
    content = decoded.get("content")
    if not isinstance(content, list):
        raise ValueError(f"{where} has no content list")
    dropped: list[str] = []
    message: dict[str, Any] = {
        "role": decoded.get("role"),
        "content": _clean_blocks(content, where, dropped),
    }
    try:
        validate_message(message, where)
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    if not message["content"]:
        return None, dropped
    return message, dropped  # type: ignore[return-value]  # validated above


def _note_dropped(entry: SessionMigration, where: str, dropped: list[str]) -> None:
    if dropped:
        kinds = ", ".join(sorted(set(dropped)))
        entry.notes.append(
            f"{where}: dropped {len(dropped)} content block(s) perdure does not hold ({kinds})"
        )


def _tool_results(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages for b in m["content"] if "toolResult" in b)


@dataclass
class _Repaired:
    messages: list[Message]
    offset: int
    placeholders: int
    orphans: int


def _repair(messages: list[Message], offset: int) -> _Repaired:
    """Repair tool pairs and find where the agent's view (``messages[offset:]``) now starts.

    The first message of the view carries a marker block through the repair (which
    keeps non-result blocks and their objects), so placeholders inserted and orphan
    messages dropped before it move the offset with them.
    """
    offset = max(0, min(offset, len(messages)))
    marker: ContentBlock = {"text": "perdure-migrate-offset-marker"}
    tagged = list(messages)
    if offset < len(messages):
        first = tagged[offset]
        tagged[offset] = {**first, "content": [*first["content"], marker]}
    repaired, changes = repair_tool_pairs(tagged)
    delta = _tool_results(repaired) - _tool_results(messages)
    placeholders, orphans = (changes + delta) // 2, (changes - delta) // 2
    if offset == len(messages):
        return _Repaired(repaired, len(repaired), placeholders, orphans)
    new_offset = next(
        i for i, m in enumerate(repaired) if any(block is marker for block in m["content"])
    )
    found = repaired[new_offset]
    content = [block for block in found["content"] if block is not marker]
    if content:
        repaired[new_offset] = {**found, "content": content}
    else:
        del repaired[new_offset]
    return _Repaired(repaired, new_offset, placeholders, orphans)


def _interrupt_state(raw: Any, entry: SessionMigration, where: str) -> dict[str, Any]:
    """Strands ``{"interrupts", "context", "activated"}`` as perdure interrupt state."""
    empty = InterruptState().to_dict()
    if raw is None or raw == {}:
        return empty
    if not isinstance(raw, dict):
        entry.notes.append(f"{where}: interrupt_state is not an object; not imported")
        return empty
    context = raw.get("context") if isinstance(raw.get("context"), dict) else {}
    results = context.get("tool_results", []) if isinstance(context, dict) else []
    candidate = {
        "activated": bool(raw.get("activated", False)),
        "cycle_index": 0,
        "interrupts": raw.get("interrupts") or {},
        "completed_results": results if isinstance(results, list) else [],
    }
    try:
        converted = InterruptState.from_dict(candidate).to_dict()
    except (SnapshotError, TypeError, ValueError) as exc:
        entry.notes.append(f"{where}: interrupt_state not imported ({exc})")
        return empty
    if converted["activated"]:
        entry.notes.append(
            f"{where}: {len(converted['interrupts'])} interrupt(s) were pending in Strands "
            "and are imported as pending"
        )
    return converted


def _manager_state(raw: Any, entry: SessionMigration, where: str, *, offset: int) -> dict[str, Any]:
    if not raw:
        return {}
    if not isinstance(raw, dict):
        entry.notes.append(f"{where}: conversation_manager_state is not an object; not imported")
        return {}
    name = raw.get("__name__")
    if name not in _KNOWN_MANAGERS:
        entry.notes.append(
            f"{where}: conversation manager {name!r} has no perdure counterpart; its state "
            "is not imported and the agent sees the whole history"
        )
        return {}
    return {"__name__": name, "removed_message_count": offset}


def _agent_state(
    agent_id: str,
    state: Any,
    manager_state: dict[str, Any],
    interrupt_state: dict[str, Any],
    model_state: Any,
    entry: SessionMigration,
    where: str,
) -> dict[str, Any]:
    if state is None:
        state = {}
    if not isinstance(state, dict):
        entry.notes.append(f"{where}: state is not an object; not imported")
        state = {}
    if model_state is None:
        model_state = {}
    if not isinstance(model_state, dict):
        entry.notes.append(f"{where}: model_state is not an object; not imported")
        model_state = {}
    return {
        "format": AGENT_STATE_FORMAT,
        "agent_id": agent_id,
        "state": copy.deepcopy(state),
        "internal_state": {
            "interrupt_state": interrupt_state,
            "model_state": copy.deepcopy(model_state),
        },
        "conversation_manager_state": manager_state,
    }


def _apply_repair(plan: _Plan, messages: list[Message], offset: int, where: str) -> int:
    repaired = _repair(messages, offset)
    entry = plan.entry
    entry.placeholders_added += repaired.placeholders
    entry.orphans_dropped += repaired.orphans
    new_offset = repaired.offset
    view = repaired.messages[new_offset:]
    if view and any("toolResult" in block for block in view[0]["content"]) and new_offset > 0:
        # The view would open with results whose toolUse is hidden: show that toolUse too.
        new_offset -= 1
        entry.notes.append(
            f"{where}: the agent's view starts one message earlier than in Strands so that "
            "it does not open with a tool result"
        )
    plan.messages = repaired.messages
    entry.messages_imported = len(repaired.messages)
    return new_offset


# ------------------------------------------------------------ FileSessionManager layout


def _read_agent_json(entry: SessionMigration, root: Path, agent_dir: Path) -> dict[str, Any]:
    """``agent.json`` as a dict (``{}`` when missing or unreadable, which is reported)."""
    path = agent_dir / "agent.json"
    where = _rel(path, root)
    if not path.exists():
        entry.skipped_files.append(SkippedFile(where, "missing; the agent's state is not imported"))
        return {}
    try:
        data = _read_json(path)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        entry.skipped_files.append(SkippedFile(where, f"{exc}; the agent's state is not imported"))
        return {}
    if data.get("agent_id") not in (None, entry.agent_id):
        entry.notes.append(
            f"{where} names agent {data.get('agent_id')!r}; the directory name "
            f"{entry.agent_id!r} is used"
        )
    return data


def _message_files(entry: SessionMigration, root: Path, agent_dir: Path) -> list[tuple[int, Path]]:
    """``messages/message_<n>.json`` files by the integer ``n``; strays are reported."""
    messages_dir = agent_dir / "messages"
    numbered: list[tuple[int, Path]] = []
    if not messages_dir.is_dir():
        if messages_dir.exists():
            entry.skipped_files.append(SkippedFile(_rel(messages_dir, root), "not a directory"))
        return numbered
    for child in _children(messages_dir, root, entry.skipped_files):
        match = _MESSAGE_FILE.match(child.name)
        if match is None or not child.is_file():
            entry.skipped_files.append(
                SkippedFile(
                    _rel(child, root),
                    "not a message file (message_<n>.json): a temporary file of an "
                    "unfinished write, or foreign",
                )
            )
            continue
        numbered.append((int(match.group(1)), child))
    numbered.sort(key=lambda item: (item[0], item[1].name))
    return numbered


def _removed_count(entry: SessionMigration, where: str, manager_state: Any, files: int) -> int:
    count = manager_state.get("removed_message_count", 0) if isinstance(manager_state, dict) else 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        entry.notes.append(f"{where}: removed_message_count {count!r} is invalid; 0 is used")
        return 0
    if count > files:
        entry.notes.append(
            f"{where}: removed_message_count {count} is past the {files} message files; "
            "the agent's view is empty"
        )
    return count


def _read_message(entry: SessionMigration, path: Path, where: str, number: int) -> Message | None:
    """One message file (its ``redact_message`` if any); ``None`` if skipped (reported)."""
    try:
        data = _read_json(path)
        if not isinstance(data, dict) or "message" not in data:
            raise ValueError("not a Strands message record (no 'message')")
        redacted = data.get("redact_message")
        message, dropped = _convert_message(
            data["message"] if redacted is None else redacted, "message"
        )
    except ValueError as exc:
        entry.skipped_files.append(SkippedFile(where, str(exc)))
        return None
    if data.get("message_id") not in (None, number):
        entry.notes.append(
            f"{where}: message_id {data.get('message_id')!r} differs from the file name; "
            "the file name orders it"
        )
    if redacted is not None:
        entry.redactions_applied += 1
    _note_dropped(entry, where, dropped)
    if message is None:
        entry.skipped_files.append(
            SkippedFile(where, "no content perdure can hold was left in the message")
        )
        return None
    return with_metadata(message, _message_metadata(data, number))


MESSAGE_METADATA = "metadata"
"""The key of a message's metadata: what perdure has no field for, kept from the source."""


def with_metadata(message: Message, metadata: dict[str, Any]) -> Message:
    """``message`` with ``metadata`` merged into its ``"metadata"`` (a new dict)."""
    if not metadata:
        return message
    merged = {**message}
    old = merged.get(MESSAGE_METADATA)
    merged[MESSAGE_METADATA] = {**(old if isinstance(old, dict) else {}), **metadata}
    return merged  # type: ignore[return-value]  # a message, with one more key


def _message_metadata(record: dict[str, Any], number: int) -> dict[str, Any]:
    """What a Strands message record holds beyond role and content, for the message.

    ``strands``: the record's ``message_id``, ``created_at`` and ``updated_at``;
    ``usage`` and ``metrics``: a model call's token counts and timings, where Strands
    kept them (on the message's ``metadata``, or on the record).
    """
    kept: dict[str, Any] = {"message_id": number}
    for key in ("created_at", "updated_at"):
        if isinstance(record.get(key), str):
            kept[key] = record[key]
    metadata: dict[str, Any] = {"strands": kept}
    raw = record.get("message")
    sources = [record, raw, raw.get("metadata") if isinstance(raw, dict) else None]
    for source in sources:
        if not isinstance(source, dict):
            continue
        for key in ("usage", "metrics"):
            if isinstance(source.get(key), dict):
                metadata[key] = decode_bytes_values(source[key])
    return metadata


def _read_message_log(plan: _Plan, root: Path, agent_dir: Path) -> None:
    entry = plan.entry
    rel = _rel(agent_dir, root)
    agent_data = _read_agent_json(entry, root, agent_dir)
    manager_raw = agent_data.get("conversation_manager_state")
    files = _message_files(entry, root, agent_dir)
    removed = _removed_count(entry, f"{rel}/agent.json", manager_raw, len(files))

    messages: list[Message] = []
    offset = 0  # where message file number `removed` lands among the messages read
    seen: set[int] = set()
    for position, (number, path) in enumerate(files):
        where = _rel(path, root)
        if position == removed:
            offset = len(messages)
        if number in seen:
            entry.skipped_files.append(SkippedFile(where, f"a second file for message id {number}"))
            continue
        seen.add(number)
        message = _read_message(entry, path, where, number)
        if message is not None:
            messages.append(message)
    if removed >= len(files):
        offset = len(messages)
    numbers = sorted(seen)
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - seen)
        entry.notes.append(f"{rel}: message ids {missing} are missing from the log")
    entry.messages_read = len(messages)

    summary = manager_raw.get("summary_message") if isinstance(manager_raw, dict) else None
    if summary is not None:
        where = f"{rel}/agent.json#summary_message"
        try:
            summary_message, dropped = _convert_message(summary, "summary_message")
        except ValueError as exc:
            entry.skipped_files.append(SkippedFile(where, str(exc)))
        else:
            _note_dropped(entry, where, dropped)
            if summary_message is not None:
                messages.insert(offset, summary_message)
                entry.notes.append(
                    f"{rel}: the Strands conversation summary is message {offset} of the "
                    "imported history, where the agent's view starts"
                )
    new_offset = _apply_repair(plan, messages, offset, rel)
    internal = agent_data.get("_internal_state")
    internal = internal if isinstance(internal, dict) else {}
    plan.agent_state = _agent_state(
        entry.agent_id,
        agent_data.get("state"),
        _manager_state(manager_raw, entry, f"{rel}/agent.json", offset=new_offset),
        _interrupt_state(internal.get("interrupt_state"), entry, f"{rel}/agent.json"),
        internal.get("model_state"),
        entry,
        f"{rel}/agent.json",
    )


def _scan_message_logs(
    root: Path, report: MigrationReport
) -> dict[tuple[str, str], tuple[Path, str]]:
    """Find ``session_<id>/agents/agent_<id>`` directories; report what else is there.

    Maps each ``(session_id, agent_id)`` to its directory and the session's
    ``created_at`` from ``session.json`` (``""`` when unknown).
    """
    found: dict[tuple[str, str], tuple[Path, str]] = {}
    for session_dir in _children(root, root, report.skipped_files):
        if not session_dir.name.startswith(_SESSION_PREFIX) or not session_dir.is_dir():
            continue
        session_id = session_dir.name[len(_SESSION_PREFIX) :]
        rel = _rel(session_dir, root)
        meta = session_dir / "session.json"
        created = ""
        if meta.exists():
            try:
                data = _read_json(meta)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                report.skipped_files.append(SkippedFile(f"{rel}/session.json", str(exc)))
            else:
                stamp = data.get("created_at")
                created = stamp if isinstance(stamp, str) else ""
        multi = session_dir / "multi_agents"
        if multi.is_dir():
            for child in _children(multi, root, report.skipped_files):
                report.skipped_files.append(
                    SkippedFile(
                        _rel(child, root),
                        "multi-agent orchestrator state (Graph/Swarm) is not imported",
                    )
                )
        agents = session_dir / "agents"
        if not agents.is_dir():
            continue
        for agent_dir in _children(agents, root, report.skipped_files):
            if not agent_dir.is_dir() or not agent_dir.name.startswith(_AGENT_PREFIX):
                report.skipped_files.append(
                    SkippedFile(_rel(agent_dir, root), "not an agent_<id> directory")
                )
                continue
            agent_id = agent_dir.name[len(_AGENT_PREFIX) :]
            found[(session_id, agent_id)] = (agent_dir, created)
    return found


# ------------------------------------------------------------------ snapshot layout


def _parse_snapshot(path: Path) -> dict[str, Any]:
    """Read a Strands snapshot file; return its ``data`` (plus ``created_at``).

    Raises:
        ValueError: unreadable, malformed, or of an unknown schema/scope.
    """
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise ValueError("not a Strands snapshot (no 'data' object)")
    version = data.get("schema_version", data.get("schemaVersion"))
    if version != "1.0":
        raise ValueError(f"unsupported snapshot schema_version {version!r} (expected '1.0')")
    if data.get("scope", "agent") != "agent":
        raise ValueError(f"snapshot scope {data.get('scope')!r} is not 'agent'")
    fields: dict[str, Any] = dict(data["data"])
    fields["__created_at__"] = data.get("created_at", data.get("createdAt"))
    return fields


def _snapshot_messages(
    fields: dict[str, Any], where: str, entry: SessionMigration
) -> list[Message]:
    raw = fields.get("messages", [])
    if not isinstance(raw, list):
        entry.skipped_files.append(SkippedFile(f"{where}#messages", "not a list"))
        return []
    messages: list[Message] = []
    for index, item in enumerate(raw):
        try:
            message, dropped = _convert_message(item, f"messages[{index}]")
        except ValueError as exc:
            entry.skipped_files.append(SkippedFile(f"{where}#messages[{index}]", str(exc)))
            continue
        _note_dropped(entry, f"{where}#messages[{index}]", dropped)
        if message is not None:
            messages.append(message)
    return messages


def _snapshot_state(fields: dict[str, Any], entry: SessionMigration, where: str) -> dict[str, Any]:
    return _agent_state(
        entry.agent_id,
        fields.get("state"),
        _manager_state(fields.get("conversation_manager_state"), entry, where, offset=0),
        _interrupt_state(fields.get("interrupt_state"), entry, where),
        fields.get("model_state"),
        entry,
        where,
    )


def _read_snapshots(plan: _Plan, root: Path, snapshots_dir: Path) -> None:
    entry = plan.entry
    rel = _rel(snapshots_dir, root)
    history_dir = snapshots_dir / _HISTORY
    history: list[tuple[str, Path]] = []
    if history_dir.is_dir():
        for child in _children(history_dir, root, entry.skipped_files):
            match = _SNAPSHOT_FILE.match(child.name)
            if match is None or not child.is_file():
                entry.skipped_files.append(
                    SkippedFile(_rel(child, root), "not a snapshot_<id>.json file")
                )
                continue
            history.append((match.group(1), child))
    for child in _children(snapshots_dir, root, entry.skipped_files):
        if child.name not in (_LATEST, _HISTORY, "manifest.json"):
            entry.skipped_files.append(
                SkippedFile(_rel(child, root), "not part of the Strands snapshot layout")
            )
    # Ids are time-ordered (a millisecond timestamp or a UUIDv7): sorting is oldest first.
    history.sort()

    parsed: list[tuple[str, dict[str, Any]]] = []
    for snapshot_id, path in history:
        try:
            parsed.append((snapshot_id, _parse_snapshot(path)))
        except ValueError as exc:
            entry.skipped_files.append(SkippedFile(_rel(path, root), str(exc)))

    latest_path = snapshots_dir / _LATEST
    latest: dict[str, Any] | None = None
    latest_where = f"{rel}/{_LATEST}"
    if latest_path.exists():
        try:
            latest = _parse_snapshot(latest_path)
        except ValueError as exc:
            entry.skipped_files.append(SkippedFile(latest_where, str(exc)))
    if latest is None and parsed:
        snapshot_id, latest = parsed[-1]
        latest_where = f"{rel}/{_HISTORY}/snapshot_{snapshot_id}.json"
        entry.notes.append(
            f"{rel}: no readable {_LATEST}; the newest immutable snapshot {snapshot_id} "
            "gives the current history"
        )
    if latest is None:
        entry.notes.append(f"{rel}: no readable snapshot; the session is imported empty")
        latest = {}

    messages = _snapshot_messages(latest, latest_where, entry)
    entry.messages_read = len(messages)
    _apply_repair(plan, messages, 0, latest_where)
    plan.agent_state = _snapshot_state(latest, entry, latest_where)
    if latest.get("system_prompt") not in (None, ""):
        entry.notes.append(
            f"{latest_where}: the system prompt is not imported (perdure sessions do not "
            "store it; pass system_prompt= to the Agent)"
        )

    for snapshot_id, fields in parsed:
        where = f"{rel}/{_HISTORY}/snapshot_{snapshot_id}.json"
        raw_messages = _snapshot_messages(fields, where, entry)
        repaired = _repair(raw_messages, 0)
        if repaired.placeholders or repaired.orphans:
            entry.notes.append(
                f"{where}: checkpoint repaired ({repaired.placeholders} placeholder(s), "
                f"{repaired.orphans} orphan result(s) dropped)"
            )
        created = fields.get("__created_at__")
        plan.checkpoints.append(
            _Checkpoint(
                label=f"strands snapshot {snapshot_id}",
                created_at=created if isinstance(created, str) and created else now_iso(),
                messages=repaired.messages,
                agent_state=_snapshot_state(fields, entry, where),
            )
        )


def _scan_snapshots(root: Path, report: MigrationReport) -> dict[tuple[str, str], tuple[Path, str]]:
    found: dict[tuple[str, str], tuple[Path, str]] = {}
    base = root / "session"
    if not base.is_dir():
        return found
    for session_dir in _children(base, root, report.skipped_files):
        if not session_dir.is_dir():
            report.skipped_files.append(
                SkippedFile(_rel(session_dir, root), "not a session directory")
            )
            continue
        scopes = session_dir / "scopes"
        multi = scopes / "multiAgent"
        if multi.is_dir():
            for child in _children(multi, root, report.skipped_files):
                report.skipped_files.append(
                    SkippedFile(
                        _rel(child, root),
                        "multi-agent orchestrator snapshot (Graph/Swarm) is not imported",
                    )
                )
        agents = scopes / "agent"
        if not agents.is_dir():
            continue
        for agent_dir in _children(agents, root, report.skipped_files):
            snapshots_dir = agent_dir / "snapshots"
            if not snapshots_dir.is_dir():
                report.skipped_files.append(
                    SkippedFile(_rel(agent_dir, root), "no snapshots directory")
                )
                continue
            found[(session_dir.name, agent_dir.name)] = (snapshots_dir, _rel(session_dir, root))
    return found


# ---------------------------------------------------------------------------- scan


def _scan(source: Path, dry_run: bool) -> tuple[MigrationReport, list[_Plan]]:
    """Read the whole source directory (blocking; run in a worker thread).

    Raises:
        ValueError: ``source`` is not a directory.
    """
    if not source.is_dir():
        raise ValueError(f"source_dir {str(source)!r} is not a directory")
    report = MigrationReport(source_dir=str(source), dry_run=dry_run)
    logs = _scan_message_logs(source, report)
    snaps = _scan_snapshots(source, report)
    agents_of: dict[str, set[str]] = {}
    for session_id, agent_id in [*snaps, *logs]:
        agents_of.setdefault(session_id, set()).add(agent_id)

    def target(session_id: str, agent_id: str) -> str:
        return session_id if len(agents_of[session_id]) == 1 else f"{session_id}.{agent_id}"

    plans: list[_Plan] = []
    for (session_id, agent_id), (snapshots_dir, _) in snaps.items():
        entry = SessionMigration(
            session_id=target(session_id, agent_id),
            strands_session_id=session_id,
            agent_id=agent_id,
            layout="snapshot",
            source=_rel(snapshots_dir, source),
        )
        plan = _Plan(entry)
        _read_snapshots(plan, source, snapshots_dir)
        plans.append(plan)
    for (session_id, agent_id), (agent_dir, created) in logs.items():
        entry = SessionMigration(
            session_id=target(session_id, agent_id),
            strands_session_id=session_id,
            agent_id=agent_id,
            layout="file_session_manager",
            source=_rel(agent_dir, source),
            strands_created_at=created or None,
        )
        plan = _Plan(entry)
        if (session_id, agent_id) in snaps:
            entry.status = "skipped"
            entry.reason = (
                "superseded by the snapshot layout of the same agent (Strands restores from "
                "the snapshot once it exists)"
            )
        else:
            _read_message_log(plan, source, agent_dir)
            if created:
                _keep_creation_time(plan, created)
        plans.append(plan)

    taken: dict[str, str] = {}
    for plan in plans:
        entry = plan.entry
        if entry.status != "imported":
            continue
        try:
            validate_session_id(entry.session_id)
        except (TypeError, ValueError) as exc:
            entry.status, entry.reason = "failed", f"not a valid perdure session id: {exc}"
            continue
        if entry.session_id in taken:
            entry.status = "skipped"
            entry.reason = (
                f"session id {entry.session_id!r} is also produced by {taken[entry.session_id]}"
            )
            continue
        taken[entry.session_id] = entry.source
    report.sessions = [plan.entry for plan in plans]
    return report, plans


def _keep_creation_time(plan: _Plan, created: str) -> None:
    """The session is created at Strands' ``created``: the perdure session's own time.

    A value that names no instant (no time, or one without an offset) cannot be; the
    session is then created at the migration time, the value kept in the first
    message's metadata (``strands.session_created_at``), and a note says so.
    """
    try:
        creation_time(created)
    except ValueError as exc:
        plan.entry.notes.append(
            f"session.json's created_at is unusable ({exc}): the session is created at the "
            "migration time"
        )
    else:
        plan.created_at = created
        return
    if plan.messages:
        plan.messages[0] = with_metadata(
            plan.messages[0],
            {"strands": {**_strands_of(plan.messages[0]), "session_created_at": created}},
        )


def _strands_of(message: Message) -> dict[str, Any]:
    metadata = message.get(MESSAGE_METADATA)
    strands = metadata.get("strands") if isinstance(metadata, dict) else None
    return dict(strands) if isinstance(strands, dict) else {}


# --------------------------------------------------------------------------- write


async def _exists(store: SessionStore, session_id: str) -> bool:
    try:
        await store.get(session_id)
    except SessionNotFoundError:
        return False
    except SessionCorruptedError:
        return True
    return True


async def _write(store: SessionStore, plan: _Plan, *, replace: bool) -> None:
    entry = plan.entry
    session_id = entry.session_id
    if replace:
        await store.delete(session_id)
    await store.create(session_id, created_at=plan.created_at)
    try:
        async with store.writer_lock(session_id):
            await store.commit(session_id, plan.messages, agent_state=plan.agent_state)
        checkpoints = getattr(store, "checkpoints", None)
        if plan.checkpoints and not isinstance(checkpoints, CheckpointStore):
            entry.notes.append(
                f"the store keeps no checkpoints; {len(plan.checkpoints)} immutable "
                "snapshot(s) not imported"
            )
            return
        for checkpoint in plan.checkpoints:
            assert isinstance(checkpoints, CheckpointStore)
            meta = CheckpointMeta(
                checkpoint_id=await new_checkpoint_id(checkpoints, session_id),
                session_id=session_id,
                trigger="import",
                label=checkpoint.label,
                message_count=len(checkpoint.messages),
                created_at=checkpoint.created_at,
            )
            await checkpoints.put(
                CheckpointRecord(meta, checkpoint.messages, checkpoint.agent_state)
            )
            entry.checkpoints_imported += 1
    except BaseException:
        # Leave no half-imported session behind: a rerun must not find it "existing".
        try:
            await store.delete(session_id)
        except (PerdureError, OSError, ValueError):
            entry.notes.append("the partly written session could not be removed")
        raise


async def migrate_strands(
    source_dir: str | Path,
    store: SessionStore,
    *,
    dry_run: bool = False,
    overwrite: bool = False,
    progress: Callable[[SessionMigration, int, int], None] | None = None,
    strict: bool = False,
) -> MigrationReport:
    """Import the Strands Agents sessions under ``source_dir`` into ``store``.

    See the module docstring for the layouts read and the conversion rules.

    Args:
        source_dir: The Strands ``storage_dir`` (``FileSessionManager``) or the base
            directory of its ``LocalFileStorage`` (``SnapshotSessionManager``); both
            layouts may be present.
        store: Where the perdure sessions go.
        dry_run: Read and convert everything, write nothing (statuses are
            ``"would_import"``).
        overwrite: Replace sessions that already exist in ``store`` (delete, then
            write; not atomic) instead of skipping them.
        progress: Called as ``progress(entry, done, total)`` after each agent.
        strict: Refuse (status ``"failed"``, nothing written) a session with a file
            that could not be read — a message among them — instead of importing
            it with a gap.

    Returns:
        The report; ``report.ok`` is false when a file could not be read or a
        session could not be written. Writing errors are reported per session, not
        raised.

    Raises:
        ValueError: ``source_dir`` is not a directory.
        TypeError: ``store`` is not a :class:`SessionStore`.
    """
    source = Path(source_dir)
    if not isinstance(store, SessionStore):
        raise TypeError(f"store must implement SessionStore, got {type(store).__name__}")
    report, plans = await asyncio.to_thread(_scan, source, dry_run)
    total = len(plans)
    for done, plan in enumerate(plans, start=1):
        entry = plan.entry
        if strict and entry.status == "imported" and entry.skipped_files:
            first = entry.skipped_files[0]
            entry.status = "failed"
            entry.reason = (
                f"strict: {len(entry.skipped_files)} file(s) of this session could not be "
                f"read ({first.path}: {first.reason}); nothing was imported"
            )
        if entry.status == "imported":
            await _migrate_one(store, plan, dry_run=dry_run, overwrite=overwrite)
        if progress is not None:
            progress(entry, done, total)
    return report


async def _migrate_one(store: SessionStore, plan: _Plan, *, dry_run: bool, overwrite: bool) -> None:
    entry = plan.entry
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
        if exists:
            entry.notes.append("would replace the existing session")
        if plan.checkpoints:
            entry.checkpoints_imported = len(plan.checkpoints)
        return
    try:
        await _write(store, plan, replace=exists)
    except (PerdureError, OSError, ValueError, TypeError) as exc:
        entry.status, entry.reason = "failed", f"writing failed: {exc}"
        return
    if exists:
        entry.notes.append("replaced the existing session")
