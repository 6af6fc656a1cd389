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
(``max_checkpoints``, ``max_checkpoint_age``) evicts the oldest checkpoints of a
session, whatever their trigger, after each put of that session — the rule of every
store, :func:`~perdure.session.rules.evicted_checkpoints`. Ids are ULIDs, monotonic
per session: each new id sorts after every earlier one of its session, even within
one millisecond.

A stored checkpoint is sealed (SPEC §7.1): :meth:`CheckpointRecord.to_json_bytes`
writes one UTF-8 JSON object::

    {"format":"perdure-checkpoint-record/2","sha256":"<64 hex>","record":<body>}

where ``sha256`` is the digest of the exact bytes of ``<body>`` (the compact JSON
of the meta, the messages and the agent state), and
:meth:`CheckpointRecord.from_json_bytes` checks it before it parses anything, so
every read — ``get``, and through it restore, fork and export — refuses an altered
byte. This is the one hashing rule of every checkpoint store. Checkpoints written
by perdure 0.1 (``perdure-checkpoint-record/1``) carry no hash: they cannot be
checked, so a file or blob store refuses to read them
(:class:`~perdure.errors.SessionCorruptedError`, kind ``unsealed_checkpoint``)
until ``perdure repair --apply`` seals them; the SQLite store still reads its old
rows, whose body hash lives in their own column.

With a ``cipher`` (SPEC §9) the body's history and state are one envelope::

    {"meta":<meta>,"sealed":"<base64 of the cipher's envelope of {"messages":…,"agent_state":…}>"}

and the sha256 covers those bytes — the ciphertext — so damage is still found
without the key; the meta (ids, trigger, label, count, time) stays readable for
``list``. A sealed checkpoint read without a cipher, or with the wrong key, raises
:class:`~perdure.errors.DecryptionError`.

A damaged checkpoint never hides the others: :func:`scan_checkpoints` lists a
session's checkpoints with the damaged ones marked (:class:`DamagedCheckpoint`),
and ``delete`` removes a damaged one like any other.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from perdure._runtime.checks import check_path
from perdure._runtime.fs import atomic_write
from perdure._runtime.threads import ProcessLock
from perdure.crypto import Cipher
from perdure.errors import CheckpointNotFoundError, DecryptionError, SessionCorruptedError
from perdure.session.ids import validate_session_id
from perdure.session.rules import (
    blob_hash,
    check_cipher,
    check_max_checkpoint_age,
    check_max_checkpoints,
    evicted_checkpoints,
    utc_now,
)
from perdure.session.ulid import MonotonicUlid, is_ulid
from perdure.types import Message, decode_bytes_values, encode_bytes_values, validate_message
from perdure.types.json import compact_json_bytes

CheckpointTrigger = Literal["manual", "pre_compaction", "pre_restore", "import"]
TRIGGERS: frozenset[str] = frozenset({"manual", "pre_compaction", "pre_restore", "import"})
_FORMAT = "perdure-checkpoint-record/2"
_LEGACY_FORMAT = "perdure-checkpoint-record/1"  # perdure 0.1: no hash
# A sealed record is these bytes, the body's sha256 (64 hex digits), _MIDDLE, the
# body, and "}": the digest covers the body byte for byte, with no re-encoding.
_HEAD = b'{"format":"' + _FORMAT.encode("ascii") + b'","sha256":"'
_MIDDLE = b'","record":'
_DIGEST_LEN = 64
_BODY_KEYS = frozenset({"meta", "messages", "agent_state"})
_SEALED_KEYS = frozenset({"meta", "sealed"})


class UnsealedCheckpointError(ValueError):
    """A checkpoint record written without a sha256 (perdure 0.1): it cannot be checked."""


def seal_checkpoint_bytes(data: bytes) -> bytes:
    """Re-write a record that :meth:`CheckpointRecord.from_json_bytes` accepts, sealed.

    Used by ``repair`` to seal checkpoints written by perdure 0.1 once someone chose
    to trust them: the content is kept as it is, and from then on any change to it
    is detected.

    Raises:
        ValueError: ``data`` is not a checkpoint record (sealed or not).
    """
    return CheckpointRecord.from_json_bytes(data, unsealed_ok=True).to_json_bytes()


def checkpoint_damage_kind(exc: ValueError) -> str:
    """The damage ``kind`` a store reports for a record ``from_json_bytes`` refused."""
    return "unsealed_checkpoint" if isinstance(exc, UnsealedCheckpointError) else "bad_checkpoint"


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

    def to_json_bytes(self, cipher: Cipher | None = None) -> bytes:
        """Serialise as a sealed record: the body and its sha256 (see the module).

        Bytes inside messages and state are encoded as base64 markers. With
        ``cipher`` the messages and state are encrypted (a fresh nonce each call).

        Raises:
            ValueError: a value cannot be stored (NaN, infinity).
        """
        content = {
            "messages": encode_bytes_values(self.messages),
            "agent_state": encode_bytes_values(self.agent_state),
        }
        if cipher is None:
            body = compact_json_bytes({"meta": self.meta.to_dict(), **content})
        else:
            envelope = cipher.encrypt(compact_json_bytes(content))
            sealed = base64.b64encode(envelope).decode("ascii")
            body = compact_json_bytes({"meta": self.meta.to_dict(), "sealed": sealed})
        digest = hashlib.sha256(body).hexdigest().encode("ascii")
        return b"".join((_HEAD, digest, _MIDDLE, body, b"}"))

    @classmethod
    def from_json_bytes(
        cls, data: bytes, *, unsealed_ok: bool = False, cipher: Cipher | None = None
    ) -> CheckpointRecord:
        """Check and parse :meth:`to_json_bytes` output.

        The body's sha256 is checked before anything is parsed: a record whose bytes
        changed in any way is refused.

        Args:
            data: the stored bytes.
            unsealed_ok: also accept a perdure 0.1 record, which has no hash — only
                for a caller that checked its bytes another way (the SQLite store's
                hash column) or that was told to trust it (``repair`` sealing it).
            cipher: opens an encrypted record (a plain one reads without it).

        Raises:
            DecryptionError: an encrypted record and no cipher, or one that cannot
                open it (checked after the sha256: damage is still damage).
            UnsealedCheckpointError: a perdure 0.1 record, and ``unsealed_ok`` is
                false (a ``ValueError``).
            ValueError: not a checkpoint record, or a damaged or malformed one
                (never another exception type, whatever the damage).
        """
        try:
            return cls._parse(bytes(data), unsealed_ok, cipher)
        except (ValueError, DecryptionError):
            raise
        except (TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise ValueError(f"checkpoint record is malformed: {exc!r}") from None

    @classmethod
    def _parse(cls, data: bytes, unsealed_ok: bool, cipher: Cipher | None) -> CheckpointRecord:
        if data.startswith(_HEAD):
            raw = _unseal(data)
            if isinstance(raw, dict) and set(raw) == _SEALED_KEYS:
                raw = {"meta": raw["meta"], **_decrypt_content(raw["sealed"], cipher)}
        else:
            try:
                raw = json.loads(data)
            except ValueError as exc:
                raise ValueError(f"checkpoint record is not JSON: {exc}") from exc
            if not isinstance(raw, dict) or raw.get("format") != _LEGACY_FORMAT:
                raise ValueError("not a perdure checkpoint record")
            if not unsealed_ok:
                raise UnsealedCheckpointError(
                    f"checkpoint record is {_LEGACY_FORMAT} (perdure 0.1), written without a "
                    "sha256, so its content cannot be checked; `perdure repair --apply` seals "
                    "it if you trust it"
                )
            del raw["format"]
            raw.setdefault("agent_state", {})
        if set(raw) != _BODY_KEYS:
            raise ValueError(f"checkpoint record has fields {sorted(raw)}")
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


def stored_meta(data: bytes) -> CheckpointMeta:
    """The meta of a stored (sealed) checkpoint, its sha256 checked; the content is
    not opened, so an encrypted checkpoint needs no key here.

    Raises:
        ValueError: not a sealed checkpoint record, or a damaged one.
    """
    try:
        raw = _unseal(bytes(data)) if bytes(data).startswith(_HEAD) else None
        if not isinstance(raw, dict):
            raise ValueError("not a sealed perdure checkpoint record")
        return CheckpointMeta.from_dict(raw.get("meta"))
    except (TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise ValueError(f"checkpoint record is malformed: {exc!r}") from None


def check_stored_meta(
    data: bytes, session_id: str, checkpoint_id: str, damaged: Callable[[str], Exception]
) -> None:
    """Raise ``damaged(...)`` when a stored (encrypted) checkpoint names another one.

    What an encrypted checkpoint read without its key can still be checked for:
    its meta is in clear, under its sha256.
    """
    meta = stored_meta(data)
    if (meta.session_id, meta.checkpoint_id) != (session_id, checkpoint_id):
        raise damaged("it holds another checkpoint")


def _decrypt_content(sealed: Any, cipher: Cipher | None) -> dict[str, Any]:
    """The ``messages`` and ``agent_state`` of an encrypted checkpoint body."""
    if not isinstance(sealed, str):
        raise ValueError("checkpoint record's sealed content is not a string")
    try:
        envelope = base64.b64decode(sealed, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("checkpoint record's sealed content is not base64") from None
    if cipher is None:
        raise DecryptionError(
            "the checkpoint is encrypted and no cipher was given: pass cipher=",
            details={"reason": "no_cipher"},
        )
    content = json.loads(cipher.decrypt(envelope))
    if not isinstance(content, dict) or set(content) != {"messages", "agent_state"}:
        raise ValueError("checkpoint record's sealed content is malformed")
    return content


def verified_record(
    body: bytes,
    stored_hash: str,
    meta: CheckpointMeta,
    damaged: Callable[[str], Exception],
    *,
    meta_where: str = "the row's",
    unsealed_ok: bool = False,
    cipher: Cipher | None = None,
) -> CheckpointRecord:
    """The checkpoint a row store kept as ``body`` with ``stored_hash`` and ``meta``.

    The one read check of the stores that keep a checkpoint's body beside its hash
    (SQLite, PostgreSQL, Redis): the body must match its hash, parse, and hold the
    stored meta; otherwise ``damaged(detail)`` is raised.
    """
    if blob_hash(body) != stored_hash:
        raise damaged("the body does not match its hash")
    try:
        record = CheckpointRecord.from_json_bytes(body, unsealed_ok=unsealed_ok, cipher=cipher)
    except DecryptionError:
        if stored_meta(body) != meta:  # checked without the key, like the hash
            raise damaged(f"the body's meta does not match {meta_where}") from None
        raise
    except (TypeError, ValueError, RecursionError) as exc:
        raise damaged(str(exc)) from None
    if record.meta != meta:
        raise damaged(f"the body's meta does not match {meta_where}")
    return record


def _unseal(data: bytes) -> Any:
    """The parsed body of a sealed record, once its sha256 matched its bytes."""
    start = len(_HEAD) + _DIGEST_LEN + len(_MIDDLE)
    digest = data[len(_HEAD) : len(_HEAD) + _DIGEST_LEN]
    if data[start - len(_MIDDLE) : start] != _MIDDLE or not data.endswith(b"}"):
        raise ValueError("checkpoint record is not laid out as written (it was altered)")
    body = data[start:-1]
    if hashlib.sha256(body).hexdigest().encode("ascii") != digest:
        raise ValueError(
            "checkpoint record does not match its sha256 (its content was altered or damaged)"
        )
    try:
        raw = json.loads(body)
    except ValueError as exc:  # the hash matched: a writer's bug or a deliberate edit
        raise ValueError(f"checkpoint record is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError("checkpoint record body is not an object")
    return raw


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoints live. Every coroutine may be awaited from any loop and thread."""

    async def put(self, record: CheckpointRecord) -> None:
        """Store ``record`` durably (then apply retention for its session)."""
        ...

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read and check one checkpoint.

        Raises:
            CheckpointNotFoundError: no such checkpoint in that session.
            SessionCorruptedError: it is damaged (its content does not match its
                sha256, or it cannot be parsed); ``details`` name it.
        """
        ...

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first.

        Raises:
            SessionCorruptedError: one is too damaged to list (see
                :func:`scan_checkpoints` for a list that marks it instead).
        """
        ...

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (absent is fine), damaged or not."""
        ...


@runtime_checkable
class ListsCheckpointIds(Protocol):
    """A checkpoint store that can name its checkpoints without reading them.

    Every store shipped with perdure is one; :func:`scan_checkpoints` and
    :func:`new_checkpoint_id` use it so that one damaged checkpoint neither hides
    the others nor blocks new ones.
    """

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """The id of every checkpoint stored for the session, damaged or not, oldest first."""
        ...


@runtime_checkable
class ListsCheckpointSessions(Protocol):
    """A checkpoint store that can name the sessions it holds checkpoints of.

    A checkpoint store of its own (``FileCheckpointStore``, ``MemoryCheckpointStore``,
    ``StorageCheckpointStore``, ``PostgresCheckpointStore``) keeps checkpoints after
    their session's log is gone — the seed-004 layout, where Redis expires the log
    — so :func:`~perdure.maintenance.gc_checkpoints` walks the sessions it names.
    """

    async def checkpoint_sessions(self) -> builtins.list[str]:
        """Every session id with at least one checkpoint stored, sorted."""
        ...


@dataclass(frozen=True)
class DamagedCheckpoint:
    """A stored checkpoint that cannot be read, as :func:`scan_checkpoints` lists it.

    Attributes:
        session_id: its session.
        checkpoint_id: its id (from its file name, key or row).
        error: what ``get`` raised; ``error.details`` say where it is.
    """

    session_id: str
    checkpoint_id: str
    error: SessionCorruptedError

    @property
    def kind(self) -> str:
        """``bad_checkpoint``, ``unsealed_checkpoint`` or the store's own kind."""
        kind = self.error.details.get("kind")
        return kind if isinstance(kind, str) else "bad_checkpoint"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the error as its code and message)."""
        return {
            "checkpoint_id": self.checkpoint_id,
            "session_id": self.session_id,
            "damaged": True,
            "kind": self.kind,
            "error": {"code": self.error.code, "message": self.error.message},
        }


async def scan_checkpoints(
    store: CheckpointStore, session_id: str
) -> builtins.list[CheckpointMeta | DamagedCheckpoint]:
    """The session's checkpoints, oldest first, with the damaged ones marked.

    Every checkpoint is read and checked with ``get`` (a ``list`` may read no
    bodies, as SQLite's does, and would vouch for a damaged one): this is the
    listing for maintenance and the command line, not for a hot path. A store that
    names its checkpoints without reading them (:class:`ListsCheckpointIds`) names
    them all, damaged or not; another is asked for its ``list``.

    Raises:
        SessionCorruptedError: the store cannot name its checkpoints: its ``list``
            fails and it is no :class:`ListsCheckpointIds`.
    """
    found: builtins.list[CheckpointMeta | DamagedCheckpoint] = []
    for checkpoint_id in await checkpoint_names(store, session_id):
        try:
            found.append((await get_named_checkpoint(store, session_id, checkpoint_id)).meta)
        except CheckpointNotFoundError:
            continue  # deleted meanwhile
        except SessionCorruptedError as exc:
            found.append(DamagedCheckpoint(session_id, checkpoint_id, exc))
    return found


async def checkpoint_names(store: CheckpointStore, session_id: str) -> builtins.list[str]:
    """The ids of the session's checkpoints, oldest first, damaged ones included when
    the store can name them without reading them (:class:`ListsCheckpointIds`)."""
    if isinstance(store, ListsCheckpointIds):
        return await store.checkpoint_ids(session_id)
    return [meta.checkpoint_id for meta in await store.list(session_id)]


async def get_named_checkpoint(
    store: CheckpointStore, session_id: str, checkpoint_id: str
) -> CheckpointRecord:
    """``store.get`` of an id the store itself named (``checkpoint_ids``, ``list``).

    Such an id comes from stored bytes, so one that is no ULID is damage, not a
    caller's mistake: ``SessionCorruptedError`` rather than ``get``'s ``ValueError``.
    """
    if not is_ulid(checkpoint_id):
        raise SessionCorruptedError(
            f"a checkpoint of session {session_id!r} is stored under the malformed id "
            f"{checkpoint_id!r}",
            details={
                "kind": "bad_checkpoint",
                "session_id": session_id,
                "checkpoint_id": checkpoint_id,
            },
        )
    return await store.get(session_id, checkpoint_id)


class _IdMaker:
    """Monotonic ULIDs per session, aware of the ids already stored."""

    def __init__(self) -> None:
        self._makers: dict[str, MonotonicUlid] = {}
        self._guard = ProcessLock()

    def new(self, session_id: str, existing: builtins.list[str]) -> str:
        with self._guard:
            maker = self._makers.setdefault(session_id, MonotonicUlid())
        # A damaged stored id (no ULID) orders nothing.
        for checkpoint_id in [i for i in existing if is_ulid(i)][-1:]:
            maker.observe(checkpoint_id)
        return maker.new()


_IDS = _IdMaker()


async def new_checkpoint_id(store: CheckpointStore, session_id: str) -> str:
    """A ULID sorting after every checkpoint id ``store`` holds for ``session_id``.

    Damaged checkpoints count too, and do not stop a new one from being made.
    """
    if isinstance(store, ListsCheckpointIds):
        existing = await store.checkpoint_ids(session_id)
    else:
        existing = [meta.checkpoint_id for meta in await store.list(session_id)]
    return _IDS.new(session_id, existing)


def now_iso() -> str:
    """The current UTC time as ISO-8601 (``…T12:34:56.123456Z``)."""
    return utc_now()


class FileCheckpointStore:
    """Checkpoints as JSON files, ``<dir>/<session_id>/<checkpoint_id>.json``.

    Each file is one sealed record (see the module), written durably (temp file,
    fsync, rename), and checked against its sha256 on every read.

    Args:
        dir: the root directory (created on demand). Its lifecycle is its own: use
            ``FileSessionStore.checkpoints`` for checkpoints deleted with the session.
        max_checkpoints: keep at most this many per session (oldest evicted first).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        cipher: keeps each checkpoint's history and state encrypted (SPEC §9).
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        max_checkpoints: int | None = None,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
        _layout: Callable[[str], Path] | None = None,
        _sessions_root: Path | None = None,
    ) -> None:
        self.root = check_path("dir", dir)
        self.cipher = check_cipher(cipher)
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self.max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
        self._layout = _layout or (lambda session_id: self.root / session_id)
        # The directory whose entries are named by session id (see checkpoint_sessions).
        self._sessions_root = self.root if _sessions_root is None else _sessions_root

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
        data = record.to_json_bytes(self.cipher)
        atomic_write(directory / f"{record.meta.checkpoint_id}.json", data)
        if self.max_checkpoints is not None or self.max_checkpoint_age is not None:
            for stale in evicted_checkpoints(
                self._ids(directory), self.max_checkpoints, self.max_checkpoint_age
            ):
                (directory / f"{stale}.json").unlink(missing_ok=True)

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read one checkpoint file and check it against its sha256.

        Raises:
            ValueError: ``session_id`` or ``checkpoint_id`` is malformed.
            CheckpointNotFoundError: no such file.
            SessionCorruptedError: the file is damaged, unsealed (perdure 0.1) or
                holds another checkpoint; the message and ``details["file"]`` name it.
        """
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
        except OSError as exc:  # a directory in its place, EIO, EACCES: it cannot be read
            raise _file_damage(path, session_id, checkpoint_id, "unreadable", exc) from None
        try:
            record = CheckpointRecord.from_json_bytes(data, cipher=self.cipher)
        except ValueError as exc:
            kind = checkpoint_damage_kind(exc)
            raise _file_damage(path, session_id, checkpoint_id, kind, exc) from None
        except DecryptionError:
            check_stored_meta(
                data,
                session_id,
                checkpoint_id,
                lambda detail: _file_damage(
                    path, session_id, checkpoint_id, "bad_checkpoint", detail
                ),
            )
            raise
        if (record.meta.session_id, record.meta.checkpoint_id) != (session_id, checkpoint_id):
            raise _file_damage(
                path, session_id, checkpoint_id, "bad_checkpoint", "it holds another checkpoint"
            )
        return record

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first (every file is read and checked).

        Raises:
            SessionCorruptedError: a file is damaged (:func:`scan_checkpoints` lists
                the others and marks it instead).
        """
        return await asyncio.to_thread(self._list, session_id)

    def _list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        metas: builtins.list[CheckpointMeta] = []
        for checkpoint_id in self._ids(self._dir(session_id)):
            try:
                metas.append(self._get(session_id, checkpoint_id).meta)
            except CheckpointNotFoundError:
                continue  # deleted while the list ran
        return metas

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint file (idempotent), whatever its content."""
        check_checkpoint_id(checkpoint_id)
        await asyncio.to_thread(self.checkpoint_path(session_id, checkpoint_id).unlink, True)

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """Every checkpoint id of the session, oldest first, from file names alone."""
        return await asyncio.to_thread(self._ids, self._dir(session_id))

    async def checkpoint_sessions(self) -> builtins.list[str]:
        """Every session id with at least one checkpoint file, sorted."""
        return await asyncio.to_thread(self._sessions)

    def _sessions(self) -> builtins.list[str]:
        if not self._sessions_root.is_dir():
            return []
        found = []
        for entry in self._sessions_root.iterdir():
            try:
                directory = self._dir(entry.name)
            except ValueError:
                continue  # not named by a session id: not a session's
            if self._ids(directory):
                found.append(entry.name)
        return sorted(found)

    def checkpoint_path(self, session_id: str, checkpoint_id: str) -> Path:
        """The file that holds (or would hold) a checkpoint.

        Raises:
            ValueError: ``session_id`` or ``checkpoint_id`` is malformed.
        """
        return self._dir(session_id) / f"{check_checkpoint_id(checkpoint_id)}.json"

    @staticmethod
    def _ids(directory: Path) -> builtins.list[str]:
        if not directory.is_dir():
            return []
        return sorted(
            p.stem for p in directory.iterdir() if p.suffix == ".json" and is_ulid(p.stem)
        )


def _file_damage(
    path: Path, session_id: str, checkpoint_id: str, kind: str, detail: object
) -> SessionCorruptedError:
    return SessionCorruptedError(
        f"checkpoint file {path} is damaged: {detail}",
        details={
            "session_id": session_id,
            "checkpoint_id": checkpoint_id,
            "file": str(path),
            "kind": kind,
        },
    )


class MemoryCheckpointStore:
    """Checkpoints in a dict, deep-copied in and out (for tests and ephemeral use).

    Args:
        max_checkpoints: keep at most this many per session (oldest evicted first).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        cipher: keeps each checkpoint's history and state encrypted (SPEC §9).
    """

    def __init__(
        self,
        *,
        max_checkpoints: int | None = None,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self.max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
        self._data: dict[str, dict[str, bytes]] = {}
        self._guard = ProcessLock()

    async def put(self, record: CheckpointRecord) -> None:
        """Store a copy of ``record`` and apply retention."""
        validate_session_id(record.meta.session_id)
        check_checkpoint_id(record.meta.checkpoint_id)
        data = record.to_json_bytes(self.cipher)
        with self._guard:
            session = self._data.setdefault(record.meta.session_id, {})
            session[record.meta.checkpoint_id] = data
            for stale in evicted_checkpoints(
                list(session), self.max_checkpoints, self.max_checkpoint_age
            ):
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
        return CheckpointRecord.from_json_bytes(data, cipher=self.cipher)

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first."""
        validate_session_id(session_id)
        with self._guard:
            items = sorted(self._data.get(session_id, {}).items())
        return [
            CheckpointRecord.from_json_bytes(data, cipher=self.cipher).meta for _, data in items
        ]

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (idempotent)."""
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        with self._guard:
            self._data.get(session_id, {}).pop(checkpoint_id, None)

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """Every checkpoint id of the session, oldest first."""
        validate_session_id(session_id)
        with self._guard:
            return sorted(self._data.get(session_id, {}))

    async def checkpoint_sessions(self) -> builtins.list[str]:
        """Every session id with at least one checkpoint, sorted."""
        with self._guard:
            return sorted(sid for sid, held in self._data.items() if held)

    def drop_session(self, session_id: str) -> None:
        """Forget every checkpoint of a session (its store deleted the session)."""
        with self._guard:
            self._data.pop(session_id, None)
