"""PostgresSessionStore: sessions in a PostgreSQL schema, a row per message (SPEC §7).

The tables are in :mod:`.schema`; the connection pool, the schema's creation and
version, and the translation of driver errors in :mod:`perdure._runtime.postgres`;
the writer leases in :mod:`.leases`. Rows are hashed as the SQLite store hashes
them (:func:`~perdure.session.rules.chain_hash` over a message's JSON text, row 0
chained to 32 zeros; a redaction as ``chain_hash(row_hash, replacement)``), and the
session's row holds the head of the chain, its message count and its tail token.

Guarantees:

- **One round trip per commit.** A commit that appends messages and/or replaces
  the agent state is one statement: an ``UPDATE`` of the session row that checks
  the tail the store planned against (``WHERE tail = …``), the writer's lease in the
  same ``WHERE`` (see below), and the ``INSERT`` of the new rows in a data-modifying
  ``WITH`` that only runs when the ``UPDATE`` matched. Zero rows matched means
  someone else moved the session: the store reads why (another tail:
  ``session_conflict`` by the rules of :func:`~perdure.session.rules.plan_commit`;
  another writer's lease: ``session_locked``; no session: ``session_not_found``)
  and writes nothing. The store plans against the session row it last saw (its
  own last commit, as a rule), so it does not read before it writes; a stale guess
  costs one more round trip, never a wrong write. A rewrite or a redaction is one
  transaction that starts with the same checked ``UPDATE``.
- **Durable**: with ``durability="commit"`` (the default) a commit returns once the
  server has flushed it (``synchronous_commit`` is turned on for the store's
  connections if the server has it off). ``"invocation"`` and ``"none"`` turn it
  off: the server may lose the last commits of a crash of its own (never half of
  one). With ``"invocation"``, :meth:`PostgresSessionStore.flush` — which a
  ``Session`` calls when a turn ends — makes them durable; with ``"none"`` it does
  nothing (the server's WAL writer flushes within ``wal_writer_delay``). The same
  three levels as the file and SQLite stores'.
- **One writer across machines**: :meth:`~PostgresSessionStore.writer_lock` takes
  the session's lease (:mod:`.leases`): another writer anywhere gets
  ``session_locked`` at once; a crashed holder's lease is free as soon as its
  connection is gone, or ``lease`` seconds after its last renewal. Commits under
  the lease name its fencing token in their ``WHERE``: once another writer took
  the lease over, they are refused (``session_locked``, reason ``lease_lost``).
  Commits outside a lease are refused while another writer holds a live one.
- **Integrity**: every read verifies the chain over the rows it returns (a page
  uses the hash of the row before it), the last row against the session's head,
  the agent state against its hash, and each message's JSON and shape: a row
  changed, deleted or added behind the store's back raises
  :class:`~perdure.errors.SessionCorruptedError` naming the session and the row.
  A read is one snapshot (``REPEATABLE READ``, pipelined: one round trip), so a
  commit made meanwhile is never mistaken for damage.
- **Faults**: when the server goes away during a commit (a restart, a dropped
  connection) the store finds out whether the commit was applied by reading the
  session's tail once the server is back (every commit writes a new random tail):
  applied, it returns normally; provably not applied (the tail is still the one it
  planned against), it sends the commit again; otherwise (the session moved on
  meanwhile) it raises ``session_conflict``. Never a duplicate, never a lost
  acknowledged message. A server that stays away past ``reconnect_timeout`` raises
  :class:`~perdure.errors.StoreUnavailableError` (``details["outcome"]``:
  ``not_applied`` or ``unknown``). Reads retry until then by themselves. After an
  ``unknown`` outcome the store forgets the session row it planned on: the next
  commit reads it afresh. A commit that got no pooled connection (the server away,
  or all ``max_connections`` busy: ``details["reason"] == "pool_busy"``) was not
  sent: it waits as a read does, then raises ``not_applied`` — never a conflict. A
  commit the server cancelled (``statement_timeout``: ``details["reason"] ==
  "statement_timeout"``) rolled back: ``StoreUnavailableError``, ``not_applied``, at
  once (not sent again: it would only run out of time again).
- **TTL** (``ttl=`` seconds of inactivity): every commit and every ``get`` renews a
  session (server time); past it, reads and commits raise ``session_not_found``
  with ``details["reason"] == "expired"`` (an id never seen has ``"unknown"``),
  ``create`` starts the id afresh (its checkpoints are kept), ``list`` leaves it
  out (as every store does). :meth:`PostgresSessionStore.collect_expired`
  (``perdure gc``) deletes its messages and state; the session row stays as its
  tombstone until ``max(10 × ttl, 7 days)`` after its last use
  (:func:`~perdure.session.expiry.tomb_seconds`), then goes too. The rules are
  :mod:`perdure.session.expiry`'s.
- **Any loop, any thread**: psycopg runs in worker threads on a thread-safe pool;
  nothing is bound to an event loop. The common commit — an append or a new state,
  planned against the row the store last saw — goes instead on a connection the
  running loop drives itself when one is idle (``PostgresDatabase.loop_connection``),
  with no hop to a thread; the same statement, the same checks. A coroutine
  cancelled while its commit runs does not stop the commit (on either path).
- **Checkpoints** (:attr:`PostgresSessionStore.checkpoints`) live in the same
  schema (see :mod:`.checkpoints`), deleted with their session.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import operator
import threading
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Literal, NamedTuple

import psycopg

from perdure._runtime.checks import check_seconds
from perdure._runtime.postgres import (
    DRIVER_ERRORS,
    DURABLE_COMMITS,
    NO_FLUSH_WAIT,
    LoopConnection,
    LoopStatement,
    PostgresDatabase,
    PostgresErrors,
    SchemaMigration,
    pg_fault,
    run_detached,
)
from perdure._runtime.threads import ProcessLock
from perdure.crypto import Cipher
from perdure.errors import (
    DecryptionError,
    SchemaVersionError,
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from perdure.session._locks import LockTable
from perdure.session.expiry import check_ttl, expires_at, not_found, tomb_seconds
from perdure.session.ids import validate_session_id
from perdure.session.paging import check_page_args, page_of, page_read_range
from perdure.session.rules import (
    ZERO_HASH,
    CommitRequest,
    DecodeError,
    RowChunks,
    chain_hash,
    check_cipher,
    check_extends,
    check_get_args,
    check_list_args,
    check_max_checkpoint_age,
    check_max_checkpoints,
    creation_time,
    decode_message,
    decode_state,
    encode_message,
    encode_redactions,
    encode_state,
    lease_held,
    lease_lost,
    new_tail,
    plan_commit,
    text_hash,
    utc_now,
    verify_rows,
    writes_anything,
)
from perdure.session.store import (
    CommitResult,
    ExpiredSessionInfo,
    HistoryPage,
    SessionMeta,
    SessionRecord,
    StoreBase,
)
from perdure.stores.postgres.checkpoints import PostgresCheckpointStore
from perdure.stores.postgres.leases import LeaseKeeper, holder_alive
from perdure.stores.postgres.schema import SESSIONS
from perdure.types import Message

__all__ = ["Durability", "PostgresSessionStore"]

Durability = Literal["commit", "invocation", "none"]


def _environment_error(message: str, *, details: dict[str, Any] | None = None) -> OSError:
    """A failure of the server or its environment: an ``OSError``, as every session
    store raises for its environment (``details`` are not kept)."""
    del details
    return OSError(message)


ERRORS = PostgresErrors(
    unavailable=StoreUnavailableError,
    locked=SessionLockedError,
    damage=SessionCorruptedError,
    failure=_environment_error,
    version=SchemaVersionError,
)
"""The session store's error for each fault of a driver error."""

_HEADS_KEPT = 4096  # session rows remembered per store (the guess a commit plans with)
_COMMIT_ATTEMPTS = 6  # plans against a moved session, or resends after a lost server


class _Head(NamedTuple):
    """A session row as the store last saw it (a tuple: one is made per commit)."""

    sid: int
    created_at: str
    updated_at: str
    total: int
    head: str
    writes: int
    tail: str
    state_hash: str | None
    last: tuple[str, ...] | None  # the last message's stored texts; None: not read

    def meta(self, session_id: str) -> SessionMeta:
        return SessionMeta(session_id, self.created_at, self.updated_at, self.total)


class _Why(NamedTuple):
    """Why a checked ``UPDATE`` matched no row: the session and its lease, read fresh."""

    head: _Head | None
    expired: bool
    lease: tuple[int, str] | None  # the session's lease row: (token, owner)
    lease_live: bool  # an unexpired lease whose holder's connection is alive


class _Refused(Exception):
    """The checked ``UPDATE`` matched no row (inside the commit's transaction)."""


class _Sent(NamedTuple):
    """What a commit writes: its new rows, and the session row before and after it."""

    planned: _Head  # the row it was planned against
    after: _Head  # the row it leaves when applied
    bodies: list[str]  # the new rows' message texts, from index ``start`` on
    hashes: list[str]  # and their chain hashes


_SESSION_COLUMNS = (
    "sid, created_at, updated_at, message_count, head, writes, tail, state_hash"
)  # fmt: skip


class PostgresSessionStore(StoreBase):
    """Sessions in a PostgreSQL schema (see the module docstring).

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host:5432/db``).
        schema: the schema holding the store's tables (created with them on first use).
        ttl: seconds of inactivity after which a session expires (``None``: never).
        max_checkpoints: keep at most this many checkpoints per session in
            :attr:`checkpoints` (the oldest are evicted, whatever their trigger).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        lease: seconds a writer's lease lasts without renewal: a holder that
            vanished with its machine blocks others at most that long.
        durability: ``"commit"`` (every commit flushed by the server before it
            returns), ``"invocation"`` (``synchronous_commit`` off; :meth:`flush`,
            at the end of a ``Session``'s turn, makes the commits durable) or
            ``"none"`` (``synchronous_commit`` off, and :meth:`flush` does nothing).
        max_connections: most connections the store's pool opens in one process;
            as many again at most for its loop connections (appends, pages and
            leases awaited on the event loop; see the module docstring), besides
            the lease keeper's one.
        connect_timeout: seconds to wait for a connection.
        reconnect_timeout: seconds an operation waits for a server that went away
            (restarting, say) before raising ``StoreUnavailableError``.
        cipher: a :class:`~perdure.crypto.Cipher`: message bodies, the state and
            checkpoints are stored encrypted; row hashes cover the ciphertext
            (SPEC §9).

    Constructing does no I/O; :meth:`close` closes the connections (the store stays
    usable and reconnects on the next call).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "perdure",
        ttl: float | None = None,
        max_checkpoints: int | None = None,
        lease: float = 30.0,
        durability: Durability = "commit",
        max_connections: int = 10,
        connect_timeout: float = 10.0,
        reconnect_timeout: float = 15.0,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        for name, value in (
            ("lease", lease),
            ("connect_timeout", connect_timeout),
            ("reconnect_timeout", reconnect_timeout),
        ):
            check_seconds(name, value)
        checked_ttl = check_ttl(ttl)
        if durability not in ("commit", "invocation", "none"):
            raise ValueError(
                f"durability must be 'commit', 'invocation' or 'none', got {durability!r}"
            )
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self.ttl = checked_ttl
        self.lease = float(lease)
        self.durability: Durability = durability
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self.max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
        self.db = PostgresDatabase(
            dsn,
            schema=schema,
            part=SESSIONS,
            errors=ERRORS,
            what="PostgreSQL session store",
            max_connections=max_connections,
            connect_timeout=float(connect_timeout),
            reconnect_timeout=float(reconnect_timeout),
            configure=DURABLE_COMMITS if durability == "commit" else NO_FLUSH_WAIT,
        )
        self.schema = self.db.schema
        self._locks = LockTable()
        self._leases = LeaseKeeper(self.db, self.lease)
        self._heads: dict[str, _Head] = {}
        self._heads_guard = ProcessLock()
        self._sql = _Statements(self.db.q, self.ttl)
        self._flush_lock = threading.Lock()
        self._settling: set[asyncio.Task[None]] = set()  # see _settle_later
        self.checkpoints = PostgresCheckpointStore._beside(
            self.db, self.max_checkpoints, self.max_checkpoint_age, cipher
        )
        """Checkpoints in the same schema, deleted with their session."""
        # A store dropped without close() still gives back its connections (the
        # lease keeper's is the pool's only connection that would otherwise warn).
        weakref.finalize(self, _shut, self._leases, self.db)

    def __repr__(self) -> str:
        return f"PostgresSessionStore({self.db.server!r}, schema={self.schema!r})"

    # ------------------------------------------------------------------ protocol

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: datetime | str | None = None,
    ) -> SessionMeta:
        """Register a new, empty session (durably, with ``durability="commit"``),
        created at ``created_at`` (default: now).

        An id whose session expired (``ttl``) starts afresh: its messages and state
        go, its checkpoints stay.

        Raises:
            SessionConflictError: it exists already and ``exist_ok`` is false.
            TypeError, ValueError: ``created_at`` is no timezone-aware time (see
                :meth:`SessionStore.create`).
        """
        validate_session_id(session_id)
        created = creation_time(created_at)
        return await asyncio.to_thread(self._create, session_id, exist_ok, created)

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        """Read and verify a session: metadata, messages from ``offset``, state, tail.

        One snapshot, one round trip; with ``ttl`` it renews the session.

        Raises:
            SessionNotFoundError: no such session (``details["reason"]``:
                ``"unknown"`` or ``"expired"``).
            SessionCorruptedError: a row read is damaged (the error names it).
        """
        check_get_args(session_id, offset)
        return await self.db.run(lambda conn: self._get(conn, session_id, offset), doing="reading")

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> builtins.list[SessionMeta]:
        """Metadata of live sessions sorted by id, ids greater than ``after``; reads no
        content. With ``ttl``, an expired session is left out and the others carry
        ``expires_at``.

        Raises:
            ValueError: ``limit`` is not ``None`` or an int >= 0, or ``after`` is not
                a valid session id.
        """
        check_list_args(limit, after)
        return await self.db.run(lambda conn: self._list(conn, limit, after), doing="listing")

    async def _apply_commit(self, request: CommitRequest) -> CommitResult:
        """Persist a checked commit: append what is new, or rewrite the history.

        Planned by the rules against the session row the store last saw; checked by
        the server in the same statement (see the module docstring). After return
        it is stored (durably with ``durability="commit"``); after an error it is
        stored entirely or not at all. The tail changes when anything was written.
        """
        agent_state = request.agent_state
        state_text = None if agent_state is None else encode_state(agent_state, self.cipher)
        redactions = encode_redactions(request.redactions, self.cipher)
        if not redactions and not request.rewritten:
            done = await self._commit_on_loop(request, state_text)
            if done is not None:
                return done
        return await asyncio.to_thread(self._commit, request, state_text, redactions)

    async def _commit_on_loop(
        self, request: CommitRequest, state_text: str | None
    ) -> CommitResult | None:
        """An append or a state change planned against the row this store last saw,
        sent on a loop connection, which the running loop drives (no worker thread).

        None: take the thread path, which plans and sends it (nothing was applied):
        no row remembered, a plan that needs a fresh read, no loop connection idle,
        or the checked UPDATE matched no row (then the row is read afresh there).
        """
        session_id = request.session_id
        seen = self._remembered(session_id)
        if seen is None:
            return None
        try:
            plan = plan_commit(request, seen.total, seen.tail)
            if plan.compare_last:
                if seen.last is None:
                    return None
                last = [self._decode_last(session_id, seen, text) for text in seen.last]
                check_extends(session_id, request.messages, seen.total, last)
        except SessionConflictError:
            return None  # perhaps only against a stale guess: the thread path reads afresh
        if not writes_anything(request, plan):
            return None
        conn = await self.db.take_loop_connection()
        if conn is None:
            return None
        token = self._lease_token(session_id)
        sent = self._sent(request, state_text, {}, seen, plan.start)
        params = self._params(request, sent, state_text, {}, plan.start, token)
        statement = self._sql.loop_commit(
            len(sent.bodies), state_text is not None, token is not None
        )
        try:
            await conn.prepare(statement)
        except BaseException as exc:  # nothing of the commit was sent
            lost = isinstance(exc, DRIVER_ERRORS) and pg_fault(exc) == "unavailable"
            self.db.give_back(conn, reusable=isinstance(exc, DRIVER_ERRORS) and not lost)
            if lost:
                return None  # the thread path waits for the server, as it does
            if isinstance(exc, DRIVER_ERRORS):
                raise self._not_applied(session_id, exc) from exc
            raise
        try:
            conn.send(statement, params)
            result = await conn.result()
        except asyncio.CancelledError:
            # The statement is on its way: it goes on (as in a worker thread) and
            # the store learns its outcome, so its next commit plans on the truth.
            self._settle_later(conn, session_id, sent)
            raise
        except DRIVER_ERRORS as exc:
            lost = pg_fault(exc) == "unavailable"
            self.db.give_back(conn, reusable=not lost)
            if getattr(exc, "sqlstate", None) == "23505":
                raise self._damage(
                    session_id,
                    sent.planned.total,
                    "bad_sequence",
                    "a row exists past the recorded end",
                ) from None
            if not lost:  # refused or cancelled by the server: its transaction rolled back
                raise self._not_applied(session_id, exc) from exc
            # Applied or not? The thread path's rule decides, on a pooled connection.
            applied = await asyncio.to_thread(
                self._resolve, session_id, sent, bool(sent.bodies), exc
            )
            if applied is None:
                return None  # provably not applied: the thread path sends it again
            return self._settled(session_id, sent, True)
        except BaseException:
            self.db.give_back(conn, reusable=False)
            self._forget(session_id)  # applied or not: read afresh next time
            raise
        self.db.give_back(conn, reusable=True)
        return self._settled(session_id, sent, result.get_value(0, 0) == b"1")

    def _settled(self, session_id: str, sent: _Sent, applied: bool) -> CommitResult | None:
        """A commit sent on a loop connection: its result, or None (matched no row:
        the thread path reads why, so nothing is remembered)."""
        if not applied:
            self._forget(session_id)
            return None
        self._remember(session_id, sent.after)
        return CommitResult(sent.after.tail, sent.after.total)

    def _settle_later(self, conn: LoopConnection, session_id: str, sent: _Sent) -> None:
        """Wait in the background for a commit whose caller was cancelled."""

        async def settle() -> None:
            try:
                result = await conn.result()
            except BaseException:
                self.db.give_back(conn, reusable=False)
                self._forget(session_id)
                raise
            self.db.give_back(conn, reusable=True)
            self._settled(session_id, sent, result.get_value(0, 0) == b"1")

        run_detached(self._settling, settle())

    async def delete(self, session_id: str) -> None:
        """Delete a session with its messages, state and checkpoints; absent is fine.

        Raises:
            SessionLockedError: another writer holds the session's lease.
        """
        validate_session_id(session_id)
        await asyncio.to_thread(self._delete, session_id)

    def writer_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's writer lease for an ``async with`` block.

        Commits of this store inside the block name the lease's fencing token;
        other store instances, processes and machines get ``SessionLockedError``
        at once. The lease is renewed in the background while held and given back
        on exit; a crashed holder's lease is free once its connection is gone, or
        after ``lease`` seconds.

        Raises (on enter):
            SessionLockedError: another writer holds it; never waits.
            StoreUnavailableError: the server cannot be reached.
        """
        validate_session_id(session_id)
        return self._hold(session_id)

    async def history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        """One pair-aligned page, reading and verifying only the rows it needs.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: a row read is damaged.
        """
        validate_session_id(session_id)
        check_page_args(offset, limit)
        page = await self._page_on_loop(session_id, offset, limit)
        if page is not None:
            return page
        return await self.db.run(
            lambda conn: self._history_page(conn, session_id, offset, limit), doing="paging"
        )

    async def _page_on_loop(self, session_id: str, offset: int, limit: int) -> HistoryPage | None:
        """:meth:`history_page` in one statement (one snapshot) on a loop connection.

        None: take the thread path (no connection idle, the connection lost — a read
        is simply read again — or no such session: the thread path says why).
        """
        conn = await self.db.take_loop_connection()
        if conn is None:
            return None
        try:
            result = await conn.execute(
                self._sql.loop_page, {"id": session_id, "offset": offset, "limit": limit}
            )
        except DRIVER_ERRORS as exc:
            lost = pg_fault(exc) == "unavailable"
            self.db.give_back(conn, reusable=not lost)
            if lost:
                return None
            raise self.db.translate(exc, f"paging session {session_id!r}") from exc
        except BaseException:  # a statement may be in flight: the connection goes
            self.db.give_back(conn, reusable=False)
            raise
        self.db.give_back(conn, reusable=True)
        if not result.ntuples:
            return None
        # Bodies stay bytes: the chain is hashed and the JSON parsed from them as they are.
        get = result.get_value
        try:
            head_row = (
                _integer(get(0, 0)),
                _text(get(0, 1)),
                _text(get(0, 2)),
                _integer(get(0, 3)),
                _text(get(0, 4)),
                _integer(get(0, 5)),
                _text(get(0, 6)),
                _text(get(0, 7)),
            )
            messages = [
                (int(index), get(row, 9), _text(get(row, 10)), get(row, 11), _text(get(row, 12)))
                for row in range(result.ntuples)
                if (index := get(row, 8)) is not None
            ]
        except ValueError:
            return None  # not what the server sends: the thread path reads it as psycopg does
        return self._page(session_id, head_row, messages, offset, limit)

    async def flush(self, session_id: str) -> None:
        """Make every commit so far durable.

        With ``durability="invocation"`` it commits one transaction with
        ``synchronous_commit`` on, which waits for the server to flush its log up to
        it, and so every commit before it. A no-op with ``"commit"`` (every commit is
        durable already) and with ``"none"``.
        """
        validate_session_id(session_id)
        if self.durability == "invocation":
            await self.db.run(_flush_log, doing="flushing")

    async def schema_exists(self) -> bool:
        """Whether the store's tables exist in its schema (creates nothing)."""
        return await asyncio.to_thread(self.db.schema_exists)

    async def migrate_schema(self, *, dry_run: bool = False) -> SchemaMigration:
        """Make the store's tables (sessions, messages, leases, checkpoints), or upgrade
        them to this perdure's version (``perdure migrate-schema --store``).

        Opening a store never upgrades: it refuses an older schema with
        ``SchemaVersionError`` naming this command. Each step is one transaction
        under the schema's advisory lock; running it again, or from two processes at
        once, does the work once. Stop the processes using the schema first: one
        that opened it before does not read its version again. See
        :meth:`PostgresDatabase.migrate <perdure._runtime.postgres.PostgresDatabase.migrate>`.

        Raises:
            SchemaVersionError: the tables are newer than this perdure, or too old to
                upgrade.
        """
        return await asyncio.to_thread(self.db.migrate, dry_run=dry_run)

    def close(self) -> None:
        """Give back this process's leases and close its connections (reopened on use).

        Blocks while running operations finish; call it outside the event loop or at
        shutdown.
        """
        self._leases.close()
        self.db.close()

    # ------------------------------------------------------------------ connections

    @contextlib.asynccontextmanager
    async def _hold(self, session_id: str) -> AsyncIterator[None]:
        self._locks.acquire(session_id)  # this instance, in this process: at once
        try:
            if not await self._leases.acquire_on_loop(session_id):
                await self._take_lease(session_id)
            try:
                yield
            finally:
                if not await self._leases.release_on_loop(session_id):
                    await asyncio.to_thread(self._leases.release, session_id)
        finally:
            self._locks.release(session_id)

    async def _take_lease(self, session_id: str) -> None:
        """Take the lease in a worker thread; given back if the caller stops waiting.

        A cancelled ``await`` does not stop the thread: a lease it takes after the
        caller was cancelled is released at once, and one it took just before is
        released in the background, so no lease outlives a cancelled ``async with``.
        """
        guard = threading.Lock()
        outcome = {"cancelled": False, "taken": False}

        def take() -> None:
            self._leases.acquire(session_id)
            with guard:
                outcome["taken"] = not outcome["cancelled"]
            if not outcome["taken"]:
                self._leases.release(session_id)

        try:
            await asyncio.to_thread(take)
        except BaseException:
            with guard:
                outcome["cancelled"] = True
                taken = outcome["taken"]
            if taken:
                threading.Thread(
                    target=self._leases.release, args=(session_id,), daemon=True
                ).start()
            raise

    def _lease_token(self, session_id: str) -> int | None:
        """The token of the lease this instance holds on the session (None: none)."""
        if not self._locks.is_held(session_id):
            return None
        return self._leases.token(session_id)

    # ------------------------------------------------------------------ errors

    def _damage(self, session_id: str, row: int, kind: str, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} is damaged ({self.db.where}): message row {row}: {detail}",
            details={
                "session_id": session_id,
                "server": self.db.server,
                "schema": self.schema,
                "kind": kind,
                "row": row,
            },
        )

    def _not_applied(self, session_id: str, exc: BaseException) -> Exception:
        """The error for a driver error that left a commit provably not applied (not
        sent, or refused or cancelled by the server: its transaction rolled back)."""
        error = self.db.translate(
            exc, f"committing to session {session_id!r}", outcome="not_applied"
        )
        if isinstance(error, StoreUnavailableError):
            error.details["session_id"] = session_id
        return error

    def _not_found(self, session_id: str, expired: bool) -> SessionNotFoundError:
        error: SessionNotFoundError = not_found(
            session_id, self.db.where, expired=expired, ttl=self.ttl
        )
        return error

    def _checked_head(self, session_id: str, row: Sequence[Any], last: Any = None) -> _Head:
        """A session row (the columns of ``_SESSION_COLUMNS``), checked for sense."""
        sid, created_at, updated_at, total, head, writes, tail, state_hash = row[:8]
        if not (
            isinstance(created_at, str)
            and isinstance(updated_at, str)
            and isinstance(head, str)
            and isinstance(tail, str)
            and total >= 0
            and writes >= 0
        ):
            raise SessionCorruptedError(
                f"session {session_id!r} is damaged ({self.db.where}): its session row "
                "holds impossible values",
                details={"session_id": session_id, "schema": self.schema, "kind": "bad_meta"},
            )
        return _Head(sid, created_at, updated_at, total, head, writes, tail, state_hash, last)

    # ------------------------------------------------------------------ reading

    def _get(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        offset: int,
        upto: int | None = None,
    ) -> SessionRecord:
        """The session from ``offset``: its row and its first ``upto`` rows read in one
        snapshot, one round trip; the rest, when it holds more, streamed
        (:meth:`_stream_rest`). ``upto`` None: :data:`_FIRST_ROWS` where the driver
        streams in chunks, else every row at once."""
        sql = self._sql
        if upto is None:
            upto = _FIRST_ROWS if _STREAMS else _ALL_ROWS
        params = {"id": session_id, "offset": offset, "upto": upto}
        if self.ttl is None:
            head_row, rows = _snapshot(conn, [(sql.get_head, params), (sql.get_rows, params)])
        else:
            # Renewing writes the row; its lock keeps commits out until the rows are read.
            head_row, rows, found = _locked_read(
                conn, [(sql.renew_head, params), (sql.get_rows, params), (sql.find, params)]
            )
            if not head_row:
                raise self._not_found(session_id, bool(found and found[0][0]))
        if not head_row:
            raise self._not_found(session_id, False)
        rows.sort(key=_by_index)  # read unordered (see _Statements.get_rows)
        head = self._checked_head(session_id, head_row[0])
        start = min(offset, head.total)
        prev, window = self._prev(session_id, rows, start)
        try:
            if head.total > start - 1 + upto:  # the rows read stop short of the end
                messages = self._stream_rest(conn, session_id, head, start, prev, window, upto)
                if messages is None:  # the session moved on between the two reads
                    return self._get(conn, session_id, offset, _ALL_ROWS)
            else:
                messages = self._verify(session_id, head, window, start, prev, head.total)
        except DecryptionError:
            self._state(session_id, head, head_row[0][8])  # its hash too, before the key
            raise
        state = self._state(session_id, head, head_row[0][8])
        return SessionRecord(
            meta=head.meta(session_id),
            messages=messages,
            offset=start,
            agent_state=state,
            tail=head.tail,
        )

    def _stream_rest(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        head: _Head,
        start: int,
        prev: str,
        window: builtins.list[tuple[Any, ...]],
        upto: int,
    ) -> builtins.list[Message] | None:
        """Messages ``start..`` of a long session: ``window`` (read with ``head``), then
        the rows from ``start - 1 + upto`` on, streamed in chunks of
        :data:`_CHUNK_ROWS` and checked as they arrive (:class:`RowChunks`), so the
        client's hashing and parsing overlap the server's reading and sending.

        The streamed statement reads the rows only while the session row still
        holds ``head``'s tail (a fresh token for every commit): one statement is
        one snapshot, so its rows and ``window`` are one state of the session.
        None: no row came (the session moved on, or lost every row after
        ``window``): the caller reads it all again in one snapshot.
        """
        chunks = RowChunks(start, prev, cipher=self.cipher)
        chunks.add(window)
        params = {"id": session_id, "sid": head.sid, "tail": head.tail, "from": start - 1 + upto}
        batch: builtins.list[tuple[Any, ...]] = []
        streamed = 0
        with conn.cursor() as cursor:
            for row in cursor.stream(self._sql.rest_rows, params, size=_CHUNK_ROWS):
                batch.append(row)
                if len(batch) == _CHUNK_ROWS:
                    chunks.add(batch)
                    streamed += _CHUNK_ROWS
                    batch = []
        chunks.add(batch)
        if not streamed + len(batch):
            return None
        return chunks.finish(
            head.total,
            head.head,
            lambda at, kind, detail: self._damage(session_id, at, kind, detail),
        )

    def _history_page(
        self, conn: psycopg.Connection[Any], session_id: str, offset: int, limit: int
    ) -> HistoryPage:
        params = {"id": session_id, "offset": offset, "limit": limit}
        head_row, rows = _snapshot(
            conn, [(self._sql.get_head, params), (self._sql.page_rows, params)]
        )
        if not head_row:
            self._raise_absent(conn, session_id)
        return self._page(session_id, head_row[0], rows, offset, limit)

    def _page(
        self,
        session_id: str,
        head_row: Sequence[Any],
        rows: builtins.list[tuple[Any, ...]],
        offset: int,
        limit: int,
    ) -> HistoryPage:
        """A page from the session row and the rows read for it, in index order."""
        head = self._checked_head(session_id, head_row)
        lo, hi = page_read_range(head.total, offset, limit)
        prev, window = self._prev(session_id, [r for r in rows if r[0] < hi], lo)
        return page_of(
            head.total, offset, limit, lo, self._verify(session_id, head, window, lo, prev, hi)
        )

    def _raise_absent(self, conn: psycopg.Connection[Any], session_id: str) -> None:
        found = conn.execute(self._sql.find, {"id": session_id}).fetchone()
        raise self._not_found(session_id, bool(found and found[0]))

    def _prev(
        self, session_id: str, rows: builtins.list[tuple[Any, ...]], start: int
    ) -> tuple[str, builtins.list[tuple[Any, ...]]]:
        """The hash row ``start`` chains to, and the rows from ``start`` on."""
        if start == 0:
            return ZERO_HASH, rows
        rows = [r for r in rows if r[0] >= start - 1]
        if not rows or rows[0][0] != start - 1:
            raise self._damage(session_id, start - 1, "bad_sequence", "the row is missing")
        return str(rows[0][2]), rows[1:]

    def _verify(
        self,
        session_id: str,
        head: _Head,
        rows: builtins.list[tuple[Any, ...]],
        first: int,
        prev: str,
        end: int,
    ) -> builtins.list[Message]:
        """Check that ``rows`` are messages ``first..end-1``, chained from ``prev``; decode
        them (:func:`~perdure.session.rules.verify_rows`)."""
        return verify_rows(
            rows,
            first,
            prev,
            end,
            head.head if end == head.total else None,
            lambda at, kind, detail: self._damage(session_id, at, kind, detail),
            cipher=self.cipher,
        )

    def _state(self, session_id: str, head: _Head, text: str | None) -> dict[str, Any]:
        def damaged(detail: str) -> SessionCorruptedError:
            return SessionCorruptedError(
                f"session {session_id!r} is damaged ({self.db.where}): agent state: {detail}",
                details={"session_id": session_id, "schema": self.schema, "kind": "bad_state"},
            )

        if text is None:
            if head.state_hash is not None:
                raise damaged("the state is missing")
            return {}
        if head.state_hash != text_hash(text):
            raise damaged("the state does not match its hash")
        try:
            return decode_state(text, self.cipher)
        except DecodeError as exc:
            raise damaged(str(exc)) from None

    def _list(
        self, conn: psycopg.Connection[Any], limit: int | None, after: str | None
    ) -> builtins.list[SessionMeta]:
        rows = conn.execute(
            self._sql.list, {"after": "" if after is None else after, "limit": limit}
        ).fetchall()
        return [
            SessionMeta(row[0], row[1], row[2], row[3], expires_at=expires_at(row[4], self.ttl))
            for row in rows
        ]

    async def collect_expired(self, *, dry_run: bool = True) -> builtins.list[ExpiredSessionInfo]:
        """Delete the messages and state of every expired session (``perdure gc``).

        Each keeps its session row (the tombstone: it still reads as expired) and its
        checkpoints; rows whose tombstone's time is over go too. A session whose
        writer lease is live is left alone. A dry run deletes nothing.
        """
        if self.ttl is None:
            return []
        return await self.db.run(lambda conn: self._collect(conn, dry_run), doing="collecting")

    def _collect(
        self, conn: psycopg.Connection[Any], dry_run: bool
    ) -> builtins.list[ExpiredSessionInfo]:
        assert self.ttl is not None
        params = {"tomb": tomb_seconds(self.ttl)}
        with conn.transaction():
            rows = conn.execute(self._sql.expired, params).fetchall()
            if not dry_run:
                conn.execute(self._sql.purge_expired, params)
                conn.execute(self._sql.drop_tombstones, params)
        for session_id, *_ in rows:
            self._forget(session_id)
        return [
            ExpiredSessionInfo(session_id, used_at, count) for session_id, used_at, count in rows
        ]

    # ------------------------------------------------------------------ writing

    def _create(self, session_id: str, exist_ok: bool, created: str) -> SessionMeta:
        params = {"id": session_id, "created": created, "zero": ZERO_HASH, "tail": new_tail(0)}

        def work(conn: psycopg.Connection[Any]) -> tuple[bool, tuple[Any, ...] | None]:
            made = conn.execute(self._sql.create, params).fetchone()
            if made is not None:
                return True, None
            with conn.transaction():
                row = conn.execute(self._sql.lock_existing, params).fetchone()
                if row is None:  # deleted meanwhile: make it now
                    return conn.execute(self._sql.create, params).fetchone() is not None, None
                if row[6] == params["tail"]:  # made by this call (its answer was lost)
                    return True, None
                if row[-1] and self.ttl is not None:  # expired: start it afresh
                    conn.execute(self._sql.delete_rows, {"sid": row[0]})
                    conn.execute(self._sql.restart, {**params, "sid": row[0]})
                    return True, None
                return False, row

        # A create is safe to send again: the id's row says whether it was made.
        fresh, row = self.db.call(work, doing=f"creating session {session_id!r}")
        self._forget(session_id)
        if fresh:
            return SessionMeta(session_id, created, created, 0)
        if not exist_ok:
            raise SessionConflictError(f"session {session_id!r} already exists in {self.db.where}")
        assert row is not None
        return self._checked_head(session_id, row[:8]).meta(session_id)

    def _commit(
        self, request: CommitRequest, state_text: str | None, redactions: dict[int, str]
    ) -> CommitResult:
        session_id = request.session_id
        token = self._lease_token(session_id)
        # Planned against the row this store last saw (its own last commit, as a
        # rule); a refusal planned on that guess is only believed once read afresh.
        seen, fresh = self._remembered(session_id), False
        for _ in range(_COMMIT_ATTEMPTS):
            if seen is None:
                seen, fresh = self._head_for_commit(session_id, token), True
            try:
                plan = plan_commit(request, seen.total, seen.tail)
                if plan.compare_last:
                    if seen.last is None:  # not read yet, or the row is missing
                        if fresh:
                            raise self._damage(
                                session_id, seen.total - 1, "bad_sequence", "the row is missing"
                            )
                        seen = None
                        continue
                    last = [self._decode_last(session_id, seen, text) for text in seen.last]
                    check_extends(session_id, request.messages, seen.total, last)
            except SessionConflictError:
                if fresh:
                    raise
                seen = None
                continue
            if not writes_anything(request, plan):
                if fresh:
                    return CommitResult(seen.tail, seen.total)
                seen = None
                continue
            sent = self._sent(request, state_text, redactions, seen, plan.start)
            outcome = self._send(request, sent, state_text, redactions, plan.start, token)
            if outcome is True:
                self._remember(session_id, sent.after)
                return CommitResult(sent.after.tail, sent.after.total)
            seen, fresh = outcome, True  # the session as it is now: plan again
        raise SessionConflictError(
            f"session {session_id!r} kept changing under this commit ({self.db.where}) "
            f"({_COMMIT_ATTEMPTS} attempts); reopen the session to continue"
        )

    def _sent(
        self,
        request: CommitRequest,
        state_text: str | None,
        redactions: dict[int, str],
        seen: _Head,
        start: int,
    ) -> _Sent:
        """The session row a commit planned from ``seen`` leaves behind."""
        messages = request.messages
        total, head, last = seen.total, seen.head, seen.last
        bodies: builtins.list[str] = []
        hashes: builtins.list[str] = []
        if request.rewritten or len(messages) > start:
            chained = ZERO_HASH if request.rewritten else seen.head
            for index in range(start, len(messages)):
                body = encode_message(messages[index], f"messages[{index}]", self.cipher)
                chained = chain_hash(chained, body)
                bodies.append(body)
                hashes.append(chained)
            total, head = len(messages), chained
            last = (bodies[-1],) if bodies else ()
        if total - 1 in redactions:
            last = None if last is None else (last[0], redactions[total - 1])
        writes = seen.writes + 1
        after = _Head(
            seen.sid,
            seen.created_at,
            utc_now(),
            total,
            head,
            writes,
            new_tail(writes),
            seen.state_hash if state_text is None else text_hash(state_text),
            last,
        )
        return _Sent(seen, after, bodies, hashes)

    def _send(
        self,
        request: CommitRequest,
        sent: _Sent,
        state_text: str | None,
        redactions: dict[int, str],
        start: int,
        token: int | None,
    ) -> Literal[True] | _Head:
        """Send the commit; True once applied, else the session row as it is now.

        Raises:
            SessionNotFoundError, SessionLockedError: why the checked UPDATE matched
                no row, when that is why.
            StoreUnavailableError: the server stayed away (``details["outcome"]``).
        """
        session_id = request.session_id
        planned, _, bodies, hashes = sent
        params = self._params(request, sent, state_text, redactions, start, token)
        simple = not request.rewritten and not redactions

        def fast(conn: psycopg.Connection[Any]) -> bool:
            statement = self._sql.commit(len(bodies), state_text is not None, token is not None)
            row = conn.execute(statement, params).fetchone()
            return bool(row and row[0])

        def transaction(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                statement = self._sql.commit(0, state_text is not None, token is not None)
                row = conn.execute(statement, params).fetchone()
                if not (row and row[0]):
                    raise _Refused
                sid = planned.sid
                if request.rewritten:
                    conn.execute(self._sql.delete_rows, {"sid": sid})
                if bodies:
                    conn.execute(
                        self._sql.insert_rows,
                        {
                            "sid": sid,
                            "idxs": list(range(start, start + len(bodies))),
                            "bodies": bodies,
                            "hashes": hashes,
                        },
                    )
                if redactions:
                    self._redact(conn, session_id, sid, redactions, start, hashes)
            return True

        work = fast if simple else transaction
        deadline: float | None = None  # of the wait for a connection (nothing sent)
        delay = 0.05
        resent = 0
        while resent < _COMMIT_ATTEMPTS:
            sending = False
            try:
                with self.db.connection() as conn:
                    sending = True
                    applied = work(conn)
            except _Refused:
                applied = False
            except DRIVER_ERRORS as exc:
                if getattr(exc, "sqlstate", None) == "23505":
                    raise self._damage(
                        session_id,
                        planned.total,
                        "bad_sequence",
                        "a row exists past the recorded end",
                    ) from None
                fault = pg_fault(exc)
                if fault == "unavailable" and sending:
                    resolved = self._resolve(session_id, sent, bool(bodies), exc)
                    if resolved is None:
                        resent += 1
                        continue  # provably not applied: send it again
                    return resolved
                if fault == "unavailable":  # no connection came: nothing was sent
                    now = time.monotonic()
                    if deadline is None:
                        deadline = now + self.db.reconnect_timeout
                    if now < deadline:  # wait, as a read waits for the server or the pool
                        time.sleep(min(delay, deadline - now))
                        delay = min(delay * 2, 0.5)
                        self.db.discard_broken()
                        continue
                # Refused or cancelled by the server, or no connection in time: the
                # statement's transaction never committed.
                raise self._not_applied(session_id, exc) from exc
            if applied:
                return True
            return self._head_for_commit(session_id, token)  # why it matched no row
        raise StoreUnavailableError(
            f"PostgreSQL session store {self.db.where}: committing to session {session_id!r}: "
            "the connection kept failing; the commit was not applied",
            details={"session_id": session_id, "outcome": "not_applied"},
        )

    def _params(
        self,
        request: CommitRequest,
        sent: _Sent,
        state_text: str | None,
        redactions: dict[int, str],
        start: int,
        token: int | None,
    ) -> dict[str, Any]:
        """The commit statement's parameters (the rows too, for an append)."""
        after, bodies, hashes = sent.after, sent.bodies, sent.hashes
        params: dict[str, Any] = {
            "id": request.session_id,
            "seen": sent.planned.tail,
            "now": after.updated_at,
            "count": after.total,
            "head": after.head,
            "writes": after.writes,
            "tail": after.tail,
            "state": state_text,
            "state_hash": after.state_hash,
            "token": token,
            "owner": self._leases.owner,
        }
        if request.rewritten or redactions:
            return params
        if len(bodies) == 1:
            params.update(idx=start, body=bodies[0], hash=hashes[0])
        elif bodies:
            params.update(
                idxs=list(range(start, start + len(bodies))), bodies=bodies, hashes=hashes
            )
        return params

    def _redact(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        sid: int,
        redactions: dict[int, str],
        start: int,
        hashes: builtins.list[str],
    ) -> None:
        """Store replacements beside their rows, hashed on the row's own hash."""
        older = sorted(i for i in redactions if i < start)
        stored: dict[int, str] = {}
        if older:
            rows = conn.execute(self._sql.row_hashes, {"sid": sid, "idxs": older}).fetchall()
            stored = {int(idx): str(h) for idx, h in rows}
        idxs, texts, marks = [], [], []
        for index, text in sorted(redactions.items()):
            row_hash = hashes[index - start] if index >= start else stored.get(index)
            if row_hash is None:
                raise self._damage(session_id, index, "bad_sequence", "the row is missing")
            idxs.append(index)
            texts.append(text)
            marks.append(chain_hash(row_hash, text))
        conn.execute(self._sql.redact, {"sid": sid, "idxs": idxs, "texts": texts, "hashes": marks})

    def _resolve(
        self, session_id: str, sent: _Sent, appended: bool, cause: BaseException
    ) -> Literal[True] | None:
        """After a lost connection: was the commit applied? (See the module docstring.)

        True: applied. None: provably not (send it again).

        Only for a commit that was sent: one that got no connection was not.
        Whatever it raises, the session row this store remembered is forgotten
        (it may be the row from before the commit, applied after all): the next
        commit reads the row afresh, and plans against what is stored.

        Raises:
            SessionConflictError: the session moved on, and whether the commit was
                applied before that cannot be told.
            StoreUnavailableError: the server did not come back (outcome unknown).
        """
        try:
            return self._check_applied(session_id, sent, appended, cause)
        except BaseException:
            self._forget(session_id)
            raise

    def _check_applied(
        self, session_id: str, sent: _Sent, appended: bool, cause: BaseException
    ) -> Literal[True] | None:
        """:meth:`_resolve`'s reading and rule."""
        planned, after = sent.planned, sent.after
        try:
            row = self.db.call(
                lambda conn: conn.execute(
                    self._sql.resolve, {"id": session_id, "idx": after.total - 1}
                ).fetchone(),
                doing=f"checking whether a commit to session {session_id!r} was applied",
            )
        except StoreUnavailableError as exc:
            raise StoreUnavailableError(
                f"{exc.message}; the commit in flight when the connection was lost may or "
                "may not have been applied: reopen the session once the server is back",
                details={**exc.details, "session_id": session_id, "outcome": "unknown"},
            ) from cause
        if row is None:
            raise self._not_found(session_id, False)
        tail, total, last_hash = row
        if tail == after.tail:
            return True
        if tail == planned.tail:
            return None
        if appended and total >= after.total and last_hash == after.head:
            return True  # applied, then others committed after it
        raise SessionConflictError(
            f"session {session_id!r} changed ({self.db.where}) while the connection to the "
            "server was lost during a commit; whether that commit was applied first cannot "
            "be told: reopen the session to continue",
            details={"session_id": session_id, "outcome": "unknown"},
        )

    def _why(self, session_id: str) -> _Why:
        row = self.db.call(
            lambda conn: conn.execute(self._sql.why, {"id": session_id}).fetchone(),
            doing=f"reading session {session_id!r}",
        )
        assert row is not None
        lease = None if row[11] is None else (int(row[11]), str(row[12]))
        if row[0] is None:
            return _Why(None, False, lease, bool(row[13]))
        last: tuple[str, ...] | None = ()
        if row[3] > 0:  # the last row's texts (None: the row is missing)
            last = None if row[9] is None else tuple(t for t in row[9:11] if t is not None)
        head = self._checked_head(session_id, row[:8], last)
        return _Why(head, bool(row[8]), lease, bool(row[13]))

    def _holds(self, why: _Why, token: int) -> bool:
        """Whether the lease ``why`` read is the one this writer took (token and owner)."""
        return why.lease == (token, self._leases.owner)

    def _head_for_commit(self, session_id: str, token: int | None) -> _Head:
        """:meth:`_read_head` for a commit not applied (not sent yet, or refused).

        Raises:
            StoreUnavailableError: the server stayed away: outcome ``not_applied``.
        """
        try:
            return self._read_head(session_id, token)
        except StoreUnavailableError as exc:
            raise StoreUnavailableError(
                f"{exc.message}; the commit to it was not applied",
                details={**exc.details, "session_id": session_id, "outcome": "not_applied"},
            ) from exc.__cause__

    def _read_head(self, session_id: str, token: int | None) -> _Head:
        """The session row as it is now (with its last message's texts); also why a
        checked UPDATE matched no row (raised, or the head moved on).

        Raises:
            SessionNotFoundError: the session is gone or expired.
            SessionLockedError: ``token`` names a lease another writer took over.
        """
        why = self._why(session_id)
        if why.head is None or why.expired:
            self._forget(session_id)
            raise self._not_found(session_id, why.expired)
        if token is not None and not self._holds(why, token):
            raise lease_lost(session_id, self.db.where)
        if token is None and why.lease_live:
            raise lease_held(session_id, self.db.where)
        self._remember(session_id, why.head)
        return why.head

    def _decode_last(self, session_id: str, head: _Head, text: str) -> Message:
        try:
            return decode_message(text, self.cipher)
        except DecodeError as exc:
            raise self._damage(session_id, head.total - 1, "bad_payload", str(exc)) from None

    def _remembered(self, session_id: str) -> _Head | None:
        return self._heads.get(session_id)

    def _remember(self, session_id: str, head: _Head) -> None:
        with self._heads_guard:
            if len(self._heads) >= _HEADS_KEPT and session_id not in self._heads:
                self._heads.clear()
            self._heads[session_id] = head

    def _forget(self, session_id: str) -> None:
        with self._heads_guard:
            self._heads.pop(session_id, None)

    def _delete(self, session_id: str) -> None:
        token = self._lease_token(session_id)

        def work(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                lease = conn.execute(self._sql.lease_of, {"id": session_id}).fetchone()
                mine = lease is not None and (lease[0], lease[2]) == (token, self._leases.owner)
                if lease is not None and lease[1] and not mine:
                    return False
                sid = conn.execute(self._sql.lock_sid, {"id": session_id}).fetchone()
                conn.execute(self._sql.delete_checkpoints, {"id": session_id})
                if sid is not None:
                    conn.execute(self._sql.delete_rows, {"sid": sid[0]})
                    conn.execute(self._sql.delete_session, {"sid": sid[0]})
                if lease is not None and not mine:
                    conn.execute(self._sql.delete_lease, {"id": session_id, "token": lease[0]})
            return True

        done = self.db.call(work, doing=f"deleting session {session_id!r}")
        self._forget(session_id)
        if not done:
            raise lease_held(session_id, self.db.where)


def _integer(value: bytes | None) -> int:
    """A bigint column's text as an int (ValueError: NULL, or not an integer)."""
    if value is None:
        raise ValueError("NULL where a number was expected")
    return int(value)


def _text(value: bytes | None) -> str | None:
    """A text column's value (UnicodeDecodeError is a ValueError)."""
    return None if value is None else value.decode()


def _shut(leases: LeaseKeeper, db: PostgresDatabase) -> None:
    with contextlib.suppress(Exception):
        leases.close()
    with contextlib.suppress(Exception):
        db.close()


def _flush_log(conn: psycopg.Connection[Any]) -> None:
    with conn.pipeline():
        conn.execute("BEGIN")
        conn.execute("SET LOCAL synchronous_commit TO on")
        conn.execute("SELECT txid_current()")
        conn.execute("COMMIT")


_by_index = operator.itemgetter(0)  # a message row's idx

# A long resume: the first rows come with the session row, the rest in chunks that
# are checked while the server sends the next (libpq 17's chunked rows; psycopg
# 3.2). 10k messages on one VM: 35 ms read at once, 27 ms streamed.
_FIRST_ROWS = 1000
_CHUNK_ROWS = 1000
_ALL_ROWS = 2**62  # no bound
_capabilities = getattr(psycopg, "capabilities", None)
_STREAMS = bool(_capabilities is not None and _capabilities.has_stream_chunked())


def _snapshot(
    conn: psycopg.Connection[Any], statements: Sequence[tuple[str, dict[str, Any]]]
) -> builtins.list[builtins.list[tuple[Any, ...]]]:
    """The rows of each statement, all read in one snapshot and one round trip."""
    with conn.pipeline():
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursors = [conn.execute(sql, params) for sql, params in statements]
        conn.execute("COMMIT")
    return [cursor.fetchall() for cursor in cursors]


def _locked_read(
    conn: psycopg.Connection[Any], statements: Sequence[tuple[str, dict[str, Any]]]
) -> builtins.list[builtins.list[tuple[Any, ...]]]:
    """The rows of each statement in one transaction (the first locks the session row)."""
    with conn.pipeline():
        conn.execute("BEGIN")
        cursors = [conn.execute(sql, params) for sql, params in statements]
        conn.execute("COMMIT")
    return [cursor.fetchall() for cursor in cursors]


class _Statements:
    """The store's SQL, built once for its schema and TTL."""

    def __init__(self, q: str, ttl: float | None) -> None:
        self.q = q
        fresh = "true" if ttl is None else f"touched_at >= now() - interval '{ttl!r} seconds'"
        self.fresh = fresh
        expired = "false" if ttl is None else f"NOT ({fresh})"
        columns = _SESSION_COLUMNS
        sessions, messages = f"{q}.perdure_sessions", f"{q}.perdure_messages"
        leases = f"{q}.perdure_leases"
        self.get_head = f"SELECT {columns}, state FROM {sessions} WHERE id = %(id)s AND {fresh}"
        self.renew_head = (
            f"UPDATE {sessions} SET touched_at = now() WHERE id = %(id)s AND {fresh} "
            f"RETURNING {columns}, state"
        )
        self.find = f"SELECT {expired} FROM {sessions} WHERE id = %(id)s"
        rows = f"SELECT m.idx, m.body, m.hash, m.redacted, m.redacted_hash FROM {messages} m"
        # No ORDER BY: the session's sid comes through the join, so the planner cannot
        # see that the (sid, idx) index gives the order and sorts every row, on disk
        # past work_mem (4 MB: some 10k messages) - most of a long resume's server
        # time. The store sorts the rows (in index order already, as a rule) itself.
        # The rows from offset - 1 (the hash offset chains to): the first ``upto`` of
        # them, or all (rows past the end too, which are damage) when the session
        # holds no more; rest_rows streams the others (PostgresSessionStore._get).
        first = "LEAST(%(offset)s::bigint, s.message_count) - 1"
        self.get_rows = (
            f"{rows} JOIN {sessions} s ON m.sid = s.sid WHERE s.id = %(id)s "
            f"AND m.idx >= {first} AND m.idx < CASE WHEN s.message_count <= {first} + "
            f"%(upto)s::bigint THEN {_ALL_ROWS} ELSE {first} + %(upto)s::bigint END"
        )
        self.rest_rows = (
            f"{rows} JOIN {sessions} s ON m.sid = s.sid WHERE s.id = %(id)s "
            "AND s.sid = %(sid)s AND s.tail = %(tail)s AND m.idx >= %(from)s::bigint"
        )
        self.page_rows = (
            f"{rows} JOIN {sessions} s ON m.sid = s.sid WHERE s.id = %(id)s "
            "AND m.idx >= LEAST(%(offset)s, s.message_count) - 2 "
            "AND m.idx < %(offset)s + %(limit)s + 1 ORDER BY m.idx"
        )
        self.list = (
            "SELECT id, created_at, updated_at, message_count, "
            f"extract(epoch FROM touched_at)::float8 FROM {sessions} "
            f"WHERE id > %(after)s AND {fresh} ORDER BY id LIMIT %(limit)s"
        )
        # gc (with a ttl): expired sessions that still hold messages or a state;
        # purging them keeps the row (the tombstone) and the checkpoints.
        alive = holder_alive("l")
        no_live_lease = (
            f"NOT EXISTS (SELECT 1 FROM {leases} l WHERE l.session_id = s.id "
            f"AND l.expires_at > now() AND {alive})"
        )
        stale = f"NOT ({fresh.replace('touched_at', 's.touched_at')}) AND {no_live_lease}"
        held = "s.tail NOT LIKE 'expired-%%'"  # not purged yet (a tail is "<n>-<hex>")
        self.expired = (
            "SELECT s.id, to_char(s.touched_at AT TIME ZONE 'UTC', "
            """'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), s.message_count """
            f"FROM {sessions} s WHERE {stale} AND {held} ORDER BY s.id FOR UPDATE OF s"
        )
        self.purge_expired = (
            f"WITH gone AS (UPDATE {sessions} s SET message_count = 0, head = '{ZERO_HASH}', "
            "state = NULL, state_hash = NULL, tail = 'expired-' || s.sid "
            f"WHERE {stale} AND {held} RETURNING s.sid) "
            f"DELETE FROM {messages} WHERE sid IN (SELECT sid FROM gone)"
        )
        self.drop_tombstones = (
            f"DELETE FROM {sessions} s WHERE s.touched_at < now() - "
            f"%(tomb)s * interval '1 second' AND NOT ({held}) AND {no_live_lease}"
        )
        self.create = (
            f"WITH made AS (INSERT INTO {sessions} (id, created_at, updated_at, "
            "message_count, head, writes, tail) VALUES (%(id)s, %(created)s, %(created)s, 0, "
            "%(zero)s, 0, %(tail)s) ON CONFLICT (id) DO NOTHING RETURNING sid), "
            f"gone AS (DELETE FROM {q}.perdure_checkpoints WHERE session_id = %(id)s "
            "AND EXISTS (SELECT 1 FROM made)) SELECT sid FROM made"
        )
        self.lock_existing = (
            f"SELECT {columns}, {expired} FROM {sessions} WHERE id = %(id)s FOR UPDATE"
        )
        self.restart = (
            f"UPDATE {sessions} SET created_at = %(created)s, updated_at = %(created)s, "
            "message_count = 0, head = %(zero)s, writes = 0, tail = %(tail)s, state = NULL, "
            "state_hash = NULL, touched_at = now() WHERE sid = %(sid)s"
        )
        self.delete_rows = f"DELETE FROM {messages} WHERE sid = %(sid)s"
        self.delete_session = f"DELETE FROM {sessions} WHERE sid = %(sid)s"
        self.delete_checkpoints = f"DELETE FROM {q}.perdure_checkpoints WHERE session_id = %(id)s"
        self.lock_sid = f"SELECT sid FROM {sessions} WHERE id = %(id)s FOR UPDATE"
        self.lease_of = (
            f"SELECT token, expires_at > now() AND {alive}, owner FROM {leases} l "
            "WHERE session_id = %(id)s"
        )
        self.delete_lease = f"DELETE FROM {leases} WHERE session_id = %(id)s AND token = %(token)s"
        self.insert_rows = (
            f"INSERT INTO {messages} (sid, idx, body, hash) SELECT %(sid)s, * FROM "
            "unnest(%(idxs)s::bigint[], %(bodies)s::text[], %(hashes)s::text[])"
        )
        self.row_hashes = (
            f"SELECT idx, hash FROM {messages} "
            "WHERE sid = %(sid)s AND idx = ANY(%(idxs)s::bigint[])"
        )
        self.redact = (
            f"UPDATE {messages} m SET redacted = r.text, redacted_hash = r.hash FROM "
            "unnest(%(idxs)s::bigint[], %(texts)s::text[], %(hashes)s::text[]) "
            "AS r(idx, text, hash) "
            "WHERE m.sid = %(sid)s AND m.idx = r.idx"
        )
        self.resolve = (
            f"SELECT s.tail, s.message_count, (SELECT hash FROM {messages} m "
            "WHERE m.sid = s.sid AND m.idx = %(idx)s) "
            f"FROM {sessions} s WHERE s.id = %(id)s"
        )
        self.why = (
            f"SELECT s.sid, s.created_at, s.updated_at, s.message_count, s.head, s.writes, "
            f"s.tail, s.state_hash, {expired.replace('touched_at', 's.touched_at')}, "
            "m.body, m.redacted, l.token, l.owner, l.expires_at > now() AND "
            f"{alive} FROM (SELECT %(id)s::text AS id) k "
            f"LEFT JOIN {sessions} s ON s.id = k.id "
            f"LEFT JOIN {messages} m ON m.sid = s.sid AND m.idx = s.message_count - 1 "
            f"LEFT JOIN {leases} l ON l.session_id = k.id"
        )
        self._commits: dict[tuple[int, bool, bool], str] = {}
        self._loop_commits: dict[tuple[int, bool, bool], LoopStatement] = {}
        # A page as one statement (one snapshot): the session row on every row read,
        # once alone when the range holds none.
        self.loop_page = LoopStatement(
            f"SELECT s.sid, s.created_at, s.updated_at, s.message_count, s.head, s.writes, "
            f"s.tail, s.state_hash, m.idx, m.body, m.hash, m.redacted, m.redacted_hash "
            f"FROM {sessions} s LEFT JOIN {messages} m ON m.sid = s.sid "
            "AND m.idx >= LEAST(%(offset)s::bigint, s.message_count) - 2 "
            "AND m.idx < %(offset)s::bigint + %(limit)s::bigint + 1 "
            f"WHERE s.id = %(id)s AND {fresh.replace('touched_at', 's.touched_at')} "
            "ORDER BY m.idx"
        )
        self._sessions, self._messages, self._leases = sessions, messages, leases

    def loop_commit(self, rows: int, state: bool, leased: bool) -> LoopStatement:
        """:meth:`commit` as a loop connection sends it."""
        key = (min(rows, 2), state, leased)
        found = self._loop_commits.get(key)
        if found is None:
            found = self._loop_commits[key] = LoopStatement(self.commit(rows, state, leased))
        return found

    def commit(self, rows: int, state: bool, leased: bool) -> str:
        """The one-statement commit: checked UPDATE of the session row, then its rows.

        ``rows``: how many new rows it inserts (0, 1 or more: arrays);
        ``state``: it replaces the agent state; ``leased``: it names a lease's token.
        """
        key = (min(rows, 2), state, leased)
        found = self._commits.get(key)
        if found is not None:
            return found
        sets = (
            "updated_at = %(now)s, message_count = %(count)s::bigint, head = %(head)s, "
            "writes = %(writes)s::bigint, tail = %(tail)s, touched_at = now()"
        )
        if state:
            sets += ", state = %(state)s, state_hash = %(state_hash)s"
        if leased:
            lease = (
                f"EXISTS (SELECT 1 FROM {self._leases} WHERE session_id = %(id)s "
                "AND token = %(token)s::bigint AND owner = %(owner)s)"
            )
        else:
            lease = (
                f"NOT EXISTS (SELECT 1 FROM {self._leases} l WHERE l.session_id = %(id)s "
                f"AND l.expires_at > now() AND {holder_alive('l')})"
            )
        statement = (
            f"WITH cas AS (UPDATE {self._sessions} SET {sets} WHERE id = %(id)s "
            f"AND tail = %(seen)s AND {self.fresh} AND {lease} RETURNING sid)"
        )
        if rows == 1:
            statement += (
                f", ins AS (INSERT INTO {self._messages} (sid, idx, body, hash) "
                "SELECT sid, %(idx)s::bigint, %(body)s::text, %(hash)s::text FROM cas)"
            )
        elif rows > 1:
            statement += (
                f", ins AS (INSERT INTO {self._messages} (sid, idx, body, hash) "
                "SELECT cas.sid, t.idx, t.body, t.hash FROM cas, "
                "unnest(%(idxs)s::bigint[], %(bodies)s::text[], %(hashes)s::text[]) "
                "AS t(idx, body, hash))"
            )
        statement += " SELECT count(*) FROM cas"
        self._commits[key] = statement
        return statement
