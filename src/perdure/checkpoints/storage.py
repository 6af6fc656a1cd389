"""StorageCheckpointStore: checkpoints over any byte-blob :class:`~perdure.storage.Storage`.

Each checkpoint is one blob, its
:meth:`~perdure.checkpoints.store.CheckpointRecord.to_json_bytes`, under the key::

    <prefix>/<session_id>/<checkpoint_id>

Checkpoint ids are ULIDs of one length, so the sorted keys that ``Storage.list``
returns are the session's checkpoints oldest first. Keys under the session's prefix
whose last segment is not a ULID are not checkpoints and are ignored.

Guarantees: a put is one ``Storage.write``, atomic and durable on a durable backend
(:class:`~perdure.storage.LocalFileStorage`, :class:`~perdure.storage.SQLiteStorage`).
Retention (``max_checkpoints``, ``max_checkpoint_age``) runs after the write, one
``delete`` per evicted checkpoint, oldest first: ``Storage`` has no transactions, so
a crash in between leaves more checkpoints than the limit (never fewer, never a
partial one) until the next put of that session evicts them. Every blob is a sealed record checked
against its sha256 on every read: a damaged blob (or one written by perdure 0.1,
without a hash) raises :class:`~perdure.errors.SessionCorruptedError` on ``get``
and ``list``; :func:`~perdure.checkpoints.store.scan_checkpoints` lists the
others with it marked, and ``delete`` removes it. Every coroutine may be awaited
from any loop and thread, as the backend's own.
"""

from __future__ import annotations

import builtins
from typing import Any

from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    check_checkpoint_id,
    check_stored_meta,
    checkpoint_damage_kind,
)
from perdure.crypto import Cipher
from perdure.errors import CheckpointNotFoundError, DecryptionError, SessionCorruptedError
from perdure.session.ids import validate_session_id
from perdure.session.rules import (
    check_cipher,
    check_max_checkpoint_age,
    check_max_checkpoints,
    evicted_checkpoints,
)
from perdure.session.ulid import is_ulid
from perdure.storage import Storage, validate_key

__all__ = ["StorageCheckpointStore"]


class StorageCheckpointStore:
    """A :class:`~perdure.checkpoints.store.CheckpointStore` over a ``Storage``.

    Args:
        storage: where the blobs live (see the module for the key layout).
        prefix: the first key segments, shared by every session (a valid key such as
            ``"checkpoints"`` or ``"app/checkpoints"``).
        max_checkpoints: keep at most this many per session (oldest evicted first,
            whatever their trigger).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        cipher: keeps each checkpoint's history and state encrypted inside its
            sealed record (SPEC §9; the record's sha256 covers the ciphertext).

    Raises:
        TypeError: ``storage`` is not a ``Storage``, or ``prefix`` not a ``str``.
        ValueError: ``prefix`` is not a valid key, ``max_checkpoints`` is not
            ``None`` or an int >= 1, or ``max_checkpoint_age`` not ``None`` or
            seconds > 0.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        prefix: str = "checkpoints",
        max_checkpoints: int | None = None,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(storage).__name__}")
        self.storage = storage
        self.prefix = validate_key(prefix, "prefix")
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self.max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)

    def __repr__(self) -> str:
        return f"StorageCheckpointStore({self.storage!r}, prefix={self.prefix!r})"

    def _session_prefix(self, session_id: str) -> str:
        return f"{self.prefix}/{validate_session_id(session_id)}/"

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """Every checkpoint id of the session, oldest first, from the keys alone."""
        return await self._ids(session_id)

    async def _ids(self, session_id: str) -> builtins.list[str]:
        """The session's checkpoint ids, oldest first."""
        base = self._session_prefix(session_id)
        keys = await self.storage.list(base)
        # Only direct children named by a ULID are checkpoints.
        return [key[len(base) :] for key in keys if is_ulid(key[len(base) :])]

    async def checkpoint_sessions(self) -> builtins.list[str]:
        """Every session id with at least one checkpoint, sorted, from the keys alone."""
        base = f"{self.prefix}/"
        found = set()
        for key in await self.storage.list(base):
            session_id, _, checkpoint_id = key[len(base) :].partition("/")
            if is_ulid(checkpoint_id):
                found.add(session_id)
        return sorted(found)

    async def put(self, record: CheckpointRecord) -> None:
        """Write the checkpoint's blob (replacing one with its id), then apply retention.

        Raises:
            TypeError, ValueError: ``record`` is not a well-formed checkpoint record
                (nothing is written).
        """
        if not isinstance(record, CheckpointRecord):
            raise TypeError(f"record must be a CheckpointRecord, got {type(record).__name__}")
        meta = CheckpointMeta.from_dict(record.meta.to_dict())
        data = record.to_json_bytes(self.cipher)
        base = self._session_prefix(meta.session_id)
        await self.storage.write(base + meta.checkpoint_id, data)
        if self.max_checkpoints is not None or self.max_checkpoint_age is not None:
            ids = await self._ids(meta.session_id)
            for stale in evicted_checkpoints(ids, self.max_checkpoints, self.max_checkpoint_age):
                await self.storage.delete(base + stale)

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read and check one checkpoint.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
            CheckpointNotFoundError: no such checkpoint in that session.
            SessionCorruptedError: its blob is damaged or holds another checkpoint.
        """
        check_checkpoint_id(checkpoint_id)
        record = await self._read(session_id, checkpoint_id)
        if record is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of session {session_id!r} not found "
                f"in {self.storage!r}"
            )
        return record

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first (reads every blob of the session).

        A checkpoint deleted while the list runs is left out.

        Raises:
            SessionCorruptedError: a blob is damaged.
        """
        metas: builtins.list[CheckpointMeta] = []
        for checkpoint_id in await self._ids(session_id):
            record = await self._read(session_id, checkpoint_id)
            if record is not None:
                metas.append(record.meta)
        return metas

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (absent is fine), damaged or not.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
        """
        check_checkpoint_id(checkpoint_id)
        await self.storage.delete(self._session_prefix(session_id) + checkpoint_id)

    async def _read(self, session_id: str, checkpoint_id: str) -> CheckpointRecord | None:
        key = self._session_prefix(session_id) + checkpoint_id
        data = await self.storage.read(key)
        if data is None:
            return None
        try:
            record = CheckpointRecord.from_json_bytes(data, cipher=self.cipher)
        except ValueError as exc:
            kind = checkpoint_damage_kind(exc)
            raise self._damage(key, session_id, checkpoint_id, str(exc), kind) from None
        except DecryptionError:
            check_stored_meta(
                data,
                session_id,
                checkpoint_id,
                lambda detail: self._damage(key, session_id, checkpoint_id, detail),
            )
            raise
        if (record.meta.session_id, record.meta.checkpoint_id) != (session_id, checkpoint_id):
            raise self._damage(key, session_id, checkpoint_id, "it holds another checkpoint")
        return record

    def _damage(
        self,
        key: str,
        session_id: str,
        checkpoint_id: str,
        detail: str,
        kind: str = "bad_checkpoint",
    ) -> SessionCorruptedError:
        details: dict[str, Any] = {
            "session_id": session_id,
            "checkpoint_id": checkpoint_id,
            "key": key,
            "kind": kind,
        }
        return SessionCorruptedError(
            f"checkpoint {checkpoint_id} of session {session_id!r} in {self.storage!r} "
            f"is damaged (key {key!r}): {detail}",
            details=details,
        )
