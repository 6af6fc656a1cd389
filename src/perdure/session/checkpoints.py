"""Session checkpoints: self-contained, read-only copies of a session at a moment.

A checkpoint holds the whole stored history and the agent's persisted state, so it
can be restored, forked or exported after compaction folded the original messages
away. Where checkpoints live is explicit (seed 002):

- beside the session: ``FileSessionStore.checkpoints`` writes
  ``<dir>/sessions/<id>/checkpoints/`` and they are deleted with the session;
- an independent directory: :class:`FileCheckpointStore` (its own lifecycle);
- any object implementing :class:`CheckpointStore` (``put``/``get``/``list``/
  ``delete``), e.g. :class:`MemoryCheckpointStore`.

Checkpoint files are written durably (temp file + fsync + rename). Retention
(``max_checkpoints``) evicts the oldest checkpoints of a session, whatever their
trigger. Ids are ULIDs, monotonic per session: each new id sorts after every earlier
one of its session, even within one millisecond.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from perdure._fs import atomic_write
from perdure.errors import CheckpointNotFoundError, SessionCorruptedError
from perdure.session._codec import utc_now
from perdure.session.ids import validate_session_id
from perdure.session.ulid import MonotonicUlid, is_ulid
from perdure.types import Message, decode_bytes_values, encode_bytes_values, validate_message
from perdure.types.json import compact_json_bytes

CheckpointTrigger = Literal["manual", "pre_compaction", "pre_restore", "import"]
TRIGGERS: frozenset[str] = frozenset({"manual", "pre_compaction", "pre_restore", "import"})
_FORMAT = "perdure-checkpoint-record/1"


def check_checkpoint_id(checkpoint_id: Any) -> str:
    """Return ``checkpoint_id`` if it is a well-formed ULID.

    Raises:
        ValueError: it is not (a well-formed id that names nothing is
            ``CheckpointNotFoundError`` instead, raised by the operation).
    """
    if not is_ulid(checkpoint_id):
        raise ValueError(f"checkpoint_id {checkpoint_id!r} is not a well-formed ULID")
    return str(checkpoint_id)


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``list_checkpoints`` shows of a checkpoint (SPEC §7)."""

    checkpoint_id: str
    session_id: str
    trigger: CheckpointTrigger
    label: str | None
    message_count: int
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> CheckpointMeta:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        if not isinstance(data, dict):
            raise ValueError("checkpoint meta must be an object")
        expected = {
            "checkpoint_id",
            "session_id",
            "trigger",
            "label",
            "message_count",
            "created_at",
        }
        if set(data) != expected:
            raise ValueError(
                f"checkpoint meta has fields {sorted(data)}, expected {sorted(expected)}"
            )
        if not is_ulid(data["checkpoint_id"]):
            raise ValueError("checkpoint_id is not a ULID")
        validate_session_id(data["session_id"])
        if data["trigger"] not in TRIGGERS:
            raise ValueError(f"unknown trigger {data['trigger']!r}")
        if data["label"] is not None and not isinstance(data["label"], str):
            raise ValueError("label must be a string or null")
        count = data["message_count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("message_count must be an int >= 0")
        if not isinstance(data["created_at"], str):
            raise ValueError("created_at must be a string")
        return cls(**data)


@dataclass
class CheckpointRecord:
    """A whole checkpoint: its meta, the history and the agent's persisted state."""

    meta: CheckpointMeta
    messages: list[Message]
    agent_state: dict[str, Any] = field(default_factory=dict)

    def to_json_bytes(self) -> bytes:
        """Serialise (bytes inside messages encoded as base64 markers).

        Raises:
            ValueError: a value cannot be stored (NaN, infinity).
        """
        return compact_json_bytes(
            {
                "format": _FORMAT,
                "meta": self.meta.to_dict(),
                "messages": encode_bytes_values(self.messages),
                "agent_state": encode_bytes_values(self.agent_state),
            }
        )

    @classmethod
    def from_json_bytes(cls, data: bytes) -> CheckpointRecord:
        """Parse :meth:`to_json_bytes` output.

        Raises:
            ValueError: not a checkpoint record, or a malformed one (never another
                exception type, whatever the damage).
        """
        try:
            return cls._parse(data)
        except ValueError:
            raise
        except (TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise ValueError(f"checkpoint record is malformed: {exc!r}") from None

    @classmethod
    def _parse(cls, data: bytes) -> CheckpointRecord:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"checkpoint record is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
            raise ValueError("not a perdure checkpoint record")
        meta = CheckpointMeta.from_dict(raw.get("meta"))
        messages = decode_bytes_values(raw.get("messages"))
        if not isinstance(messages, list):
            raise ValueError("checkpoint messages must be a list")
        for i, message in enumerate(messages):
            validate_message(message, f"checkpoint message {i}")
        state = decode_bytes_values(raw.get("agent_state", {}))
        if not isinstance(state, dict):
            raise ValueError("checkpoint agent_state must be an object")
        return cls(meta, messages, state)


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoints live. Every coroutine may be awaited from any loop and thread."""

    async def put(self, record: CheckpointRecord) -> None:
        """Store ``record`` durably (then apply retention for its session)."""
        ...

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read one checkpoint.

        Raises:
            CheckpointNotFoundError: no such checkpoint in that session.
        """
        ...

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first."""
        ...

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (absent is fine)."""
        ...


class _IdMaker:
    """Monotonic ULIDs per session, aware of the ids already stored."""

    def __init__(self) -> None:
        self._makers: dict[str, MonotonicUlid] = {}
        self._guard = threading.Lock()

    def new(self, session_id: str, existing: builtins.list[CheckpointMeta]) -> str:
        with self._guard:
            maker = self._makers.setdefault(session_id, MonotonicUlid())
        for meta in existing[-1:]:
            maker.observe(meta.checkpoint_id)
        return maker.new()


_IDS = _IdMaker()


async def new_checkpoint_id(store: CheckpointStore, session_id: str) -> str:
    """A ULID sorting after every checkpoint id ``store`` holds for ``session_id``."""
    return _IDS.new(session_id, await store.list(session_id))


def now_iso() -> str:
    """The current UTC time as ISO-8601 (``…T12:34:56.123456Z``)."""
    return utc_now()


def check_max_checkpoints(max_checkpoints: int | None) -> int | None:
    if max_checkpoints is not None and (
        isinstance(max_checkpoints, bool)
        or not isinstance(max_checkpoints, int)
        or max_checkpoints < 1
    ):
        raise ValueError(f"max_checkpoints must be None or an int >= 1, got {max_checkpoints!r}")
    return max_checkpoints


class FileCheckpointStore:
    """Checkpoints as JSON files, ``<dir>/<session_id>/<checkpoint_id>.json``.

    Args:
        dir: the root directory (created on demand). Its lifecycle is its own: use
            ``FileSessionStore.checkpoints`` for checkpoints deleted with the session.
        max_checkpoints: keep at most this many per session (oldest evicted first).
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        max_checkpoints: int | None = None,
        _layout: Callable[[str], Path] | None = None,
    ) -> None:
        self.root = Path(dir)
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self._layout = _layout or (lambda session_id: self.root / session_id)

    def __repr__(self) -> str:
        return f"FileCheckpointStore({str(self.root)!r})"

    def _dir(self, session_id: str) -> Path:
        return self._layout(validate_session_id(session_id))

    async def put(self, record: CheckpointRecord) -> None:
        """Write the checkpoint file durably, then apply retention."""
        await asyncio.to_thread(self._put, record)

    def _put(self, record: CheckpointRecord) -> None:
        directory = self._dir(record.meta.session_id)
        directory.mkdir(parents=True, exist_ok=True)
        check_checkpoint_id(record.meta.checkpoint_id)
        atomic_write(directory / f"{record.meta.checkpoint_id}.json", record.to_json_bytes())
        if self.max_checkpoints is not None:
            ids = self._ids(directory)
            for stale in ids[: max(0, len(ids) - self.max_checkpoints)]:
                (directory / f"{stale}.json").unlink(missing_ok=True)

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read and check one checkpoint file."""
        check_checkpoint_id(checkpoint_id)
        return await asyncio.to_thread(self._get, session_id, checkpoint_id)

    def _get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        path = self._dir(session_id) / f"{checkpoint_id}.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of session {session_id!r} not found"
            ) from None
        try:
            record = CheckpointRecord.from_json_bytes(data)
        except ValueError as exc:
            raise SessionCorruptedError(
                f"checkpoint file {path} is damaged: {exc}", details={"file": str(path)}
            ) from None
        if (record.meta.session_id, record.meta.checkpoint_id) != (session_id, checkpoint_id):
            raise SessionCorruptedError(f"checkpoint file {path} holds another checkpoint")
        return record

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first."""
        return await asyncio.to_thread(self._list, session_id)

    def _list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        directory = self._dir(session_id)
        return [self._get(session_id, cid).meta for cid in self._ids(directory)]

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint file (idempotent)."""
        check_checkpoint_id(checkpoint_id)
        path = self._dir(session_id) / f"{checkpoint_id}.json"
        await asyncio.to_thread(path.unlink, True)

    @staticmethod
    def _ids(directory: Path) -> builtins.list[str]:
        if not directory.is_dir():
            return []
        return sorted(
            p.stem for p in directory.iterdir() if p.suffix == ".json" and is_ulid(p.stem)
        )


class MemoryCheckpointStore:
    """Checkpoints in a dict, deep-copied in and out (for tests and ephemeral use)."""

    def __init__(self, *, max_checkpoints: int | None = None) -> None:
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self._data: dict[str, dict[str, bytes]] = {}
        self._guard = threading.Lock()

    async def put(self, record: CheckpointRecord) -> None:
        """Store a copy of ``record`` and apply retention."""
        validate_session_id(record.meta.session_id)
        check_checkpoint_id(record.meta.checkpoint_id)
        data = record.to_json_bytes()
        with self._guard:
            session = self._data.setdefault(record.meta.session_id, {})
            session[record.meta.checkpoint_id] = data
            if self.max_checkpoints is not None:
                for stale in sorted(session)[: max(0, len(session) - self.max_checkpoints)]:
                    del session[stale]

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """A copy of one checkpoint."""
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        with self._guard:
            data = self._data.get(session_id, {}).get(checkpoint_id)
        if data is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of session {session_id!r} not found"
            )
        return CheckpointRecord.from_json_bytes(data)

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first."""
        validate_session_id(session_id)
        with self._guard:
            items = sorted(self._data.get(session_id, {}).items())
        return [CheckpointRecord.from_json_bytes(data).meta for _, data in items]

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (idempotent)."""
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        with self._guard:
            self._data.get(session_id, {}).pop(checkpoint_id, None)

    def drop_session(self, session_id: str) -> None:
        """Forget every checkpoint of a session (its store deleted the session)."""
        with self._guard:
            self._data.pop(session_id, None)
