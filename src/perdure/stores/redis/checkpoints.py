"""Checkpoints of a :class:`~.sessions.RedisSessionStore`, in Redis (SPEC §7).

Per session, two hashes with the session's hash tag: ``…{id}:cm`` maps a checkpoint
id to its meta (JSON), so that ``list`` reads no body, and ``…{id}:cb`` to the
sealed record (:meth:`~perdure.checkpoints.store.CheckpointRecord.to_json_bytes`)
behind its hash (:func:`~perdure.session.rules.blob_hash`). Reads check that hash,
the seal, and that the body's meta is the stored one: a value changed behind the store's back raises
:class:`~perdure.errors.SessionCorruptedError` naming the checkpoint. A put and its
retention (``max_checkpoint_age``, then ``max_checkpoints``: the rule of
:func:`~perdure.session.rules.evicted_checkpoints`, the age given to the script as
:func:`~perdure.session.rules.checkpoint_age_cutoff`) are one script. Checkpoints
expire with a session that has a ``ttl`` (SPEC §9: every key of a session
together; a put gives them the session's time left, every renewal renews them);
give the ``Session`` a ``checkpoints=`` store to keep them past it. They are
deleted with their session, or when its id is created again after a delete.
"""

from __future__ import annotations

import builtins
import functools
import json
from typing import Any

from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    check_checkpoint_id,
    verified_record,
)
from perdure.crypto import Cipher
from perdure.errors import CheckpointNotFoundError, SessionCorruptedError
from perdure.session.ids import validate_session_id
from perdure.session.rules import HASH_LEN, blob_hash, checkpoint_age_cutoff
from perdure.stores.redis._client import Connection, PerLoop
from perdure.stores.redis._keys import UNAVAILABLE, keys_of, translate

__all__ = ["RedisCheckpointStore"]

_HEX = HASH_LEN  # the hash (blob_hash) before a body


class RedisCheckpointStore:
    """The checkpoints beside a Redis session store (see the module docstring)."""

    def __init__(
        self,
        clients: PerLoop,
        prefix: str,
        server: str,
        max_checkpoints: int | None,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = cipher
        self._clients = clients
        self._prefix = prefix
        self._server = server
        self.max_checkpoints = max_checkpoints
        self.max_checkpoint_age = max_checkpoint_age

    def __repr__(self) -> str:
        return f"RedisCheckpointStore({self._server!r}, prefix={self._prefix!r})"

    async def _conn(self, doing: str) -> Connection:
        try:
            return await self._clients.get()
        except UNAVAILABLE as exc:
            raise translate(exc, self._server, doing) from exc

    async def put(self, record: CheckpointRecord) -> None:
        """Store ``record`` (replacing one with its id), then apply retention; one script.

        Raises:
            TypeError, ValueError: ``record`` is not a well-formed checkpoint record.
        """
        if not isinstance(record, CheckpointRecord):
            raise TypeError(f"record must be a CheckpointRecord, got {type(record).__name__}")
        meta = CheckpointMeta.from_dict(record.meta.to_dict())
        body = record.to_json_bytes(self.cipher)
        keys = keys_of(self._prefix, meta.session_id)
        meta_text = json.dumps(meta.to_dict(), ensure_ascii=True, separators=(",", ":"))
        doing = "storing a checkpoint"
        conn = await self._conn(doing)
        try:
            await conn.put_checkpoint(
                [keys.cp_meta, keys.cp_body, keys.head],
                [
                    meta.checkpoint_id,
                    meta_text,
                    blob_hash(body).encode("ascii") + body,
                    self.max_checkpoints or 0,
                    checkpoint_age_cutoff(self.max_checkpoint_age) or "",
                ],
            )
        except Exception as exc:
            raise translate(exc, self._server, doing) from exc

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read and verify one checkpoint.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
            CheckpointNotFoundError: no such checkpoint in that session.
            SessionCorruptedError: it is damaged.
        """
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        keys = keys_of(self._prefix, session_id)
        doing = "reading a checkpoint"
        conn = await self._conn(doing)
        try:
            async with conn.client.pipeline(transaction=True) as pipe:
                pipe.hget(keys.cp_meta, checkpoint_id)
                pipe.hget(keys.cp_body, checkpoint_id)
                meta_text, stored = await pipe.execute()
        except Exception as exc:
            raise translate(exc, self._server, doing) from exc
        if meta_text is None and stored is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of session {session_id!r} not found "
                f"in the Redis store at {self._server}"
            )
        if meta_text is None:
            raise self._damage(session_id, checkpoint_id, "its meta is missing")
        meta = self._meta(session_id, checkpoint_id, meta_text)
        if stored is None:
            raise self._damage(session_id, checkpoint_id, "its body is missing")
        return verified_record(
            bytes(stored[_HEX:]),
            bytes(stored[:_HEX]).decode("latin-1"),
            meta,
            functools.partial(self._damage, session_id, checkpoint_id),
            meta_where="the stored meta",
            cipher=self.cipher,
        )

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first (reads no body).

        Raises:
            SessionCorruptedError: a stored meta is damaged.
        """
        validate_session_id(session_id)
        keys = keys_of(self._prefix, session_id)
        doing = "listing checkpoints"
        conn = await self._conn(doing)
        try:
            found = await conn.client.hgetall(keys.cp_meta)
        except Exception as exc:
            raise translate(exc, self._server, doing) from exc
        return [self._meta(session_id, _text(cid), found[cid]) for cid in sorted(found)]

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """Every checkpoint id of the session, oldest first, damaged or not."""
        validate_session_id(session_id)
        keys = keys_of(self._prefix, session_id)
        doing = "listing checkpoints"
        conn = await self._conn(doing)
        try:
            async with conn.client.pipeline(transaction=True) as pipe:
                pipe.hkeys(keys.cp_meta)
                pipe.hkeys(keys.cp_body)
                metas, bodies = await pipe.execute()
        except Exception as exc:
            raise translate(exc, self._server, doing) from exc
        return sorted({_text(k) for k in [*metas, *bodies]})

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (absent is fine), damaged or not.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
        """
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        keys = keys_of(self._prefix, session_id)
        doing = "deleting a checkpoint"
        conn = await self._conn(doing)
        try:
            async with conn.client.pipeline(transaction=True) as pipe:
                pipe.hdel(keys.cp_meta, checkpoint_id)
                pipe.hdel(keys.cp_body, checkpoint_id)
                await pipe.execute()
        except Exception as exc:
            raise translate(exc, self._server, doing) from exc

    def _meta(self, session_id: str, checkpoint_id: str, text: Any) -> CheckpointMeta:
        try:
            meta = CheckpointMeta.from_dict(json.loads(text))
        except (TypeError, ValueError, RecursionError) as exc:
            raise self._damage(session_id, checkpoint_id, f"its meta: {exc}") from None
        if (meta.session_id, meta.checkpoint_id) != (session_id, checkpoint_id):
            raise self._damage(session_id, checkpoint_id, "its meta names another checkpoint")
        return meta

    def _damage(self, session_id: str, checkpoint_id: str, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} is damaged (Redis store at {self._server}): checkpoint "
            f"{checkpoint_id}: {detail}",
            details={
                "session_id": session_id,
                "server": self._server,
                "kind": "bad_checkpoint",
                "checkpoint_id": checkpoint_id,
            },
        )


def _text(key: Any) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
