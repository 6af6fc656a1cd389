"""PostgresCheckpointStore: checkpoints in a PostgreSQL schema, a row each (SPEC §7).

A row of ``perdure_checkpoints`` (see :mod:`.schema`) holds one sealed record
(:meth:`~perdure.checkpoints.store.CheckpointRecord.to_json_bytes`, itself carrying
the sha256 of its body) as ``bytea``, the hash of those bytes, and the meta as JSON
text so that ``list`` reads no body. Reads check the hash column, the seal and that
the body's meta is the row's: a row changed behind the store's back raises
:class:`~perdure.errors.SessionCorruptedError` naming the session and checkpoint.

The same table serves a :class:`~.sessions.PostgresSessionStore`'s ``checkpoints``
(deleted with their session, wiped when an id is created anew) and a
``PostgresCheckpointStore`` of its own over the same schema: both see the same
checkpoints. Puts are durable like a commit; a put and its retention
(``max_checkpoints``, ``max_checkpoint_age``) are one transaction, serialised per session by a
transaction-level advisory lock, so two puts at once never keep more than the limit.
Every coroutine may be awaited from any loop and any thread.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import weakref
import zlib
from typing import Any

import psycopg

from perdure._runtime.postgres import PostgresDatabase, PostgresErrors
from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    check_checkpoint_id,
    verified_record,
)
from perdure.crypto import Cipher
from perdure.errors import (
    CheckpointNotFoundError,
    SchemaVersionError,
    SessionCorruptedError,
    SessionLockedError,
    StoreUnavailableError,
)
from perdure.session.ids import validate_session_id
from perdure.session.rules import (
    blob_hash,
    check_cipher,
    check_max_checkpoint_age,
    check_max_checkpoints,
    evicted_checkpoints,
)
from perdure.stores.postgres.schema import SESSIONS

__all__ = ["PostgresCheckpointStore"]


def _environment_error(message: str, *, details: dict[str, Any] | None = None) -> OSError:
    del details
    return OSError(message)


_ERRORS = PostgresErrors(
    unavailable=StoreUnavailableError,
    locked=SessionLockedError,
    damage=SessionCorruptedError,
    failure=_environment_error,
    version=SchemaVersionError,
)


class PostgresCheckpointStore:
    """Checkpoints in a PostgreSQL schema (see the module docstring).

    Args:
        dsn: a libpq connection string or URL.
        schema: the schema holding the tables (created on first use).
        max_checkpoints: keep at most this many checkpoints per session (the oldest
            are evicted, whatever their trigger).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        max_connections: most connections the store opens in one process.
        connect_timeout: seconds to wait for a connection.
        reconnect_timeout: seconds an operation waits for a server that went away
            before raising ``StoreUnavailableError`` (as for
            :class:`~perdure.stores.postgres.sessions.PostgresSessionStore`).
        cipher: keeps each checkpoint's history and state encrypted (SPEC §9).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "perdure",
        max_checkpoints: int | None = None,
        max_checkpoint_age: float | None = None,
        max_connections: int = 4,
        connect_timeout: float = 10.0,
        reconnect_timeout: float = 15.0,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        db = PostgresDatabase(
            dsn,
            schema=schema,
            part=SESSIONS,
            errors=_ERRORS,
            what="PostgreSQL checkpoint store",
            max_connections=max_connections,
            connect_timeout=connect_timeout,
            reconnect_timeout=reconnect_timeout,
        )
        self._setup(
            db,
            check_max_checkpoints(max_checkpoints),
            check_max_checkpoint_age(max_checkpoint_age),
            owns=True,
        )
        weakref.finalize(self, db.close)  # connections given back even without close()

    @classmethod
    def _beside(
        cls,
        db: PostgresDatabase,
        max_checkpoints: int | None,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> PostgresCheckpointStore:
        """The checkpoints of a session store, on its database (closed with it)."""
        store = cls.__new__(cls)
        store.cipher = check_cipher(cipher)
        store._setup(db, max_checkpoints, max_checkpoint_age, owns=False)
        return store

    def _setup(
        self,
        db: PostgresDatabase,
        max_checkpoints: int | None,
        max_checkpoint_age: float | None,
        *,
        owns: bool,
    ) -> None:
        self.db = db
        self.max_checkpoints = max_checkpoints
        self.max_checkpoint_age = max_checkpoint_age
        self._owns = owns
        table = f"{db.q}.perdure_checkpoints"
        self._put_sql = (
            f"INSERT INTO {table} (session_id, checkpoint_id, meta, body, hash) "
            "VALUES (%(sid)s, %(cid)s, %(meta)s, %(body)s, %(hash)s) "
            "ON CONFLICT (session_id, checkpoint_id) DO UPDATE SET meta = EXCLUDED.meta, "
            "body = EXCLUDED.body, hash = EXCLUDED.hash"
        )
        self._ids_sql = (
            f"SELECT checkpoint_id FROM {table} WHERE session_id = %(sid)s ORDER BY checkpoint_id"
        )
        self._evict_sql = (
            f"DELETE FROM {table} WHERE session_id = %(sid)s AND checkpoint_id = ANY(%(ids)s)"
        )
        self._get_sql = (
            f"SELECT meta, body, hash FROM {table} "
            "WHERE session_id = %(sid)s AND checkpoint_id = %(cid)s"
        )
        self._list_sql = (
            f"SELECT checkpoint_id, meta FROM {table} "
            "WHERE session_id = %(sid)s ORDER BY checkpoint_id"
        )
        self._delete_sql = (
            f"DELETE FROM {table} WHERE session_id = %(sid)s AND checkpoint_id = %(cid)s"
        )
        self._sessions_sql = f"SELECT DISTINCT session_id FROM {table}"

    def __repr__(self) -> str:
        return f"PostgresCheckpointStore({self.db.server!r}, schema={self.db.schema!r})"

    async def put(self, record: CheckpointRecord) -> None:
        """Store ``record`` (replacing one with its id), then apply retention; one
        transaction, durable like a commit.

        Raises:
            TypeError, ValueError: ``record`` is not a well-formed checkpoint record.
        """
        if not isinstance(record, CheckpointRecord):
            raise TypeError(f"record must be a CheckpointRecord, got {type(record).__name__}")
        meta = CheckpointMeta.from_dict(record.meta.to_dict())
        await self.db.run(lambda conn: self._put(conn, meta, record), doing="storing a checkpoint")

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read and verify one checkpoint.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
            CheckpointNotFoundError: no such checkpoint in that session.
            SessionCorruptedError: its row is damaged.
        """
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        row = await self.db.run(
            lambda conn: conn.execute(
                self._get_sql, {"sid": session_id, "cid": checkpoint_id}
            ).fetchone(),
            doing="reading a checkpoint",
        )
        if row is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of session {session_id!r} not found in {self.db.where}"
            )
        meta_text, body, stored_hash = row
        meta = self._meta(session_id, checkpoint_id, meta_text)
        return verified_record(
            bytes(body),
            stored_hash,
            meta,
            functools.partial(self._damage, session_id, checkpoint_id),
            cipher=self.cipher,
        )

    async def checkpoint_sessions(self) -> builtins.list[str]:
        """Every session id with at least one checkpoint row, sorted (as Python sorts)."""
        rows = await self.db.run(
            lambda conn: conn.execute(self._sessions_sql).fetchall(),
            doing="listing the sessions of checkpoints",
        )
        return sorted(str(row[0]) for row in rows)

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first (reads no body).

        Raises:
            SessionCorruptedError: a row's meta is damaged.
        """
        validate_session_id(session_id)
        rows = await self.db.run(
            lambda conn: conn.execute(self._list_sql, {"sid": session_id}).fetchall(),
            doing="listing checkpoints",
        )
        return [self._meta(session_id, cid, text) for cid, text in rows]

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """Every checkpoint id of the session, oldest first, damaged or not (reads no body)."""
        validate_session_id(session_id)
        rows = await self.db.run(
            lambda conn: conn.execute(self._ids_sql, {"sid": session_id}).fetchall(),
            doing="listing checkpoints",
        )
        return [str(row[0]) for row in rows]

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (absent is fine), damaged or not; durable like a commit.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
        """
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        await self.db.run(
            lambda conn: conn.execute(self._delete_sql, {"sid": session_id, "cid": checkpoint_id}),
            doing="deleting a checkpoint",
        )

    async def schema_exists(self) -> bool:
        """Whether the store's tables exist in its schema (creates nothing)."""
        return await asyncio.to_thread(self.db.schema_exists)

    def close(self) -> None:
        """Close the connections of a store of its own (a session store's closes with it)."""
        if self._owns:
            self.db.close()

    # ------------------------------------------------------------------ internals

    def _put(self, conn: psycopg.Connection[Any], meta: CheckpointMeta, record: Any) -> None:
        body = record.to_json_bytes(self.cipher)  # here, in a worker thread: a history can be large
        params = {
            "sid": meta.session_id,
            "cid": meta.checkpoint_id,
            "meta": json.dumps(meta.to_dict(), ensure_ascii=True, separators=(",", ":")),
            "body": body,
            "hash": blob_hash(body),
        }
        retains = self.max_checkpoints is not None or self.max_checkpoint_age is not None
        with conn.transaction():
            if retains:  # one put of a session at a time
                key = zlib.crc32(f"{self.db.schema}\x00{meta.session_id}".encode()) - 2**31
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (17, key))
            conn.execute(self._put_sql, params)
            if retains:
                ids = [r[0] for r in conn.execute(self._ids_sql, params).fetchall()]
                stale = evicted_checkpoints(ids, self.max_checkpoints, self.max_checkpoint_age)
                if stale:
                    conn.execute(self._evict_sql, {"sid": meta.session_id, "ids": stale})

    def _meta(self, session_id: str, checkpoint_id: Any, text: Any) -> CheckpointMeta:
        """The meta a row holds, checked (it must name the row's session and id)."""
        try:
            raw = json.loads(text)
            meta = CheckpointMeta.from_dict(raw)
        except (TypeError, ValueError, RecursionError) as exc:
            raise self._damage(session_id, str(checkpoint_id), f"its meta: {exc}") from None
        if (meta.session_id, meta.checkpoint_id) != (session_id, checkpoint_id):
            raise self._damage(session_id, str(checkpoint_id), "its meta names another checkpoint")
        return meta

    def _damage(self, session_id: str, checkpoint_id: str, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} is damaged ({self.db.where}): checkpoint "
            f"{checkpoint_id}: {detail}",
            details={
                "session_id": session_id,
                "server": self.db.server,
                "schema": self.db.schema,
                "kind": "bad_checkpoint",
                "checkpoint_id": checkpoint_id,
            },
        )
