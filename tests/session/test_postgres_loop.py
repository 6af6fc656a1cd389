"""The PostgreSQL session store's commits on loop connections, against the real server.

A commit planned against the row the store last saw goes on a connection the running
event loop drives itself (``PostgresDatabase.loop_connection``), not through a worker
thread. These tests pin that path down: it is taken, its statements carry their
parameters exactly, a caller cancelled mid-commit does not stop the commit, a
connection lost mid-commit neither loses nor doubles it, and the connections are
bounded, shared by loops, and closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_postgres_store import EDITS

from crypto_keys import cipher
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.testing.corruption import SESSION, write_precious
from perdure.testing.messages import conversation, text
from postgres_server import DSN, execute, import_psycopg, schema_fixture

import_psycopg()
from perdure._runtime.postgres import LoopConnection, LoopStatement  # noqa: E402
from perdure.stores.postgres import PostgresSessionStore  # noqa: E402
from perdure.stores.postgres import sessions as sessions_module  # noqa: E402


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def opened(schema: str) -> Iterator[Callable[..., PostgresSessionStore]]:
    stores: list[PostgresSessionStore] = []

    def open_store(**options: Any) -> PostgresSessionStore:
        store = PostgresSessionStore(DSN, schema=schema, **options)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        store.close()


def loop_connections(store: PostgresSessionStore) -> Any:
    return store.db._state.value.direct


async def warmed(store: PostgresSessionStore, session_id: str = "s") -> LoopConnection:
    """A session with a message, and the store's loop connection open and idle."""
    await store.create(session_id)
    history = [text("user", "warm")]
    await store.commit(session_id, history)
    return await warmed_in(store)


class _NoThreads:
    """The store module's ``asyncio``, whose ``to_thread`` fails the test."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def to_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the commit took the worker-thread path")


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it: from then on a store call that goes through a worker thread fails."""
    return lambda: monkeypatch.setattr(sessions_module, "asyncio", _NoThreads())


def stored(schema: str, session_id: str = "s") -> list[str]:
    rows = execute(
        f'SELECT m.body FROM "{schema}".perdure_messages m JOIN "{schema}".perdure_sessions s '
        "ON m.sid = s.sid WHERE s.id = %s ORDER BY m.idx",
        (session_id,),
    )
    return [str(row[0]) for row in rows]


def wait_blocked(pid: int) -> None:
    """Until backend ``pid`` waits for a lock."""
    deadline = time.monotonic() + 10
    while True:
        rows = execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
        )
        if rows:
            return
        assert time.monotonic() < deadline, "the commit never reached the server"
        time.sleep(0.005)


class RowLock:
    """Another connection holding the session's row locked, so a commit waits."""

    def __init__(self, schema: str, session_id: str = "s") -> None:
        import psycopg

        self.conn = psycopg.connect(DSN)
        self.conn.execute(
            f'SELECT 1 FROM "{schema}".perdure_sessions WHERE id = %s FOR UPDATE', (session_id,)
        )

    def release(self) -> None:
        self.conn.commit()
        self.conn.close()


# ------------------------------------------------------------------ the path itself


async def test_appends_go_on_the_loop_connection(
    opened: Callable[..., PostgresSessionStore],
    schema: str,
    no_threads: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = opened()
    await warmed(store)
    history = list((await store.get("s")).messages)
    async with store.writer_lock("s"):  # commits under a lease name its token
        no_threads()
        for message in conversation(10):
            history.append(message)
            await store.commit("s", history, agent_state={"n": len(history)})
        history += conversation(3)  # several rows in one statement
        await store.commit("s", history)
        monkeypatch.undo()  # the lease is given back in a worker thread
    record = await opened().get("s")
    assert record.messages == history
    assert record.agent_state == {"n": len(history) - 3}  # the last commit kept it
    assert len(stored(schema)) == len(history)


async def test_loop_statements_carry_their_parameters_exactly(schema: str) -> None:
    execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    execute(f'CREATE TABLE "{schema}".t (k bigint, v text)')
    store = PostgresSessionStore(DSN, schema=schema)
    try:
        await store.create("s")  # the pool first: it makes the schema
        conn = None
        deadline = time.monotonic() + 10
        while conn is None:
            conn = store.db.loop_connection()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        tricky = ['a"b', "back\\slash", "comma,brace}{", "", "NULL", "ünï", "line\nbreak", None]
        statement = LoopStatement(
            f'INSERT INTO "{schema}".t (k, v) SELECT %(k)s::bigint, unnest(%(vs)s::text[]) '
            "UNION ALL SELECT %(k)s::bigint + 1, %(one)s::text || '%%'"
        )
        assert statement.text.count(b"$1") == 2
        assert b"$3" in statement.text
        await conn.prepare(statement)
        conn.send(statement, {"k": 7, "vs": tricky, "one": "x'y"})
        await conn.result()
        store.db.give_back(conn, reusable=True)
    finally:
        store.close()
    rows = execute(f'SELECT k, v FROM "{schema}".t ORDER BY k, v NULLS LAST')
    got = sorted(((int(k), v) for k, v in rows if int(k) == 7), key=lambda r: (r[1] is None, r[1]))
    want = sorted(((7, v) for v in tricky), key=lambda r: (r[1] is None, r[1]))
    assert got == want
    assert [(int(k), v) for k, v in rows if int(k) == 8] == [(8, "x'y%")]
    with pytest.raises(TypeError, match="must be None, str, int"):
        statement.encode({"k": 1.5, "vs": [], "one": ""})


async def test_a_refused_statement_raises_the_servers_error(schema: str) -> None:
    import psycopg

    store = PostgresSessionStore(DSN, schema=schema)
    try:
        await store.create("s")
        conn = None
        while conn is None:
            conn = store.db.loop_connection()
            await asyncio.sleep(0.01)
        statement = LoopStatement("SELECT 1 / %(zero)s::int")
        await conn.prepare(statement)
        conn.send(statement, {"zero": 0})
        with pytest.raises(psycopg.errors.DivisionByZero):
            await conn.result()
        store.db.give_back(conn, reusable=True)  # the server refused; the connection is fine
        assert loop_connections(store).idle == [conn]
        again = store.db.loop_connection()
        assert again is conn
        conn.send(statement, {"zero": 1})
        assert (await conn.result()).get_value(0, 0) == b"1"
        store.db.give_back(conn, reusable=True)
    finally:
        store.close()


async def test_a_commit_planned_on_a_stale_row_reads_it_afresh(
    opened: Callable[..., PostgresSessionStore],
) -> None:
    store, other = opened(), opened()
    await warmed(store)
    mine = list((await store.get("s")).messages)
    theirs = [*mine, text("assistant", "theirs")]
    await other.commit("s", theirs)
    with pytest.raises(SessionConflictError):  # planned on its old row: refused, read, refused
        await store.commit("s", [*mine, text("assistant", "mine")])
    await store.commit("s", [*theirs, text("user", "next")])  # read afresh: goes on
    assert (await other.get("s")).messages == [*theirs, text("user", "next")]


# ------------------------------------------------------------------ cancelled, lost


async def test_a_cancelled_caller_does_not_stop_its_commit(
    opened: Callable[..., PostgresSessionStore], schema: str, no_threads: Callable[[], None]
) -> None:
    store = opened()
    conn = await warmed(store)
    history = list((await store.get("s")).messages)
    no_threads()
    lock = RowLock(schema)
    try:
        history.append(text("assistant", "in flight"))
        task = asyncio.get_running_loop().create_task(store.commit("s", list(history)))
        await asyncio.to_thread(wait_blocked, conn.pgconn.backend_pid)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        lock.release()
    deadline = time.monotonic() + 10
    while len(stored(schema)) < len(history):
        assert time.monotonic() < deadline, "the cancelled commit was stopped"
        await asyncio.sleep(0.01)
    while not loop_connections(store).idle:  # given back once settled
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    # The store learnt the outcome: its next commit plans on it, on the loop path.
    history.append(text("user", "after"))
    await store.commit("s", history)
    assert (await opened().get("s")).messages == history


async def test_a_connection_lost_mid_commit_neither_loses_nor_doubles_it(
    opened: Callable[..., PostgresSessionStore], schema: str
) -> None:
    store = opened()
    conn = await warmed(store)
    pid = conn.pgconn.backend_pid
    history = list((await store.get("s")).messages)
    lock = RowLock(schema)
    try:
        history.append(text("assistant", "lost"))
        task = asyncio.get_running_loop().create_task(store.commit("s", list(history)))
        await asyncio.to_thread(wait_blocked, pid)
        execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        lock.release()
    await task  # found not applied, then sent again through the pool
    assert (await opened().get("s")).messages == history
    assert len(stored(schema)) == len(history)
    assert conn not in loop_connections(store).opened  # the broken one is gone


async def test_an_idle_connection_the_server_dropped_is_replaced(
    opened: Callable[..., PostgresSessionStore], schema: str
) -> None:
    store = opened()
    conn = await warmed(store)
    execute("SELECT pg_terminate_backend(%s)", (conn.pgconn.backend_pid,))
    history = list((await store.get("s")).messages)
    for message in conversation(6):
        history.append(message)
        await store.commit("s", history)
    assert (await opened().get("s")).messages == history
    assert len(stored(schema)) == len(history)
    await warmed(store, "t")  # a new one is opened
    assert conn not in loop_connections(store).opened


# ------------------------------------------------------------------ connections


def test_loops_share_the_connections_and_close_closes_them(schema: str) -> None:
    store = PostgresSessionStore(DSN, schema=schema, max_connections=2)
    history = [text("user", "0")]
    asyncio.run(store.create("s"))
    pids: set[int] = set()
    try:
        for i in range(1, 40):  # a new event loop for every commit, as asyncio.run makes
            history.append(text("user" if i % 2 == 0 else "assistant", str(i)))
            asyncio.run(store.commit("s", history))
            pids |= {conn.pgconn.backend_pid for conn in loop_connections(store).opened}
            time.sleep(0.005)
        assert 1 <= len(pids) <= 2  # opened once, then reused by loop after loop
        assert asyncio.run(store.get("s")).messages == history
    finally:
        store.close()
    assert loop_connections(store).opened == set()
    deadline = time.monotonic() + 10
    while execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)):
        assert time.monotonic() < deadline, "close() left loop connections open"
        time.sleep(0.01)


def test_one_commit_alone_opens_no_loop_connection(schema: str) -> None:
    store = PostgresSessionStore(DSN, schema=schema)
    try:
        asyncio.run(store.create("s"))
        asyncio.run(store.commit("s", [text("user", "once")]))
        time.sleep(0.2)
        assert loop_connections(store).count == 0
    finally:
        store.close()


# ------------------------------------------------------------------ pages


def loop_reader(open_store: Callable[..., PostgresSessionStore], **options: Any) -> Any:
    """A store whose pages can only be read on its loop connection (now open)."""
    reader = open_store(**options)
    asyncio.run(reader.list())  # the pool first: it checks the schema
    asyncio.run(warmed_in(reader))

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the page was read through a worker thread")

    reader.db.run = refuse
    return reader


def thread_reader(open_store: Callable[..., PostgresSessionStore], **options: Any) -> Any:
    reader = open_store(**options)
    reader.db.loop_connection = lambda: None
    return reader


def outcome(store: PostgresSessionStore, offset: int, limit: int) -> Any:
    try:
        page = asyncio.run(store.history_page(SESSION, offset, limit))
    except SessionCorruptedError as exc:
        return ("damage", exc.details.get("kind"), exc.details.get("index"))
    return (page.offset, page.total, page.messages)


PAGES = [(0, 0), (0, 1), (0, 2), (0, 50), (1, 2), (2, 2), (3, 1), (4, 4), (5, 3), (9, 2)]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_page_on_the_loop_is_the_page_of_the_thread_path(
    opened: Callable[..., PostgresSessionStore], encrypted: bool
) -> None:
    options = {"cipher": cipher()} if encrypted else {}
    asyncio.run(write_precious(opened(**options)))  # a rewrite, a redaction, a state
    by_loop, by_thread = loop_reader(opened, **options), thread_reader(opened, **options)
    for offset, limit in PAGES:
        assert outcome(by_loop, offset, limit) == outcome(by_thread, offset, limit)
    whole = asyncio.run(by_loop.history_page(SESSION, 0, 50))
    assert whole.messages == asyncio.run(by_thread.get(SESSION)).messages


@pytest.mark.parametrize(("what", "statement"), EDITS, ids=[e[0] for e in EDITS])
def test_a_page_on_the_loop_finds_the_damage_the_thread_path_finds(
    opened: Callable[..., PostgresSessionStore], schema: str, what: str, statement: str
) -> None:
    asyncio.run(write_precious(opened()))
    execute(statement.format(q=f'"{schema}"'))
    by_loop, by_thread = loop_reader(opened), thread_reader(opened)
    found = [outcome(by_loop, offset, limit) for offset, limit in PAGES]
    assert found == [outcome(by_thread, offset, limit) for offset, limit in PAGES]
    if "state" not in what and "past the end" not in what:  # a page reads neither
        assert any(result[0] == "damage" for result in found), what


def test_a_page_of_no_such_session_is_not_found(
    opened: Callable[..., PostgresSessionStore],
) -> None:
    asyncio.run(write_precious(opened()))
    reader = opened()
    asyncio.run(reader.list())
    with pytest.raises(SessionNotFoundError):  # the loop finds nothing; the pool says why
        asyncio.run(reader.history_page("nobody", 0, 10))


# ------------------------------------------------------------------ leases


async def keeper_open(store: PostgresSessionStore) -> LoopConnection:
    """Session "s" made, its lease taken once (through the keeper, whose connection
    a lease on the loop names), and a loop connection idle again."""
    await warmed(store)
    async with store.writer_lock("s"):
        pass
    return await warmed_in(store)


def lease_rows(schema: str) -> list[tuple[Any, ...]]:
    return [
        tuple(row)
        for row in execute(
            f'SELECT session_id, owner, token, holder_pid FROM "{schema}".perdure_leases'
        )
    ]


async def test_a_lease_taken_on_the_loop_names_the_keepers_connection(
    opened: Callable[..., PostgresSessionStore],
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, other = opened(), opened()
    await keeper_open(store)

    async def no_thread(session_id: str) -> None:
        raise AssertionError("the lease was taken through a worker thread")

    monkeypatch.setattr(store, "_take_lease", no_thread)
    keeper = store._leases._state.value
    async with store.writer_lock("s"):
        [(session_id, owner, token, holder)] = lease_rows(schema)
        assert (session_id, owner, token) == ("s", keeper.owner, store._leases.token("s"))
        assert keeper.holder is not None
        assert holder == keeper.holder[0]  # the keeper's, open while the lease is held
        assert holder not in {c.pgconn.backend_pid for c in loop_connections(store).opened}
        with pytest.raises(SessionLockedError):
            async with other.writer_lock("s"):
                pass
        await store.commit("s", [text("user", "warm"), text("assistant", "leased")])
    assert lease_rows(schema) == []  # given back on the loop
    async with other.writer_lock("s"):  # free at once
        pass


async def test_a_commit_under_a_lease_taken_over_is_refused(
    opened: Callable[..., PostgresSessionStore], schema: str
) -> None:
    store, other = opened(), opened()
    await keeper_open(store)
    history = list((await store.get("s")).messages)
    async with store.writer_lock("s"):
        # Its holder seems gone (expired): another writer takes the lease over.
        execute(f"UPDATE \"{schema}\".perdure_leases SET expires_at = now() - interval '1 s'")
        async with other.writer_lock("s"):
            with pytest.raises(SessionLockedError) as info:
                await store.commit("s", [*history, text("assistant", "fenced")])
            assert info.value.details["reason"] == "lease_lost"
    assert (await other.get("s")).messages == history


async def test_a_cancelled_lease_wait_on_the_loop_leaves_no_lease(
    opened: Callable[..., PostgresSessionStore], schema: str
) -> None:
    import psycopg

    store, other = opened(), opened()
    conn = await keeper_open(store)
    # An expired lease of somebody else's, its row locked: the take waits on it.
    execute(
        f'INSERT INTO "{schema}".perdure_leases (session_id, owner, token, expires_at) '
        "VALUES ('s', 'gone', 0, now() - interval '1 s')"
    )
    blocker = psycopg.connect(DSN)
    blocker.execute(f"SELECT 1 FROM \"{schema}\".perdure_leases WHERE session_id = 's' FOR UPDATE")
    try:
        task = asyncio.get_running_loop().create_task(store.writer_lock("s").__aenter__())
        await asyncio.to_thread(wait_blocked, conn.pgconn.backend_pid)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        blocker.commit()
        blocker.close()
    deadline = time.monotonic() + 10
    while True:  # the take went through after the cancel; its lease is given back
        try:
            async with other.writer_lock("s"):
                break
        except SessionLockedError:
            assert time.monotonic() < deadline, "a cancelled take left its lease behind"
            await asyncio.sleep(0.01)
    assert store._leases.token("s") is None


def test_a_forked_child_opens_its_own_and_leaves_the_parents_alone(schema: str) -> None:
    import os
    import warnings

    store = PostgresSessionStore(DSN, schema=schema)
    try:
        asyncio.run(store.create("parent"))
        asyncio.run(store.create("child"))
        history = [text("user", "0")]
        asyncio.run(store.commit("parent", history))
        conn = asyncio.run(warmed_in(store))
        with warnings.catch_warnings():  # Python 3.12 warns of a fork with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: its own connections; dropping the parent's closes nothing
            code = 1
            try:
                assert loop_connections(store).opened == set()
                child = [text("user", "child")]
                for i in range(5):
                    child.append(text("assistant" if i % 2 == 0 else "user", str(i)))
                    asyncio.run(store.commit("child", child))
                store.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not conn.closed  # the parent's connection still works
        assert execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (conn.pgconn.backend_pid,))
        history.append(text("assistant", "1"))
        asyncio.run(store.commit("parent", history))
        assert asyncio.run(store.get("parent")).messages == history
        assert len(asyncio.run(store.get("child")).messages) == 6
    finally:
        store.close()


async def warmed_in(store: PostgresSessionStore) -> LoopConnection:
    """The store's loop connection, open and idle (the store has committed; the
    second ask opens one)."""
    deadline = time.monotonic() + 10
    while not loop_connections(store).idle:
        assert time.monotonic() < deadline, "no loop connection was opened"
        conn = store.db.loop_connection()
        if conn is not None:
            store.db.give_back(conn, reusable=True)
        await asyncio.sleep(0.01)
    return loop_connections(store).idle[-1]  # type: ignore[no-any-return]


# ------------------------------------------------------------------ more callers than connections


async def _sessions_warmed(store: PostgresSessionStore, ids: list[str]) -> dict[str, list[Any]]:
    histories: dict[str, list[Any]] = {}
    for sid in ids:
        await store.create(sid)
        histories[sid] = [text("user", f"{sid} 0")]
        await store.commit(sid, histories[sid])  # the row is remembered: commits go on the loop
    await warmed_in(store)
    return histories


async def test_more_concurrent_commits_than_connections_wait_for_one_not_a_thread(
    opened: Callable[..., PostgresSessionStore], schema: str, no_threads: Callable[[], None]
) -> None:
    store = opened(max_connections=2)
    ids = [f"s{i}" for i in range(8)]
    histories = await _sessions_warmed(store, ids)
    held: list[LoopConnection] = []  # both open, so the set is full
    deadline = time.monotonic() + 10
    while len(held) < 2:
        assert time.monotonic() < deadline, "the second loop connection was never opened"
        conn = store.db.loop_connection()  # one held: the next ask opens another
        if conn is not None:
            held.append(conn)
        await asyncio.sleep(0.01)
    for conn in held:
        store.db.give_back(conn, reusable=True)
    no_threads()  # eight callers on two connections: none goes to a worker thread

    async def turns(sid: str) -> None:
        for i in range(1, 6):
            histories[sid].append(text("assistant" if i % 2 else "user", f"{sid} {i}"))
            await store.commit(sid, histories[sid])

    await asyncio.gather(*(turns(sid) for sid in ids))
    direct = loop_connections(store)
    assert direct.count == 2
    assert len(direct.idle) == 2
    assert not direct.waiting
    for sid in ids:
        assert len(stored(schema, sid)) == 6


async def test_a_caller_cancelled_while_waiting_for_a_connection_sends_nothing(
    opened: Callable[..., PostgresSessionStore], schema: str
) -> None:
    store = opened(max_connections=1)
    histories = await _sessions_warmed(store, ["a", "b", "c"])
    held = store.db.loop_connection()  # the only one: the commits below wait for it
    assert held is not None
    tasks = {}
    for sid in ("a", "b", "c"):
        histories[sid].append(text("assistant", f"{sid} 1"))
        tasks[sid] = asyncio.create_task(store.commit(sid, histories[sid]))
    direct = loop_connections(store)
    deadline = time.monotonic() + 10
    while len(direct.waiting) < 3:
        assert time.monotonic() < deadline, "the commits did not wait for the connection"
        await asyncio.sleep(0.005)
    tasks["b"].cancel()
    await asyncio.sleep(0.01)
    assert len(direct.waiting) == 2  # withdrawn
    store.db.give_back(held, reusable=True)  # to "a", then "c": the cancelled one is skipped
    assert (await tasks["a"]).message_count == 2
    assert (await tasks["c"]).message_count == 2
    with pytest.raises(asyncio.CancelledError):
        await tasks["b"]
    assert len(stored(schema, "b")) == 1  # never sent
    assert (direct.count, len(direct.idle), len(direct.waiting)) == (1, 1, 0)


async def test_callers_waiting_for_a_connection_take_the_pool_when_it_goes(
    opened: Callable[..., PostgresSessionStore], schema: str
) -> None:
    """A connection given back broken, or the store closed: who waited takes the
    pool's path (and its commit lands), never waits on."""
    store = opened(max_connections=1)
    histories = await _sessions_warmed(store, ["a", "b"])
    direct = loop_connections(store)

    async def waiting_commit(sid: str) -> asyncio.Task[Any]:
        histories[sid].append(text("assistant", f"{sid} {len(histories[sid])}"))
        task = asyncio.create_task(store.commit(sid, histories[sid]))
        deadline = time.monotonic() + 10
        while not loop_connections(store).waiting:
            assert time.monotonic() < deadline, "the commit did not wait"
            await asyncio.sleep(0.005)
        return task

    held = store.db.loop_connection()
    assert held is not None
    task = await waiting_commit("a")
    store.db.give_back(held, reusable=False)  # lost: closed, and "a" takes the pool
    assert (await task).message_count == 2
    assert held.closed
    assert held not in direct.opened
    await warmed_in(store)
    held = store.db.loop_connection()
    assert held is not None
    task = await waiting_commit("b")
    store.db.close()  # the next use opens others
    assert (await task).message_count == 2
    store.db.give_back(held, reusable=True)  # given back after close(): closed
    assert held.closed
    assert [len(stored(schema, sid)) for sid in ("a", "b")] == [2, 2]
