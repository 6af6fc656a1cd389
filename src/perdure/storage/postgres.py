"""PostgresStorage: blobs in a PostgreSQL table, with versions and conditional writes.

One row per key (``perdure[postgres]``; the pool, the schema's creation and version
and the translation of psycopg's errors are :mod:`perdure._runtime.postgres`'s)::

    <schema>.<table>(key text COLLATE "C" PRIMARY KEY,  -- sorted by UTF-8 bytes
                     data bytea,                        -- the blob
                     version bigint,                    -- from <table>_versions
                     tag uuid)                          -- the write that made it

Guarantees:

- **Atomic, durable writes.** A write is one statement (``INSERT … ON CONFLICT DO
  UPDATE``), its own transaction: a reader sees the old blob or the new one. It
  returns once the server has flushed it (``synchronous_commit`` is turned on for
  the storage's connections should the server have it off).
- **Versions** (:class:`~perdure.storage.ConditionalStorage`): every write takes
  the next number of the table's sequence, so a key never has a version twice,
  even once deleted and written again. :meth:`PostgresStorage.write_if` compares
  and writes in the same statement — ``UPDATE … WHERE key = … AND version = …``,
  or ``INSERT … ON CONFLICT DO NOTHING`` to create — so of two writers expecting
  one version exactly one succeeds, and a refused write changes nothing
  (:class:`~perdure.errors.StorageConflictError`).
- **Order**: keys are ``text COLLATE "C"``, compared byte by byte in the database's
  UTF-8, which is Python's ``sorted`` for the keys allowed here; ``list`` reads one
  range of the primary key's index.
- **Faults**: a server that cannot be reached raises
  :class:`~perdure.errors.StoreUnavailableError` once ``reconnect_timeout`` has
  passed; reads, plain writes and deletes are simply sent again meanwhile (doing
  one twice leaves what doing it once does). A conditional write whose connection
  was lost finds out whether it was applied from the row's ``tag`` (a random
  UUID each write names itself with): applied, it returns the version it made;
  provably not (the row still has the version it expected, or there is still no
  row for a create), it is sent again; otherwise another writer moved the key on,
  and it raises ``StorageConflictError`` with ``details["outcome"] ==
  "unknown"`` (read the key again, as after any conflict). One case cannot be
  told apart: a create whose row another process deleted before the check is
  sent again, so the blob comes back (the delete is then ordered before it). A
  damaged table raises :class:`~perdure.errors.SessionCorruptedError`; a lock
  held elsewhere :class:`~perdure.errors.StorageLockedError`; anything else
  :class:`~perdure.errors.StorageError` — never a psycopg exception.
- **Any loop, any thread**: psycopg runs in worker threads on a per-process,
  thread-safe pool; nothing is bound to an event loop. The constructor does no I/O;
  the schema and table are made on first use.
"""

from __future__ import annotations

import asyncio
import builtins
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from perdure._runtime.checks import check_seconds
from perdure._runtime.postgres import (
    DRIVER_ERRORS,
    DURABLE_COMMITS,
    PostgresDatabase,
    PostgresErrors,
    SchemaMigration,
    SchemaPart,
    pg_fault,
    quote_ident,
)
from perdure.crypto import Cipher, check_cipher
from perdure.errors import (
    PerdureError,
    SchemaVersionError,
    SessionCorruptedError,
    StorageConflictError,
    StorageError,
    StorageLockedError,
    StoreUnavailableError,
)
from perdure.storage.encrypted import open_blob, seal_blob
from perdure.storage.keys import (
    check_expected,
    counter_version,
    prefix_upper_bound,
    validate_key,
    validate_list_args,
    version_conflict,
)

__all__ = ["MAX_KEY_BYTES", "STORAGE_VERSION", "PostgresStorage"]

STORAGE_VERSION = 1
"""The version of the blob table this perdure writes (``perdure_schema_version``)."""

MAX_KEY_BYTES = 2048
"""The longest key, in UTF-8 bytes, the table's index takes (a B-tree entry is at
most a third of a page)."""

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,53}")

_ERRORS = PostgresErrors(
    unavailable=StoreUnavailableError,
    locked=StorageLockedError,
    damage=SessionCorruptedError,
    failure=StorageError,
    version=SchemaVersionError,
)
"""This layer's error for each fault of a driver error."""


def _schema_part(table: str) -> SchemaPart:
    t = quote_ident(table)
    sequence = quote_ident(f"{table}_versions")

    def statements(q: str) -> list[str]:
        return [
            f"CREATE SEQUENCE IF NOT EXISTS {q}.{sequence}",
            f"""CREATE TABLE IF NOT EXISTS {q}.{t} (
                key text COLLATE "C" PRIMARY KEY,
                data bytea NOT NULL,
                version bigint NOT NULL,
                tag uuid NOT NULL
            )""",
        ]

    return SchemaPart(
        component=f"storage:{table}",
        version=STORAGE_VERSION,
        tables={table: ("key", "data", "version", "tag")},
        statements=statements,
        cli_option="--storage",
        cli_query="" if table == "perdure_blobs" else f"&table={table}",
    )


class PostgresStorage:
    """Blobs in a PostgreSQL table: atomic, durable, versioned (see the module docstring).

    Implements :class:`~perdure.storage.Storage` and
    :class:`~perdure.storage.ConditionalStorage`.

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host/db``).
        table: the table holding the blobs (made on first use, with the sequence
            ``<table>_versions``): letters, digits and ``_``, not starting with a
            digit, at most 54 characters.
        schema: the schema holding the table (made on first use).
        max_connections: the most connections one process opens.
        connect_timeout: seconds to wait for a connection.
        reconnect_timeout: seconds a call waits for a server that went away
            (restarting, say) before raising ``StoreUnavailableError``.
        cipher: a :class:`~perdure.crypto.Cipher`: every blob is stored encrypted
            (:func:`~perdure.storage.encrypted.seal_blob`); a read of a blob that does
            not decrypt raises :class:`~perdure.errors.DecryptionError`.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
    """

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "perdure_blobs",
        schema: str = "perdure",
        max_connections: int = 4,
        connect_timeout: float = 10.0,
        reconnect_timeout: float = 15.0,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(table, str):
            raise TypeError(f"table must be a str, got {type(table).__name__}")
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(
                "table must be 1 to 54 letters, digits or '_', not starting with a digit, "
                f"got {table!r}"
            )
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self.db = PostgresDatabase(
            dsn,
            schema=schema,
            part=_schema_part(table),
            errors=_ERRORS,
            what="PostgreSQL storage",
            max_connections=max_connections,
            connect_timeout=check_seconds("connect_timeout", connect_timeout),
            reconnect_timeout=check_seconds("reconnect_timeout", reconnect_timeout),
            configure=DURABLE_COMMITS,
        )
        self.schema = self.db.schema
        self.table = table
        t = f"{self.db.q}.{quote_ident(table)}"
        self._t = t
        # nextval() takes the sequence's name as text: quoted, then made a literal.
        nextval = "nextval(" + _literal(f"{self.db.q}.{quote_ident(table + '_versions')}") + ")"
        self._write_sql = (
            f"INSERT INTO {t} (key, data, version, tag) "
            f"VALUES (%(key)s, %(data)s, {nextval}, gen_random_uuid()) "
            "ON CONFLICT (key) DO UPDATE SET data = EXCLUDED.data, "
            "version = EXCLUDED.version, tag = EXCLUDED.tag"
        )
        self._create_sql = (
            f"INSERT INTO {t} (key, data, version, tag) "
            f"VALUES (%(key)s, %(data)s, {nextval}, %(tag)s) "
            "ON CONFLICT (key) DO NOTHING RETURNING version"
        )
        self._replace_sql = (
            f"UPDATE {t} SET data = %(data)s, version = {nextval}, tag = %(tag)s "
            "WHERE key = %(key)s AND version = %(expected)s RETURNING version"
        )
        self._read_sql = f"SELECT data FROM {t} WHERE key = %(key)s"
        self._version_sql = f"SELECT version FROM {t} WHERE key = %(key)s"
        self._resolve_sql = f"SELECT version, tag FROM {t} WHERE key = %(key)s"
        self._delete_sql = f"DELETE FROM {t} WHERE key = %(key)s"

    def __repr__(self) -> str:
        return f"PostgresStorage({self.db.server!r}, table={self.table!r}, schema={self.schema!r})"

    def close(self) -> None:
        """Close this process's connections (the next call opens new ones)."""
        self.db.close()

    async def schema_exists(self) -> bool:
        """Whether the storage's table exists in its schema (creates nothing)."""
        return await asyncio.to_thread(self.db.schema_exists)

    async def migrate_schema(self, *, dry_run: bool = False) -> SchemaMigration:
        """Make the table, or upgrade it to this perdure's version (``perdure
        migrate-schema --storage``); see :meth:`PostgresDatabase.migrate
        <perdure._runtime.postgres.PostgresDatabase.migrate>`.

        Raises:
            SchemaVersionError: the table is newer than this perdure, or too old to
                upgrade.
        """
        return await asyncio.to_thread(self.db.migrate, dry_run=dry_run)

    # ------------------------------------------------------------------ Storage

    async def write(self, key: str, data: bytes) -> None:
        """Atomically replace the blob under ``key`` (a new version); durable on return.

        Raises:
            ValueError: ``key`` is invalid or longer than :data:`MAX_KEY_BYTES`.
            TypeError: ``data`` is not bytes.
            StoreUnavailableError: the server stayed away (``details["outcome"]``:
                ``"unknown"``: the write may have been applied).
        """
        self._check_key(key)
        blob = seal_blob(self.cipher, data)
        await self._send_again(
            lambda conn: conn.execute(self._write_sql, {"key": key, "data": blob}),
            doing=f"writing {key!r}",
        )

    async def read(self, key: str) -> bytes | None:
        """The blob under ``key``, or ``None`` when there is none."""
        self._check_key(key)
        row = await self.db.run(
            lambda conn: conn.execute(self._read_sql, {"key": key}).fetchone(),
            doing=f"reading {key!r}",
        )
        return open_blob(self.cipher, None if row is None else bytes(row[0]))

    async def delete(self, key: str) -> None:
        """Remove ``key`` (idempotent); durable on return."""
        self._check_key(key)
        await self._send_again(
            lambda conn: conn.execute(self._delete_sql, {"key": key}),
            doing=f"deleting {key!r}",
        )

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> builtins.list[str]:
        """The keys starting with ``prefix``, sorted, after ``start_after`` (exclusive),
        at most ``limit`` of them (see :class:`~perdure.storage.Storage`)."""
        validate_list_args(prefix, limit, start_after)
        if limit == 0:
            return []
        clauses = ['key >= %(low)s COLLATE "C"']
        params: dict[str, Any] = {"low": prefix}
        upper = prefix_upper_bound(prefix)
        if upper is not None:
            clauses.append('key < %(high)s COLLATE "C"')
            params["high"] = upper
        if start_after is not None:
            clauses.append('key > %(after)s COLLATE "C"')
            params["after"] = start_after
        sql = f"SELECT key FROM {self._t} WHERE {' AND '.join(clauses)} ORDER BY key"
        if limit is not None:
            sql += " LIMIT %(limit)s"
            params["limit"] = limit
        rows = await self.db.run(
            lambda conn: conn.execute(sql, params).fetchall(), doing=f"listing {prefix!r}"
        )
        return [row[0] for row in rows]

    # ------------------------------------------------------------------ ConditionalStorage

    async def version(self, key: str) -> str | None:
        """The version of the blob under ``key``, or ``None`` when there is none."""
        self._check_key(key)
        row = await self.db.run(
            lambda conn: conn.execute(self._version_sql, {"key": key}).fetchone(),
            doing=f"reading the version of {key!r}",
        )
        return None if row is None else str(row[0])

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version is ``expected``
        (``None``: only if there is none); return the new version.

        The comparison and the write are one statement. Durable on return.

        Raises:
            StorageConflictError: the version is not ``expected``; nothing was
                written (``details["outcome"] == "unknown"`` when the connection was
                lost and the key moved on meanwhile: see the module docstring).
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes, ``expected`` neither a str nor None.
            StoreUnavailableError: the server stayed away (``details["outcome"]``).
        """
        self._check_key(key)
        blob = seal_blob(self.cipher, data)
        check_expected(expected)
        number = None if expected is None else counter_version(expected)
        if expected is not None and number is None:
            # Not a version this storage gives: no blob has it.
            raise self._conflict(key, expected, "unknown version")
        return await asyncio.to_thread(self._write_if, key, blob, expected, number)

    # ------------------------------------------------------------------ internals

    def _check_key(self, key: Any) -> None:
        validate_key(key)
        if len(key) * 4 > MAX_KEY_BYTES and len(key.encode("utf-8")) > MAX_KEY_BYTES:
            raise ValueError(
                f"key {key[:40]!r}… is invalid: longer than {MAX_KEY_BYTES} UTF-8 bytes, "
                "the most a PostgreSQL index entry takes"
            )

    async def _send_again(
        self, work: Callable[[psycopg.Connection[Any]], object], *, doing: str
    ) -> None:
        """Run a write that may be sent twice (a plain write, a delete)."""
        try:
            await self.db.run(work, doing=doing)
        except StoreUnavailableError as exc:
            exc.details["outcome"] = "unknown"
            raise

    def _conflict(
        self, key: str, expected: str | None, found: str | None, *, lost: bool = False
    ) -> StorageConflictError:
        return version_conflict(
            f"PostgreSQL storage {self.db.where}", key, expected, found, lost=lost
        )

    def _write_if(self, key: str, blob: bytes, expected: str | None, number: int | None) -> str:
        """Blocking: send the conditional write, resolving a lost connection."""
        tag = uuid.uuid4()
        params = {"key": key, "data": blob, "tag": tag, "expected": number}
        sql = self._create_sql if number is None else self._replace_sql
        doing = f"writing {key!r} if its version is {expected}"
        deadline = time.monotonic() + self.db.reconnect_timeout
        delay = 0.05
        while True:
            sent = False
            try:
                with self.db.connection() as conn:
                    sent = True
                    row = conn.execute(sql, params).fetchone()
            except DRIVER_ERRORS as exc:
                if pg_fault(exc) != "unavailable":
                    raise self.db.translate(exc, doing) from exc
                if sent:
                    made = self._resolve(key, tag, number, exc)
                    if made is not None:
                        return made
                # Not applied: wait for the server, then send it again.
                now = time.monotonic()
                if now >= deadline:
                    error = self.db.translate(exc, doing)
                    if isinstance(error, PerdureError):
                        error.details.update(key=key, outcome="not_applied")
                    raise error from exc
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.5)
                self.db.discard_broken()
                continue
            if row is None:
                found = self.db.call(
                    lambda conn: conn.execute(self._resolve_sql, {"key": key}).fetchone(),
                    doing=f"reading the version of {key!r}",
                )
                if found is not None and found[1] == tag:
                    # An earlier send whose connection was lost was still running on
                    # the server (a network partition): it was applied after all.
                    return str(found[0])
                raise self._conflict(key, expected, None if found is None else str(found[0]))
            return str(row[0])

    def _resolve(
        self, key: str, tag: uuid.UUID, expected: int | None, cause: BaseException
    ) -> str | None:
        """After a lost connection: the version the write made, or None if it provably
        made none.

        Raises:
            StorageConflictError: the key moved on; whether the write was applied
                first cannot be told (``details["outcome"] == "unknown"``).
            StoreUnavailableError: the server did not come back (outcome unknown).
        """
        try:
            row = self.db.call(
                lambda conn: conn.execute(self._resolve_sql, {"key": key}).fetchone(),
                doing=f"checking whether the write of {key!r} was applied",
            )
        except StoreUnavailableError as exc:
            exc.details.update(key=key, outcome="unknown")
            raise exc from cause
        if row is None:
            if expected is None:
                return None  # still no blob: the create was not applied
        else:
            version, found_tag = int(row[0]), row[1]
            if found_tag == tag:
                return str(version)
            if version == expected:
                return None  # still the version it expected: not applied
        raise self._conflict(
            key,
            None if expected is None else str(expected),
            None if row is None else str(row[0]),
            lost=True,
        ) from cause


def _literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
