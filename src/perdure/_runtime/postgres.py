"""PostgreSQL plumbing every PostgreSQL backend of perdure shares (layer 0).

One :class:`PostgresDatabase` is one database and one schema as a backend sees it:

- **Connections**: a ``psycopg_pool.ConnectionPool`` per process, opened on first use
  (constructors do no I/O). A child made by ``fork()`` opens its own: the parent's
  connections share their sockets with the parent and are never used (nor closed)
  there. Connections are in autocommit mode: a statement is its own transaction
  unless the caller opens one.
- **Any loop, any thread** (SPEC §7): psycopg's blocking calls run in worker threads
  (``asyncio.to_thread``) on connections from the thread-safe pool; nothing is bound
  to an event loop, so a coroutine may be awaited from any loop in any thread. A
  backend's hottest statement may instead go on a :class:`LoopConnection`
  (:meth:`PostgresDatabase.loop_connection`), awaited on the running loop's own
  selector: the hop to a thread and back costs about half a local round trip.
  Those connections belong to no loop (one user at a time, any loop); they are
  opened in the background, and a call that finds none idle takes the pool's path.
- **The schema**: each backend names the tables it needs (a :class:`SchemaPart`,
  under a component name and a version). On first use in a process they are created
  in the store's schema (``CREATE SCHEMA``/``CREATE TABLE IF NOT EXISTS``, under a
  transaction-level advisory lock so that two processes creating it at once do not
  collide), and the component's version is recorded in the schema's
  ``perdure_schema_version`` table. A schema recorded with another version than
  this perdure's is refused (the layer's ``version`` error) before anything is read
  or written, and so is a table of ours whose columns are not the ones we made
  (``damage``, kind ``bad_schema``).
- **Upgrades** are explicit: a :class:`SchemaPart` declares the step from each older
  version to the next, and :meth:`PostgresDatabase.migrate` (``perdure
  migrate-schema``) runs them, each step one transaction under the same advisory
  lock, recording the version it reaches. Opening a store never upgrades: a schema
  other processes may be using, and tables that may be large, are changed when an
  operator says so (after a backup, with ``--dry-run`` first), not by whichever
  process happens to start first. An older schema is refused with the command that
  upgrades it; a newer one with "upgrade perdure".
- **Errors**: psycopg's exceptions never leak. :func:`pg_fault` sorts each into one
  of six faults and :meth:`PostgresDatabase.translate` turns it into the error the
  layer names for that fault (:class:`PostgresErrors`), as :mod:`._runtime.sqlite`
  does for SQLite:

  - ``unavailable``: the server cannot be reached — refused, down, restarting
    (``57P01``-``57P03``), the connection lost (class ``08``), too many clients —
    or no pooled connection came within ``connect_timeout`` (``PoolTimeout``: the
    message says whether all ``max_connections`` were busy, ``details["reason"] ==
    "pool_busy"``, or none could be opened). Reads retry it transparently until
    ``reconnect_timeout``; writes decide for themselves (only the backend knows
    whether a write it sent may have landed; one that got no connection sent nothing).
  - ``cancelled``: the server cancelled the statement (``57014``:
    ``statement_timeout``, or ``pg_cancel_backend``): its transaction rolled back,
    nothing of it applied. The layer's ``unavailable`` error too (the server could
    not serve it in time; later may succeed), ``details["reason"]``
    ``"statement_timeout"`` or ``"cancelled"``, never retried: a statement that ran
    out of time would only run out of it again.
  - ``locked``: a lock the statement needed was not available (``55P03``), a
    deadlock or a serialization failure (``40P01``, ``40001``).
  - ``damage``: the server reports damaged data (``XX001``, ``XX002``), or the schema
    was altered behind perdure's back (a table or column of ours gone: ``42P01``,
    ``42703``, ``3F000``).
  - ``bug``: the server refused perdure's own statement (any other ``42``, ``22`` or
    ``23`` error): :class:`PostgresBugError`, never reported as damage.
  - ``failure``: anything else — authentication, a missing database, privileges, a
    full disk, out of memory: the layer's general error.

Every message names the server as ``postgresql://user@host:port/dbname`` (never a
password) and the schema; ``details`` carry ``fault``, ``sqlstate``, ``server`` and
``schema`` (and ``outcome`` for a write that says it, see
:meth:`PostgresDatabase.translate`).

This module imports psycopg: only the PostgreSQL backends import it, lazily, so that
``import perdure`` never does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import quote_plus

try:
    import psycopg
    import psycopg_pool
    from psycopg import pq
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"perdure's PostgreSQL backends need psycopg 3 and psycopg_pool ({exc}): "
        "pip install 'perdure[postgres]'"
    ) from exc

from perdure._runtime.loop import running_loop
from perdure._runtime.sqlite import ErrorFactory
from perdure._runtime.threads import PerProcess, ProcessLock

__all__ = [
    "DRIVER_ERRORS",
    "DURABLE_COMMITS",
    "NO_FLUSH_WAIT",
    "VERSION_TABLE",
    "LoopConnection",
    "LoopStatement",
    "PostgresBugError",
    "PostgresDatabase",
    "PostgresErrors",
    "PostgresFault",
    "SchemaMigration",
    "SchemaPart",
    "check_schema_name",
    "pg_fault",
    "quote_ident",
    "run_detached",
    "schema_lock_key",
    "server_display",
]

T = TypeVar("T")

_log = logging.getLogger(__name__)

DRIVER_ERRORS = (psycopg.Error,)
"""What psycopg and psycopg_pool raise (``PoolTimeout`` is a ``psycopg.OperationalError``)."""

VERSION_TABLE = "perdure_schema_version"
"""The table, in each schema perdure uses, that records each component's version."""

PostgresFault = Literal["unavailable", "cancelled", "locked", "damage", "bug", "failure"]

_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "08000", "08001", "08003",
                                 "08004", "08006", "08007", "08P01"})  # fmt: skip
_LOCKED_STATES = frozenset({"55P03", "40P01", "40001"})
_DAMAGE_STATES = frozenset({"XX001", "XX002", "42P01", "42703", "3F000"})
_CANCELLED = "57014"  # query_canceled: statement_timeout, pg_cancel_backend()
# What a server says, at connect, while it cannot take connections for now (the
# driver gives no SQLSTATE for a failed connection, only the server's text).
_TRANSIENT_FATAL = (
    "the database system is",  # starting up, shutting down, in recovery mode
    "too many clients",
    "remaining connection slots",
    "terminating connection",
)


class PostgresBugError(RuntimeError):
    """The server refused one of perdure's own statements: a bug in perdure, not damage."""


class PostgresErrors(NamedTuple):
    """The public error one layer raises for each fault (``bug`` is always
    :class:`PostgresBugError`)."""

    unavailable: ErrorFactory
    """The server cannot be reached (down, restarting, connection lost), no pooled
    connection came in time, or the server cancelled the statement (timed out)."""
    locked: ErrorFactory
    """A lock the statement needed was held by another transaction."""
    damage: ErrorFactory
    """Stored data or the schema is not what perdure wrote."""
    failure: ErrorFactory
    """Anything else the server or the environment refused."""
    version: ErrorFactory
    """The schema was made by a perdure whose schema version this one does not know."""


def pg_fault(exc: BaseException) -> PostgresFault:
    """Which of the five faults (see the module docstring) a driver error is."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return "unavailable"
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None:
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            text = str(exc)
            if "FATAL:" in text and not any(words in text for words in _TRANSIENT_FATAL):
                return "failure"  # refused at connect: no such database, role, password
            return "unavailable"  # refused, unreachable, the connection closed or lost
        if isinstance(exc, psycopg.ProgrammingError | psycopg.DataError):
            return "bug"  # refused by the driver before it reached the server
        return "failure"
    if sqlstate in _UNAVAILABLE_STATES or sqlstate.startswith("08"):
        return "unavailable"
    if sqlstate == _CANCELLED:
        return "cancelled"
    if sqlstate in _LOCKED_STATES:
        return "locked"
    if sqlstate in _DAMAGE_STATES:
        return "damage"
    if sqlstate.startswith(("42", "22", "23")) and sqlstate != "42501":
        return "bug"
    return "failure"


DURABLE_COMMITS = (
    "SELECT set_config('synchronous_commit', 'on', false) "
    "WHERE current_setting('synchronous_commit') = 'off'"
)
"""A ``configure`` statement for :class:`PostgresDatabase`: a connection's commits wait
for the server's WAL flush (``synchronous_commit``) should the server's default turn it
off, so a write is durable when it returns (a stronger setting is left as it is)."""

NO_FLUSH_WAIT = "SET synchronous_commit TO off"
"""A ``configure`` statement: commits return before the server flushes its WAL."""


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (any text without NUL)."""
    return '"' + name.replace('"', '""') + '"'


def check_schema_name(schema: Any) -> str:
    """Return ``schema`` if it can name a PostgreSQL schema.

    Raises:
        TypeError: not a string.
        ValueError: empty, longer than 63 bytes (PostgreSQL would cut it), or
            holding NUL; the message names ``schema``.
    """
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, got {type(schema).__name__}")
    if not schema or "\x00" in schema or len(schema.encode("utf-8", "surrogatepass")) > 63:
        raise ValueError(
            f"schema must be a non-empty name of at most 63 bytes without NUL, got {schema!r}"
        )
    try:
        schema.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"schema {schema!r} is not valid Unicode text") from None
    return schema


def server_display(dsn: str) -> str:
    """``postgresql://user@host:port/dbname`` for a DSN: what messages show, no password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql://(unparsable dsn)"
    user = parts.get("user")
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port")
    name = parts.get("dbname") or ""
    return f"postgresql://{f'{user}@' if user else ''}{host}{f':{port}' if port else ''}/{name}"


def schema_lock_key(schema: str) -> int:
    """The advisory lock key under which a schema's tables are made and upgraded."""
    return zlib.crc32(f"perdure-schema:{schema}".encode()) - 2**31


@dataclass(frozen=True)
class SchemaPart:
    """The tables one backend keeps in a schema, their version, and how to upgrade them.

    Attributes:
        component: the name its version is recorded under (``"sessions"``, say).
        version: the version of these tables this perdure writes (1 or more).
        tables: each table's name and its columns at ``version`` (checked on first
            use: a table of ours with other columns is damage).
        statements: the DDL creating them, at ``version``, in a schema (given
            quoted), all ``IF NOT EXISTS``: run inside the transaction that records
            the version.
        steps: the upgrade from each older version to the next: ``steps[v](q)`` is
            the SQL turning version ``v``'s tables into version ``v + 1``'s (run in
            one transaction with the version's update). The keys run without a gap
            up to ``version - 1``; a schema older than the first key cannot be
            upgraded by this perdure.
        cli_option: the ``perdure migrate-schema`` option naming this backend
            (``--store``, ``--storage``, ``--memory``), for the messages.
        cli_query: what the backend's URL adds after ``?schema=…`` (``&table=…``).

    Raises:
        ValueError: a version below 1, or steps that do not lead to ``version``.
    """

    component: str
    version: int
    tables: Mapping[str, tuple[str, ...]]
    statements: Callable[[str], Sequence[str]]
    steps: Mapping[int, Callable[[str], Sequence[str]]] = field(default_factory=dict)
    cli_option: str = "--store"
    cli_query: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            raise TypeError(f"version must be an int, got {self.version!r}")
        if self.version < 1:
            raise ValueError(f"version must be >= 1, got {self.version}")
        if self.steps and sorted(self.steps) != list(range(min(self.steps), self.version)):
            raise ValueError(
                f"steps of {self.component!r} must upgrade each version to the next up to "
                f"{self.version}, without a gap; got steps from {sorted(self.steps)}"
            )

    @property
    def oldest(self) -> int:
        """The oldest version this perdure can upgrade (``version`` without steps)."""
        return min(self.steps) if self.steps else self.version


@dataclass(frozen=True)
class SchemaMigration:
    """What :meth:`PostgresDatabase.migrate` did to one component's tables, or would do.

    Attributes:
        component: the component (``"sessions"``, ``"memory"``, ``"storage:…"``).
        server: the server, as messages show it (no password).
        schema: the schema.
        before: the version found (``None``: no tables yet). Read under the
            advisory lock, so a process that waited for another's upgrade finds
            it done.
        after: the version the tables are at once it returned (would be, for a
            dry run).
        action: ``"create"`` (no tables: made at the current version),
            ``"upgrade"`` (steps run from ``before`` to ``after``) or ``"none"``.
        steps: each step run (or to run): the version it starts from and its SQL.
        dry_run: nothing was changed.
    """

    component: str
    server: str
    schema: str
    before: int | None
    after: int
    action: Literal["create", "upgrade", "none"]
    steps: tuple[tuple[int, tuple[str, ...]], ...]
    dry_run: bool


class _Pool:
    """This process's pool, whether the schema was checked in it, and its loop
    connections (see :meth:`PostgresDatabase.loop_connection`)."""

    __slots__ = ("busy", "checked", "counting", "direct", "pool")

    def __init__(self) -> None:
        self.pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self.checked = False
        self.direct = _LoopConnections()
        self.busy = 0  # pooled connections handed out and not given back yet
        self.counting = threading.Lock()


class _PoolBusy(psycopg_pool.PoolTimeout):
    """No pooled connection came within the timeout while every one the pool may
    open was handed out: the pool is too small for the work, not the server away.

    A ``PoolTimeout`` still (a driver error, the ``unavailable`` fault), which
    :meth:`PostgresDatabase.translate` words as what it is.
    """

    def __init__(self, size: int, waited: float, timeout: psycopg_pool.PoolTimeout) -> None:
        super().__init__(str(timeout))
        self.size = size
        self.waited = waited
        self.timeout = timeout


class LoopStatement:
    """A statement written with psycopg's ``%(name)s`` parameters, as a
    :class:`LoopConnection` sends it: prepared once per connection (libpq's
    ``$1 … $n``), its parameters sent as text (the server infers their types, as it
    does for psycopg's strings: give casts where a type is not clear from the SQL).

    A parameter may be ``None`` (NULL), a ``str``, an ``int``, or a list of them (an
    array literal).
    """

    __slots__ = ("name", "names", "text")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(0) == "%%":
                return "%"
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        text = re.sub(r"%%|%\((\w+)\)s", number, sql)
        self.text = text.encode()
        self.names = tuple(names)
        self.name = b"perdure_" + hashlib.sha1(self.text).hexdigest()[:20].encode()

    def encode(self, params: Mapping[str, Any]) -> list[bytes | None]:
        """The parameters, in order, as libpq's text values."""
        values: list[bytes | None] = []
        for name in self.names:
            value = params[name]
            # Strings first, and by exact type: a commit sends a dozen of them.
            values.append(value.encode() if type(value) is str else _text_value(value))
        return values


def _text_value(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    if isinstance(value, list):
        return b"{" + b",".join(_array_item(item) for item in value) + b"}"
    raise TypeError(f"a loop statement's parameter must be None, str, int or a list, got {value!r}")


def _array_item(item: Any) -> bytes:
    if item is None:
        return b"NULL"
    if isinstance(item, int) and not isinstance(item, bool):
        return str(item).encode()
    if isinstance(item, str):
        quoted = item.replace("\\", "\\\\").replace('"', '\\"')
        return b'"' + quoted.encode() + b'"'
    raise TypeError(f"an array parameter's item must be None, str or int, got {item!r}")


class LoopConnection:
    """A libpq connection driven by one event loop's selector, without a thread.

    Only what a backend's hottest statement needs: :meth:`prepare`, :meth:`send`
    and :meth:`result` (psycopg's own async layer costs about twice the CPU of its
    blocking one; this costs what the blocking one does). A failed statement
    raises psycopg's error for its SQLSTATE; a lost connection
    ``psycopg.OperationalError``. Autocommit: each statement is its own transaction.
    """

    __slots__ = ("_last", "pgconn", "pid", "prepared")

    def __init__(self, pgconn: pq.abc.PGconn) -> None:
        self.pgconn = pgconn
        self.pid = os.getpid()
        self.prepared: set[bytes] = set()
        self._last: pq.abc.PGresult | None = None

    @property
    def closed(self) -> bool:
        return bool(self.pgconn.status == pq.ConnStatus.BAD)

    def close(self) -> None:
        """Close it (from any thread, with nothing in flight). In a child made by
        ``fork()`` it is left alone: the socket is the parent's too."""
        if os.getpid() == self.pid:
            with contextlib.suppress(Exception):
                self.pgconn.finish()

    async def prepare(self, statement: LoopStatement) -> None:
        """Prepare ``statement`` on this connection, unless it was (one round trip)."""
        if statement.name in self.prepared:
            return
        self.pgconn.send_prepare(statement.name, statement.text)
        # Counted as prepared once sent: a caller cancelled now leaves the answer to
        # whoever reads the connection's next result, and the server prepares it.
        self.prepared.add(statement.name)
        try:
            await self.result()
        except psycopg.Error:
            self.prepared.discard(statement.name)
            raise

    async def execute(self, statement: LoopStatement, params: Mapping[str, Any]) -> pq.abc.PGresult:
        """:meth:`prepare`, :meth:`send` and :meth:`result`: the statement's result."""
        await self.prepare(statement)
        self.send(statement, params)
        return await self.result()

    def send(self, statement: LoopStatement, params: Mapping[str, Any]) -> None:
        """Send the prepared ``statement``; :meth:`result` waits for what it did."""
        self.pgconn.send_query_prepared(statement.name, statement.encode(params))

    async def result(self) -> pq.abc.PGresult:
        """The result of what was sent, once the server answered.

        A cancelled wait leaves the statement in flight: calling this again (from
        the same loop) goes on waiting for it.
        """
        pgconn = self.pgconn
        loop = asyncio.get_running_loop()
        while pgconn.flush():  # the rest of a large statement, as the socket takes it
            await _ready(loop, pgconn.socket, write=True)
        while True:
            pgconn.consume_input()
            while not pgconn.is_busy():
                got = pgconn.get_result()
                if got is None:
                    last, self._last = self._last, None
                    if last is None:
                        raise psycopg.OperationalError("the server sent no result")
                    return self._checked(last)
                self._last = got
            await _ready(loop, pgconn.socket, write=False)

    def _checked(self, result: pq.abc.PGresult) -> pq.abc.PGresult:
        if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            return result
        if result.error_field(pq.DiagnosticField.SQLSTATE) is None:
            message = result.get_error_message("utf-8") or "the connection was lost"
            raise psycopg.OperationalError(message)
        raise psycopg.errors.error_from_result(result, encoding="utf-8")


def run_detached(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` on the running loop as a task nobody awaits (what a cancelled
    caller leaves in flight on a :class:`LoopConnection`): kept in ``tasks`` until
    done, its error retrieved (the coroutine handles what it can)."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)

    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.debug("a detached PostgreSQL task failed: %r", task.exception())

    task.add_done_callback(done)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    """Until ``fd`` is readable (or writable)."""
    waiter = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await waiter
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


class _LoopConnections:
    """A process's loop connections (see :meth:`PostgresDatabase.loop_connection`):
    the open ones (idle or in use), the idle ones, whether one is being opened.
    Changed under the database's guard."""

    __slots__ = ("idle", "opened", "opening", "retry_at", "uses", "waiting")

    def __init__(self) -> None:
        self.idle: list[LoopConnection] = []
        self.opened: set[LoopConnection] = set()
        self.opening = False
        self.retry_at = 0.0
        self.uses = 0
        # Callers of take_loop_connection waiting for one of a full set to be given
        # back, first come first served: (their loop, their future).
        self.waiting: collections.deque[
            tuple[asyncio.AbstractEventLoop, asyncio.Future[LoopConnection | None]]
        ] = collections.deque()

    @property
    def count(self) -> int:
        """How many there are, or will be: open, or being opened."""
        return len(self.opened) + self.opening


class PostgresDatabase:
    """A database and a schema, as one backend uses them (see the module docstring).

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host/db``).
        schema: the schema holding the backend's tables (created on first use).
        part: the backend's tables and their version.
        errors: the layer's error for each fault.
        what: how messages name the backend (``"PostgreSQL session store"``).
        max_connections: the most connections the pool opens in one process.
        connect_timeout: seconds to wait for a connection (a new one, or one from
            the pool while every connection is busy).
        reconnect_timeout: seconds a read goes on retrying while the server cannot
            be reached (restarting, say) before it raises the ``unavailable`` error.
        configure: a statement run on every new connection (session settings:
            :data:`DURABLE_COMMITS`, :data:`NO_FLUSH_WAIT`).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        part: SchemaPart,
        errors: PostgresErrors,
        what: str,
        max_connections: int = 10,
        connect_timeout: float = 10.0,
        reconnect_timeout: float = 15.0,
        configure: str | None = None,
    ) -> None:
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str, got {type(dsn).__name__}")
        try:
            conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise ValueError(f"dsn is not a PostgreSQL connection string: {exc}") from None
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        self.q = quote_ident(schema)
        """The schema, quoted, to build statements with."""
        self.part = part
        self.errors = errors
        self.what = what
        self.server = server_display(dsn)
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self._configure = configure
        self._state: PerProcess[_Pool] = PerProcess(_Pool)
        self._guard = ProcessLock()

    def __repr__(self) -> str:
        return f"PostgresDatabase({self.server!r}, schema={self.schema!r})"

    @property
    def where(self) -> str:
        """How messages name the database and schema."""
        return f"{self.server} (schema {self.schema!r})"

    # ------------------------------------------------------------------ running work

    async def run(self, work: Callable[[psycopg.Connection[Any]], T], *, doing: str) -> T:
        """``work(conn)`` on a pooled connection in a worker thread; retried while the
        server cannot be reached (``work`` must be safe to run again: a read)."""
        return await asyncio.to_thread(self.call, work, doing=doing)

    def call(
        self, work: Callable[[psycopg.Connection[Any]], T], *, doing: str, retry: bool = True
    ) -> T:
        """``work(conn)`` on a pooled connection, in this thread; driver errors translated.

        With ``retry``, an ``unavailable`` fault (the server restarting, the pool's
        connections broken by it) runs ``work`` again on a fresh connection until
        ``reconnect_timeout`` has passed.
        """
        deadline: float | None = None
        delay = 0.05
        while True:
            try:
                with self.connection() as conn:
                    return work(conn)
            except DRIVER_ERRORS as exc:
                if not retry or pg_fault(exc) != "unavailable":
                    raise self.translate(exc, doing) from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.reconnect_timeout
                if now >= deadline:
                    raise self.translate(exc, doing) from exc
                time.sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, 0.5)
                self.discard_broken()  # after the wait: what broke meanwhile goes too

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for the block (driver errors are left to the caller).

        The schema is made and checked on the first use in this process. A
        transaction the block leaves open is rolled back before the connection goes
        back to the pool.
        """
        pool = self._pool()
        state = self._state.value
        with contextlib.ExitStack() as stack:
            started = time.monotonic()
            try:
                conn = stack.enter_context(pool.connection(timeout=self.connect_timeout))
            except psycopg_pool.PoolTimeout as exc:
                if state.busy >= self.max_connections:  # all handed out: the pool is full
                    raise _PoolBusy(self.max_connections, time.monotonic() - started, exc) from exc
                raise
            with state.counting:
                state.busy += 1
            try:
                yield conn
            finally:
                with state.counting:
                    state.busy -= 1
                if conn.info.transaction_status not in (
                    pq.TransactionStatus.IDLE,
                    pq.TransactionStatus.UNKNOWN,
                ):
                    with contextlib.suppress(psycopg.Error):
                        conn.rollback()

    def connect(self) -> psycopg.Connection[Any]:
        """A connection of the caller's own, outside the pool (closed by the caller).

        Raises:
            psycopg.Error: as ``psycopg.connect`` does (left to the caller to translate).
        """
        self._pool()  # the schema first
        return self._connect()

    def loop_connection(self) -> LoopConnection | None:
        """An idle :class:`LoopConnection`, or None: use the pool.

        A statement sent on it is awaited on the running loop's selector, without
        the hop to a worker thread and back that every pooled call pays. It is bound
        to no loop: any loop, in any thread, may take one, one user at a time, and
        gives it back with :meth:`give_back`. Up to ``max_connections`` of them
        exist in a process, besides the pool. They are opened in a worker thread
        once the process asks for them a second time (a lone call never pays for a
        connection it would not use again), after the pool's first connection made
        the schema; a call that finds none idle gets None, so no caller waits for a
        connect. A connect that fails is tried again at most once a second.
        :meth:`close` closes them.
        """
        state = self._state.value
        direct = state.direct
        with self._guard:
            if state.pool is None:  # the schema is checked by the pool's first connection
                return None
            while direct.idle:
                conn = direct.idle.pop()
                if not conn.closed:
                    return conn
                direct.opened.discard(conn)
            direct.uses += 1
            if (
                direct.opening
                or direct.uses < 2
                or direct.count >= self.max_connections
                or time.monotonic() < direct.retry_at
            ):
                return None
            direct.opening = True
        threading.Thread(
            target=self._open_loop_connection,
            args=(state, direct),
            name=f"perdure-pg-open {self.schema}",
            daemon=True,
        ).start()
        return None

    async def take_loop_connection(self) -> LoopConnection | None:
        """:meth:`loop_connection`, waiting for one when all ``max_connections`` are
        open and in use (as a pool's ``getconn`` does), rather than sending its
        caller to a worker thread: past that many concurrent sessions in a process,
        the hop cost more than the wait (16 sessions on 10 connections: 2,800
        against 4,300 messages a second on one VM). None: take the pool's path (no
        connection open yet, or one being opened; the set closed while waiting).

        A statement holds its connection for one round trip, and nobody waits for a
        second one while holding one, so the wait always ends.
        """
        conn = self.loop_connection()
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        with self._guard:  # the set close() may replace: read under the guard
            direct = self._state.value.direct
            if direct.opening or direct.count < self.max_connections or direct.idle:
                return None  # not all in use (one given back meanwhile: take the pool's)
            waiter: asyncio.Future[LoopConnection | None] = loop.create_future()
            direct.waiting.append((loop, waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            with self._guard, contextlib.suppress(ValueError):
                direct.waiting.remove((loop, waiter))
            if waiter.done() and not waiter.cancelled():  # handed one as we were cancelled
                handed = waiter.result()
                if handed is not None:
                    self.give_back(handed, reusable=True)
            raise

    def give_back(self, conn: LoopConnection, *, reusable: bool) -> None:
        """Hand back a connection :meth:`loop_connection` gave: to the first caller
        waiting for one (:meth:`take_loop_connection`), else to the idle ones.

        ``reusable``: its statement finished (well, or refused by the server); false
        after a lost connection or an interrupted statement, and it is closed (a
        caller waiting then takes the pool's path).
        """
        direct = self._state.value.direct
        waiter = None
        handed: LoopConnection | None = None
        with self._guard:
            if conn in direct.opened:  # else close() ran meanwhile
                if reusable and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                    if not direct.waiting:
                        direct.idle.append(conn)
                        return
                    waiter, handed = direct.waiting.popleft(), conn
                else:
                    direct.opened.discard(conn)
                    if direct.waiting:
                        waiter = direct.waiting.popleft()
        if waiter is not None:
            self._hand(waiter, handed)
        if handed is None:
            conn.close()

    def _hand(
        self,
        waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[LoopConnection | None]],
        conn: LoopConnection | None,
    ) -> None:
        """Give ``conn`` (or None: take the pool's path) to a waiting caller, on its loop."""
        loop, future = waiter

        def hand() -> None:
            if future.done():  # its caller was cancelled meanwhile: to the next one
                if conn is not None:
                    self.give_back(conn, reusable=True)
                return
            future.set_result(conn)

        if running_loop() is loop:
            hand()
            return
        try:
            loop.call_soon_threadsafe(hand)
        except RuntimeError:  # that loop is closed: nobody waits there any more
            if conn is not None:
                self.give_back(conn, reusable=True)

    def _open_loop_connection(self, state: _Pool, direct: _LoopConnections) -> None:
        """Open one loop connection (in a thread of its own: libpq's connect blocks)."""
        conn: LoopConnection | None = None
        try:
            conn = self._connect_loop()
        except Exception as exc:  # the pool's path goes on; it reports the server's state
            _log.debug("%s: no loop connection: %s", self.where, exc)
        with self._guard:
            direct.opening = False
            if conn is not None and direct is state.direct:  # else close() ran meanwhile
                direct.opened.add(conn)
                direct.idle.append(conn)
                return
            if conn is None:
                direct.retry_at = time.monotonic() + 1.0
        if conn is not None:
            conn.close()

    def _connect_loop(self) -> LoopConnection:
        conninfo = make_conninfo(
            self.dsn,
            connect_timeout=max(1, round(self.connect_timeout)),
            client_encoding="UTF8",
        )
        pgconn = pq.PGconn.connect(conninfo.encode())
        conn = LoopConnection(pgconn)
        try:
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError(pgconn.get_error_message("utf-8"))
            if self._configure is not None:
                conn._checked(pgconn.exec_(self._configure.encode()))
            pgconn.nonblocking = 1
        except BaseException:
            conn.close()
            raise
        return conn

    def discard_broken(self) -> None:
        """Drop the pool's idle connections that the server closed (after a restart)."""
        pool = self._state.value.pool
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.check()

    def close(self) -> None:
        """Close this process's pool and its loop connections (the next use opens
        others); a loop connection in use is closed when it is given back."""
        with self._guard:
            state = self._state.value
            pool, state.pool = state.pool, None
            direct, state.direct = state.direct, _LoopConnections()
            waiting, direct.waiting = list(direct.waiting), collections.deque()
        for waiter in waiting:  # they take the pool's path, which says the store is closed
            self._hand(waiter, None)
        for conn in direct.idle:
            conn.close()
        if pool is not None:
            pool.close()

    def translate(
        self,
        exc: BaseException,
        doing: str,
        *,
        outcome: Literal["not_applied", "unknown"] | None = None,
    ) -> Exception:
        """The layer's error for a driver error met while ``doing`` (see the module).

        ``outcome``: for a write, whether it was applied (``"not_applied"``: provably
        not, ``"unknown"``), put in the ``unavailable`` error's ``details`` and said
        in its message; other faults of a write are raised before or instead of it.
        """
        fault = pg_fault(exc)
        sqlstate = getattr(exc, "sqlstate", None)
        text = _driver_text(exc.timeout if isinstance(exc, _PoolBusy) else exc)
        head = f"{self.what} {self.where}: {doing}"
        if fault == "bug":
            return PostgresBugError(f"{head}: perdure's SQL failed: {text}")
        details: dict[str, Any] = {
            "fault": fault,
            "sqlstate": sqlstate,
            "server": self.server,
            "schema": self.schema,
        }
        if fault in ("unavailable", "cancelled"):
            if outcome is not None:
                details["outcome"] = outcome
            said = {
                None: "",
                "not_applied": "; nothing of it was applied",
                "unknown": "; whether it was applied cannot be told",
            }[outcome]
            if isinstance(exc, _PoolBusy):
                details["reason"] = "pool_busy"
                held = (
                    "its one pooled connection (max_connections=1) was"
                    if exc.size == 1
                    else f"all {exc.size} of its pooled connections (max_connections) were"
                )
                why = f"{held} busy for {exc.waited:.1f} s ({text})"
            elif fault == "cancelled":
                timed_out = "statement timeout" in str(exc)
                details["reason"] = "statement_timeout" if timed_out else "cancelled"
                why = (
                    "the statement ran longer than the server's statement_timeout and "
                    f"the server cancelled it ({text})"
                    if timed_out
                    else f"the server cancelled the statement ({text})"
                )
            else:
                why = f"the server cannot be reached ({text})"
            return self.errors.unavailable(f"{head}: {why}{said}", details=details)
        if fault == "locked":
            return self.errors.locked(
                f"{head}: a lock was held by another transaction ({text})", details=details
            )
        if fault == "damage":
            kind = "bad_schema" if sqlstate in ("42P01", "42703", "3F000") else "bad_database"
            what = (
                "the schema was altered or dropped behind perdure's back"
                if kind == "bad_schema"
                else "the server reports damaged data"
            )
            return self.errors.damage(f"{head}: {what}: {text}", details={**details, "kind": kind})
        return self.errors.failure(f"{head} failed: {text}", details=details)

    # ------------------------------------------------------------------ the schema

    def schema_exists(self) -> bool:
        """Whether this component's tables exist in the schema (creates nothing).

        Raises:
            the layer's ``unavailable`` or ``failure`` error: the server cannot be
            reached, or refuses the connection.
        """
        try:
            with self._connect() as conn:
                row = conn.execute(
                    "SELECT to_regclass(%s) IS NOT NULL",
                    (f"{self.q}.{quote_ident(VERSION_TABLE)}",),
                ).fetchone()
                if row is None or not row[0]:
                    return False
                found = conn.execute(
                    f"SELECT 1 FROM {self.q}.{VERSION_TABLE} WHERE component = %s",
                    (self.part.component,),
                ).fetchone()
                return found is not None
        except DRIVER_ERRORS as exc:
            raise self.translate(exc, "looking for the schema") from exc

    def _pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        state = self._state.value
        pool = state.pool
        if pool is not None:
            return pool
        with self._guard:
            state = self._state.value
            if state.pool is None:
                # One connection first, outside the pool: it says at once why a server
                # refuses us (the pool would only time out), and makes the schema.
                # Its driver errors go to the caller, who retries or translates them.
                with self._connect() as conn:
                    if not state.checked:
                        self._ensure_schema(conn)
                        state.checked = True
                pool = psycopg_pool.ConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=self.max_connections,
                    open=False,
                    kwargs={"autocommit": True},
                    configure=self._configure_pooled,
                    timeout=self.connect_timeout,
                    reconnect_timeout=max(self.reconnect_timeout, 60.0),
                    name=f"perdure {self.schema}",
                )
                pool.open(wait=False)
                state.pool = pool
            return state.pool

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout))
        )
        try:
            self._configure_pooled(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure_pooled(self, conn: psycopg.Connection[Any]) -> None:
        if self._configure is not None:
            conn.execute(self._configure)

    def migrate(self, *, dry_run: bool = False) -> SchemaMigration:
        """Bring the component's tables to this perdure's version (``perdure migrate-schema``).

        No tables yet: they are made at the current version. Older: each step runs
        in a transaction of its own, under the advisory lock the creation takes,
        and records the version it reaches, so a step that fails leaves the tables
        whole at the version before it. Current: nothing is done. Idempotent, and
        safe from two processes at once: the second waits for the lock, then finds
        the work done (``before`` is read under the lock). With ``dry_run`` it reads
        the version and says what it would do, changing nothing.

        A process that opened the schema before the upgrade does not read its
        version again: stop the processes using it first.

        Raises:
            the layer's ``version`` error: the tables are newer than this perdure,
                or older than the oldest version it can upgrade
                (``details["reason"]``: ``"newer"``, ``"too_old"``).
            the layer's ``damage`` error: the upgraded tables are not the ones this
                perdure makes; ``unavailable``, ``locked``, ``failure`` as for any
                work (a step that failed changed nothing).
        """
        part = self.part
        try:
            with self._connect() as conn:
                if dry_run:
                    found = self._recorded_version(conn)
                    action, steps = self._plan(found)
                    after = found if action == "none" else part.version
                    assert after is not None
                    return SchemaMigration(
                        part.component, self.server, self.schema, found, after, action,
                        steps, dry_run=True,
                    )  # fmt: skip
                before: int | None = None
                action = "none"
                done: list[tuple[int, tuple[str, ...]]] = []
                for attempt in itertools.count():
                    with self._locked(conn):
                        found = self._recorded_version(conn)
                        if attempt == 0:
                            before = found
                            action, _ = self._plan(found)
                        if found == part.version:
                            break
                        if found is None:
                            self._create_tables(conn)
                            break
                        self._plan(found)  # still upgradable (refused otherwise)
                        statements = tuple(part.steps[found](self.q))
                        for statement in statements:
                            conn.execute(statement)
                        conn.execute(
                            f"UPDATE {self.q}.{VERSION_TABLE} SET version = %s "
                            "WHERE component = %s AND version = %s",
                            (found + 1, part.component, found),
                        )
                        done.append((found, statements))
                self._check_columns(conn)
        except DRIVER_ERRORS as exc:
            raise self.translate(exc, "upgrading the schema") from exc
        return SchemaMigration(
            part.component, self.server, self.schema, before, part.version, action,
            tuple(done), dry_run=False,
        )  # fmt: skip

    def _plan(
        self, found: int | None
    ) -> tuple[Literal["create", "upgrade", "none"], tuple[tuple[int, tuple[str, ...]], ...]]:
        """What bringing tables at version ``found`` to this perdure's takes.

        Raises:
            the layer's ``version`` error: newer, or older than the steps reach.
        """
        part = self.part
        if found is None:
            return "create", ()
        if found == part.version:
            return "none", ()
        if found > part.version or found < part.oldest:
            raise self._version_error(found)
        steps = tuple(
            (version, tuple(part.steps[version](self.q))) for version in range(found, part.version)
        )
        return "upgrade", steps

    def _version_error(self, found: int) -> Exception:
        """The refusal of tables at version ``found`` (not this perdure's)."""
        part = self.part
        head = (
            f"{self.what} {self.where}: the schema's {part.component!r} tables are version {found}"
        )
        if found > part.version:
            reason = "newer"
            message = (
                f"{head}, made by a newer perdure; this one knows version {part.version} "
                "and will not read or write them: upgrade perdure"
            )
        elif found < part.oldest:
            reason = "too_old"
            message = (
                f"{head}; this perdure uses version {part.version} and cannot upgrade "
                + (
                    f"versions older than {part.oldest}"
                    if part.oldest < part.version
                    else "older ones"
                )
                + ": upgrade them with an earlier perdure release first"
            )
        else:
            reason = "older"
            url = f"{self.server}?schema={quote_plus(self.schema)}{part.cli_query}"
            message = (
                f"{head}, older than this perdure's version {part.version}, which does "
                "not upgrade them by itself: stop the processes using them, then run "
                f"`perdure migrate-schema {part.cli_option} '{url}'`"
            )
        return self.errors.version(
            message,
            details={
                "component": part.component,
                "found": found,
                "supported": part.version,
                "reason": reason,
                "server": self.server,
                "schema": self.schema,
            },
        )

    @contextlib.contextmanager
    def _locked(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """A transaction holding the schema's advisory lock: making or upgrading tables
        from two processes at once would collide on their catalogue rows.

        The lock is taken before the transaction begins, not inside it: a backend
        caches the catalogue's answers (even "no such table") and refreshes them when
        a transaction starts, so only a transaction begun under the lock is sure to
        see the tables the previous holder made.
        """
        key = schema_lock_key(self.schema)
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            with conn.transaction():
                yield
        finally:
            with contextlib.suppress(psycopg.Error):  # a lost connection took it along
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def _create_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Make the schema, the version table and the component's tables at its
        current version, and record it (inside the caller's locked transaction)."""
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.q}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.q}.{VERSION_TABLE} ("
            "component text PRIMARY KEY, version integer NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        for statement in self.part.statements(self.q):
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {self.q}.{VERSION_TABLE} (component, version) VALUES (%s, %s)",
            (self.part.component, self.part.version),
        )

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Make the component's tables if there are none, or check their version and
        columns: another version is refused, never upgraded here (see :meth:`migrate`)."""
        found = self._recorded_version(conn)
        if found is None:
            with self._locked(conn):
                found = self._recorded_version(conn)  # made by another meanwhile?
                if found is None:
                    self._create_tables(conn)
                    found = self.part.version
        if found != self.part.version:
            raise self._version_error(found)
        self._check_columns(conn)

    def _recorded_version(self, conn: psycopg.Connection[Any]) -> int | None:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{self.q}.{quote_ident(VERSION_TABLE)}",)
        ).fetchone()
        if row is None or not row[0]:
            return None
        found = conn.execute(
            f"SELECT version FROM {self.q}.{VERSION_TABLE} WHERE component = %s",
            (self.part.component,),
        ).fetchone()
        return None if found is None else int(found[0])

    def _check_columns(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = ANY(%s)",
            (self.schema, list(self.part.tables)),
        ).fetchall()
        found: dict[str, set[str]] = {}
        for table, column in rows:
            found.setdefault(table, set()).add(column)
        for table, columns in self.part.tables.items():
            if found.get(table) != set(columns):
                have = ", ".join(sorted(found.get(table, ()))) or "no columns (it is gone)"
                raise self.errors.damage(
                    f"{self.what} {self.where}: the table {table} is not the one perdure "
                    f"made: it has {have}",
                    details={
                        "kind": "bad_schema",
                        "table": table,
                        "server": self.server,
                        "schema": self.schema,
                    },
                )


def _driver_text(exc: BaseException) -> str:
    """The driver's message on one line, with its SQLSTATE when it has one."""
    sqlstate = getattr(exc, "sqlstate", None)
    text = " ".join(str(exc).split()) or type(exc).__name__
    return (
        f"{type(exc).__name__} {sqlstate}: {text}" if sqlstate else f"{type(exc).__name__}: {text}"
    )
