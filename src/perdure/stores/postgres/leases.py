"""Writer leases on PostgreSQL: one writer per session, across processes and machines.

A lease is a row of ``perdure_leases``: the session id, the holder (``owner``, a
random id per store instance and process), a **fencing token** (from a sequence,
so never given twice) and an expiry. It is taken with one statement that succeeds
only when the session has no lease, or its lease expired, or its holder is gone —
or when the holder is this owner, so that a retry after a lost answer is safe.
Anything else is :class:`~perdure.errors.SessionLockedError`, at once.

Every commit made under the lease names its token in the same statement that checks
the session's tail (see :mod:`.sessions`): a writer whose lease was taken over
(it stalled past the expiry, or lost the server for that long) can no longer commit.

**A crashed holder** is detected two ways. Its lease expires ``lease`` seconds after
its last renewal (a machine that vanished). Sooner, when only its process died: a
lease records the server process (``pg_backend_pid()`` and its start time) of the
connection its holder keeps for leases, and that server process ends as soon as
the client's socket closes — so a lease whose connection is gone from
``pg_stat_activity`` is free at once, as an ``flock`` is when its process dies.
(A holder whose server process the other side cannot see — another role without
``pg_read_all_stats`` sees the pid only — is taken for alive: only its expiry frees
it, never a guess.)

While leases are held, a daemon thread renews them every third of ``lease`` on the
keeper's connection; a lease it finds taken over is marked lost (commits under it
fail by the token anyway). Everything is per process: a child made by ``fork()``
holds none of its parent's leases and opens its own connection.

**Many sessions in one process** share the keeper's one connection for their
acquires (the lease names its server process): acquires that arrive while it is busy
go together, in one pipeline. A release needs no holder pid and runs on a pooled
connection instead. From an event loop both go, when they can, on a loop connection
(:meth:`LeaseKeeper.acquire_on_loop`, no worker thread): the lease then names the
keeper's connection as its holder, which stays open while it is held; a take whose
caller was cancelled finishes and gives back what it took. Lease writes are made
without waiting for a flush of their own (``synchronous_commit`` off, for the
statement's own transaction): a commit made under a lease is flushed with everything
logged before it, the lease included, and a release lost to a server crash expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from typing import Any

import psycopg

from perdure._runtime.postgres import (
    DRIVER_ERRORS,
    LoopConnection,
    LoopStatement,
    PostgresDatabase,
    pg_fault,
    run_detached,
)
from perdure._runtime.threads import PerProcess
from perdure.errors import SessionLockedError

__all__ = ["LeaseKeeper", "holder_alive"]

_log = logging.getLogger(__name__)


def holder_alive(lease: str) -> str:
    """SQL that is true while the lease row ``lease``'s holder connection is alive."""
    # pg_stat_get_activity(pid) reads that one server process, where the view
    # pg_stat_activity would read them all.
    return (
        f"EXISTS (SELECT 1 FROM pg_stat_get_activity({lease}.holder_pid) a "
        f"WHERE a.backend_start IS NULL OR a.backend_start = {lease}.holder_start)"
    )


class _Want:
    """One ``acquire`` waiting for the keeper: its session, then its outcome."""

    __slots__ = ("done", "outcome", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.done = False
        self.outcome: int | BaseException | None = None  # token, refusal or error


class _Keeper:
    """One process's leases of one store: its connection, tokens and renewing thread."""

    def __init__(self) -> None:
        self.owner = secrets.token_hex(12)
        self.lock = threading.Lock()
        self.wanting = threading.Lock()  # guards wanted
        self.wanted: list[_Want] = []  # acquires waiting for the keeper
        self.conn: psycopg.Connection[Any] | None = None
        # The connection's server process and its start time, as one value: a loop
        # reads them without the lock, and must not pair a new pid with an old start.
        self.holder: tuple[int, Any] | None = None
        self.held: dict[str, int] = {}  # session id -> token
        self.lost: set[str] = set()
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.closing = False


class LeaseKeeper:
    """The writer leases one store instance holds (see the module docstring).

    Args:
        db: the store's database.
        lease: seconds a lease lasts without renewal (a crashed machine's lease is
            free after that).
    """

    def __init__(self, db: PostgresDatabase, lease: float) -> None:
        self._db = db
        self.lease = lease
        q = db.q
        self._seq = f"{q}.perdure_lease_tokens"
        alive = holder_alive("l")
        acquire = (
            f"INSERT INTO {q}.perdure_leases AS l "
            "(session_id, owner, token, expires_at, holder_pid, holder_start) "
            "SELECT %(id)s, %(owner)s, nextval(%(seq)s::regclass), "
            "now() + %(lease)s::float8 * interval '1 second', {pid}, %(started)s::timestamptz "
            # Without waiting for a flush of its own (see the module docstring): so
            # on any connection, as on the keeper's (where it is off already).
            "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS quick "
            "ON CONFLICT (session_id) DO UPDATE SET owner = EXCLUDED.owner, "
            "token = EXCLUDED.token, expires_at = EXCLUDED.expires_at, "
            "holder_pid = EXCLUDED.holder_pid, holder_start = EXCLUDED.holder_start "
            f"WHERE l.owner = EXCLUDED.owner OR l.expires_at <= now() OR NOT {alive} "
            "RETURNING token"
        )
        self._acquire_sql = acquire.replace("{pid}", "pg_backend_pid()")
        # The same on a loop connection: the holder named is the keeper's connection,
        # which stays open while the lease is held (the loop's may not).
        self._loop_acquire = LoopStatement(acquire.replace("{pid}", "%(pid)s::integer"))
        # Given back without waiting for a flush of its own (see the module docstring):
        # the lease of a token, or (after a take the caller stopped waiting for) this
        # owner's, whatever its token.
        release = (
            "WITH quick AS (SELECT set_config('synchronous_commit', 'off', true)) "
            f"DELETE FROM {q}.perdure_leases WHERE session_id = %(id)s AND {{which}} "
            "AND EXISTS (SELECT 1 FROM quick)"
        )
        self._release_sql = release.format(which="token = %(token)s::bigint")
        self._forget_sql = release.format(which="owner = %(owner)s")
        self._loop_release = LoopStatement(self._release_sql)
        self._renew_sql = (
            f"UPDATE {q}.perdure_leases SET expires_at = now() + %(lease)s * interval '1 second', "
            "holder_pid = pg_backend_pid(), holder_start = %(started)s "
            "WHERE owner = %(owner)s AND (session_id, token) IN "
            "(SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::bigint[])) RETURNING session_id"
        )
        self._holder_sql = (
            "SELECT extract(epoch FROM expires_at - now()), "
            f"{alive} FROM {q}.perdure_leases l WHERE session_id = %(id)s"
        )
        self._state: PerProcess[_Keeper] = PerProcess(_Keeper)
        self._settling: set[asyncio.Task[Any]] = set()  # see acquire_on_loop

    @property
    def owner(self) -> str:
        """This process's owner id for the store's leases."""
        return self._state.value.owner

    def token(self, session_id: str) -> int | None:
        """The fencing token of the lease held on ``session_id`` (None: not held)."""
        return self._state.value.held.get(session_id)

    def is_lost(self, session_id: str) -> bool:
        """Whether the lease held on ``session_id`` was found taken over."""
        return session_id in self._state.value.lost

    def acquire(self, session_id: str) -> int:
        """Take the session's lease and return its token (blocking: run in a thread).

        Acquires made at once from many threads go together: whoever gets the
        keeper's connection sends every acquire waiting in one pipeline (one round
        trip), so many sessions of one process do not queue on it one by one.

        Raises:
            SessionLockedError: another live writer holds it; never waits.
            StoreUnavailableError: the server could not be reached.
        """
        keeper = self._state.value
        want = _Want(session_id)
        with keeper.wanting:
            keeper.wanted.append(want)
        with keeper.lock:
            if not want.done:  # nobody took it with theirs: take every one waiting
                with keeper.wanting:
                    batch, keeper.wanted = keeper.wanted, []
                self._acquire_together(keeper, batch)
        outcome = want.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    def _acquire_together(self, keeper: _Keeper, batch: list[_Want]) -> None:
        """Send the acquires of ``batch`` in one pipeline; each gets its outcome (under
        ``keeper.lock``)."""

        def send(conn: psycopg.Connection[Any]) -> list[Any]:
            # keeper.holder is known once the connection is (on this call, or again
            # after a reconnect)
            shared = {
                "owner": keeper.owner,
                "seq": self._seq,
                "lease": self.lease,
                "started": keeper.holder[1] if keeper.holder else None,
            }
            with conn.pipeline():
                cursors = [
                    conn.execute(self._acquire_sql, {"id": want.session_id, **shared})
                    for want in batch
                ]
            return [cursor.fetchone() for cursor in cursors]

        try:
            doing = f"taking the writer lease of session {batch[0].session_id!r}"
            if len(batch) > 1:
                doing = f"taking the writer leases of {len(batch)} sessions"
            rows = self._on_keeper(keeper, send, doing)
        except BaseException as exc:
            for want in batch:
                want.outcome, want.done = exc, True
            raise
        for want, row in zip(batch, rows, strict=True):
            if row is None:
                want.outcome = self._locked(keeper, want.session_id)
            else:
                token = int(row[0])
                keeper.held[want.session_id] = token
                keeper.lost.discard(want.session_id)
                want.outcome = token
            want.done = True
        self._start_renewing(keeper)

    def _start_renewing(self, keeper: _Keeper) -> None:
        """Start the renewing thread if leases are held and it is not running (under
        ``keeper.lock``)."""
        if keeper.held and (keeper.thread is None or not keeper.thread.is_alive()):
            keeper.closing = False
            keeper.wake.clear()
            keeper.thread = threading.Thread(
                target=self._renew_while_held,
                args=(keeper,),
                name="perdure-postgres-leases",
                daemon=True,
            )
            keeper.thread.start()

    def release(self, session_id: str) -> None:
        """Give the session's lease back (blocking: run in a thread).

        A release that cannot reach the server is logged, not raised: the lease
        then expires by itself, and the next writer waits at most that long.
        """
        keeper = self._state.value
        with keeper.lock:
            token = keeper.held.pop(session_id, None)
            keeper.lost.discard(session_id)
        if token is None:
            return
        self._delete(session_id, token)

    def _delete(self, session_id: str, token: int | None) -> None:
        """Delete the session's lease of ``token`` (None: of this owner), in this thread.

        On a pooled connection, not the keeper's: a release needs no holder pid, and
        the keeper's one connection (every acquire of the process goes through it, one
        at a time) is what many sessions in one process queue on. Without a flush of
        its own, as on the keeper: lost to a server crash, the lease expires by
        itself, as after a release that could not reach the server — which is logged,
        not raised.
        """
        sql = self._release_sql if token is not None else self._forget_sql
        params = {"id": session_id, "token": token, "owner": self._state.value.owner}
        try:
            self._db.call(
                lambda conn: conn.execute(sql, params),
                doing=f"releasing the writer lease of session {session_id!r}",
            )
        except Exception as exc:  # the lease expires by itself
            _log.warning("%s; it expires in %g s", exc, self.lease)

    async def acquire_on_loop(self, session_id: str) -> bool:
        """Take the session's lease on a loop connection, without a worker thread.

        False: it was not taken this way — no loop connection idle, the keeper's
        connection not open yet, a refusal or an error — and :meth:`acquire` (in a
        thread) takes it or says why. A cancelled wait gives back whatever it took.
        """
        keeper = self._state.value
        named, keeping = keeper.holder, keeper.conn
        if named is None or keeping is None or keeping.closed or keeping.broken:
            return False  # the thread path (re)opens the keeper's connection first
        pid, started = named
        conn = await self._db.take_loop_connection()
        if conn is None:
            return False
        params = {
            "id": session_id,
            "owner": keeper.owner,
            "seq": self._seq,
            "lease": repr(self.lease),
            "pid": pid,
            "started": None if started is None else started.isoformat(),
        }
        try:
            result = await conn.execute(self._loop_acquire, params)
        except DRIVER_ERRORS as exc:
            self._db.give_back(conn, reusable=pg_fault(exc) != "unavailable")
            return False
        except BaseException:  # cancelled: the take goes on, and is given back
            run_detached(self._settling, self._give_back_when_taken(conn, session_id))
            raise
        self._db.give_back(conn, reusable=True)
        token = result.get_value(0, 0) if result.ntuples else None
        if token is None:
            return False  # refused: acquire() reads the holder for the error
        keeper.held[session_id] = int(token)
        keeper.lost.discard(session_id)
        thread = keeper.thread
        if thread is None or not thread.is_alive():
            # The renewer leaves when it finds nothing held, under the keeper's lock;
            # this lease is in `held` already, so one started now will renew it.
            with keeper.lock:
                self._start_renewing(keeper)
        return True

    async def release_on_loop(self, session_id: str) -> bool:
        """Give the session's lease back on a loop connection, without a worker thread.

        False: nothing was done (no loop connection idle); call :meth:`release`.
        """
        keeper = self._state.value
        token = keeper.held.get(session_id)
        if token is None:
            return True
        conn = await self._db.take_loop_connection()
        if conn is None:
            return False
        keeper.held.pop(session_id, None)
        keeper.lost.discard(session_id)
        try:
            await conn.execute(self._loop_release, {"id": session_id, "token": token})
        except BaseException as exc:
            lost = not isinstance(exc, DRIVER_ERRORS) or pg_fault(exc) == "unavailable"
            self._db.give_back(conn, reusable=not lost)
            self._give_back_later(session_id, token)
            if not isinstance(exc, DRIVER_ERRORS):
                raise
            return True
        self._db.give_back(conn, reusable=True)
        return True

    async def _give_back_when_taken(self, conn: LoopConnection, session_id: str) -> None:
        """Wait for a take whose caller was cancelled; give back what it took."""
        token: bytes | None = None
        try:
            result = await conn.result()
            token = result.get_value(0, 0) if result.ntuples else None
            if token is not None:
                await conn.execute(self._loop_release, {"id": session_id, "token": int(token)})
        except BaseException:
            self._db.give_back(conn, reusable=False)
            self._give_back_later(session_id, None if token is None else int(token))
            raise
        self._db.give_back(conn, reusable=True)

    def _give_back_later(self, session_id: str, token: int | None) -> None:
        """:meth:`_delete` in a thread of its own: after a cancelled or failed
        statement on a loop connection."""
        threading.Thread(
            target=self._delete, args=(session_id, token), name="perdure-lease-release", daemon=True
        ).start()

    def close(self) -> None:
        """Release every lease this process holds and close the keeper's connection."""
        keeper = self._state.value
        for session_id in list(keeper.held):
            self.release(session_id)
        with keeper.lock:
            keeper.closing = True
            keeper.wake.set()
            conn, keeper.conn = keeper.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    # ------------------------------------------------------------------ internals

    def _on_keeper(self, keeper: _Keeper, work: Any, doing: str) -> Any:
        """``work(conn)`` on the keeper's connection (under ``keeper.lock``), reconnecting
        while the server cannot be reached, up to the database's reconnect timeout.

        Every statement here is safe to repeat: a lease is retaken by its own owner.
        """
        deadline: float | None = None
        while True:
            try:
                return work(self._keeper_conn(keeper))
            except DRIVER_ERRORS as exc:
                self._drop(keeper)
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._db.reconnect_timeout
                if pg_fault(exc) != "unavailable" or now >= deadline:
                    raise self._db.translate(exc, doing) from exc
                time.sleep(0.1)

    def _keeper_conn(self, keeper: _Keeper) -> psycopg.Connection[Any]:
        conn = keeper.conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._drop(keeper)
        conn = self._db.connect()
        try:
            # Lease writes need no flush of their own: a commit made under a lease is
            # flushed with everything logged before it, the lease included, and a
            # lease lost to a server crash only refuses its holder's next commit (the
            # commit names the owner as well as the token, which a crash could hand
            # out again).
            conn.execute("SET synchronous_commit TO off")
            row = conn.execute(
                "SELECT pg_backend_pid(), (SELECT backend_start FROM pg_stat_activity "
                "WHERE pid = pg_backend_pid())"
            ).fetchone()
        except BaseException:
            conn.close()
            raise
        assert row is not None
        keeper.holder = (int(row[0]), row[1])
        keeper.conn = conn
        return conn

    def _drop(self, keeper: _Keeper) -> None:
        conn, keeper.conn, keeper.holder = keeper.conn, None, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _locked(self, keeper: _Keeper, session_id: str) -> SessionLockedError:
        details: dict[str, Any] = {"session_id": session_id, "reason": "leased"}
        with contextlib.suppress(Exception):  # the refusal stands without the detail
            row = self._on_keeper(
                keeper,
                lambda conn: conn.execute(self._holder_sql, {"id": session_id}).fetchone(),
                "reading a lease",
            )
            if row is not None:
                details["expires_in"] = round(float(row[0]), 3)
        left = details.get("expires_in")
        when = f"; its lease expires in {left:.1f} s unless renewed" if left is not None else ""
        return SessionLockedError(
            f"session {session_id!r} is locked by another writer: another process or "
            f"machine holds its writer lease{when} ({self._db.where})",
            details=details,
        )

    def _renew_while_held(self, keeper: _Keeper) -> None:
        interval = self.lease / 3
        while True:
            keeper.wake.wait(interval)
            with keeper.lock:
                if keeper.closing or not keeper.held:
                    keeper.thread = None
                    return
                held = dict(keeper.held)
                try:
                    rows = self._on_keeper(
                        keeper,
                        lambda conn, held=held: conn.execute(
                            self._renew_sql,
                            {
                                "lease": self.lease,
                                "started": keeper.holder[1] if keeper.holder else None,
                                "owner": keeper.owner,
                                "ids": list(held),
                                "tokens": list(held.values()),
                            },
                        ).fetchall(),
                        "renewing writer leases",
                    )
                except Exception as exc:  # tried again at the next beat
                    _log.warning("%s", exc)
                    continue
                renewed = {row[0] for row in rows}
                for session_id in held:
                    if session_id not in renewed and session_id not in keeper.lost:
                        keeper.lost.add(session_id)
                        _log.warning(
                            "the writer lease of session %r in %s was taken over by "
                            "another writer; commits under it will be refused",
                            session_id,
                            self._db.where,
                        )
