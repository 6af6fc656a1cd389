"""How PostgresSessionStore reports what goes wrong around a commit (SPEC §7, §11).

Against the real server, each test in a schema of its own: a pool whose connections
are all busy, a commit whose answer was lost while the server then stayed away, a
statement the server cancelled (``statement_timeout``), and libpq parameters in a
store URL. Each says what became of the commit (``details["outcome"]``) and why, and
none leaves the store planning on a row it no longer holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_postgres_loop import warmed_in

from perdure._runtime.urls import postgres_url
from perdure.errors import StoreUnavailableError
from perdure.session import open_store
from perdure.testing.messages import text
from postgres_server import DSN, execute, import_psycopg, schema_fixture

psycopg = import_psycopg()
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

from perdure.stores.postgres import PostgresSessionStore  # noqa: E402


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def opened(schema: str) -> Iterator[Callable[..., PostgresSessionStore]]:
    """Opens stores over the test's schema (``dsn=`` another way to the server);
    every one is closed after the test."""
    stores: list[PostgresSessionStore] = []

    def open_one(dsn: str = DSN, **options: Any) -> PostgresSessionStore:
        store = PostgresSessionStore(dsn, schema=schema, **options)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


@contextlib.contextmanager
def rows_locked(schema: str, *session_ids: str) -> Iterator[Any]:
    """Sessions' rows locked by another transaction (``FOR UPDATE``) for the block;
    the connection is yielded (``rollback()`` releases the locks earlier)."""
    holder = psycopg.connect(DSN, connect_timeout=5)
    try:
        holder.execute(
            f'SELECT 1 FROM "{schema}".perdure_sessions WHERE id = ANY(%s) FOR UPDATE',
            (list(session_ids),),
        )
        yield holder
    finally:
        holder.rollback()
        holder.close()


async def lock_waiters(schema: str, count: int = 1) -> None:
    """Until ``count`` statements on the schema's tables wait for a lock."""
    deadline = time.monotonic() + 10
    while True:
        rows = execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            (f'%"{schema}"%',),
        )
        if rows[0][0] >= count:
            return
        assert time.monotonic() < deadline, "the commit never waited for the lock"
        await asyncio.sleep(0.02)


async def stored(store: PostgresSessionStore, session_id: str) -> list[Any]:
    return list((await store.get(session_id)).messages)


# ---------------------------------------------------------------- a pool with no connection free


async def test_a_commit_that_gets_no_pooled_connection_was_not_applied_and_says_why(
    schema: str, opened: Callable[..., PostgresSessionStore]
) -> None:
    # One pooled connection, held by a commit that waits for a row lock held
    # elsewhere: the other commits never get a connection, so none of them was sent.
    # Each says so (outcome not_applied) and names the busy pool, not the server.
    store = opened(max_connections=1, connect_timeout=0.5, reconnect_timeout=1)
    reader = opened()
    first = [text("user", "first")]
    await store.create("s")
    await store.create("t")
    await store.commit("s", first)  # remembered: the next commit plans without a read
    await store.create("u")  # forgotten: its commit must read the row first
    with rows_locked(schema, "t") as holder:
        blocked = asyncio.create_task(store.commit("t", [text("user", "blocked")]))
        await lock_waiters(schema)
        attempts = [
            ("s", [*first, text("assistant", "appended")], False),
            ("s", [text("user", "rewritten")], True),
            ("u", [text("user", "fresh")], False),
        ]
        for session_id, messages, rewritten in attempts:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as info:
                await store.commit(session_id, messages, rewritten=rewritten)
            error = info.value
            assert error.code == "store_unavailable"
            assert error.details["outcome"] == "not_applied", error.message
            assert error.details["reason"] == "pool_busy"
            assert error.details["session_id"] == session_id
            assert "pooled connection (max_connections=1) was busy" in error.message
            assert "cannot be reached" not in error.message
            assert "may or may not have been applied" not in error.message
            assert time.monotonic() - started < 5
        holder.rollback()
        await blocked
    assert await stored(reader, "s") == first
    assert await stored(reader, "u") == []
    # The pool free again, the same store goes on.
    again = [*first, text("assistant", "after")]
    assert (await store.commit("s", again)).message_count == 2
    assert await stored(reader, "s") == again


async def test_a_commit_waiting_for_a_connection_is_never_taken_for_a_conflict(
    schema: str, opened: Callable[..., PostgresSessionStore]
) -> None:
    # The store plans on the row it remembers, which another writer moved on from; no
    # pooled connection is free for a while. The commit was not sent: once a
    # connection comes, the stale plan is refused by the server and planned again on
    # the row as stored — no SessionConflictError for a history that extends it.
    store = opened(max_connections=1, connect_timeout=0.5, reconnect_timeout=10)
    other, reader = opened(), opened()
    await store.create("s")
    await store.create("t")
    first = [text("user", "first")]
    await store.commit("s", first)  # remembered by ``store``
    theirs = [*first, text("assistant", "theirs")]
    await other.commit("s", theirs)
    with rows_locked(schema, "t") as holder:
        blocked = asyncio.create_task(store.commit("t", [text("user", "blocked")]))
        await lock_waiters(schema)
        asyncio.get_running_loop().call_later(1.5, holder.rollback)
        mine = [*theirs, text("user", "mine")]
        result = await store.commit("s", mine)
        await blocked
    assert result.message_count == 3
    record = await reader.get("s")
    assert (record.messages, record.tail) == (mine, result.tail)


# ---------------------------------------------------------------- an answer lost, then an outage


class OutageProxy:
    """A TCP proxy to the server whose network can fail: it loses the answer to the
    next client message holding a marker and goes down — every connection cut, new
    ones closed at once — until :meth:`up`. Counts the forwarded messages holding
    a marker (:meth:`forwarded`)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._lose: bytes | None = None
        self._counts: dict[bytes, int] = {}
        self.down = False
        self.lost = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_answer_then_go_down(self, marker: bytes) -> None:
        with self._lock:
            self._lose = marker
            self._counts.setdefault(marker, 0)

    def forwarded(self, marker: bytes) -> int:
        with self._lock:
            return self._counts.get(marker, 0)

    def watch(self, marker: bytes) -> None:
        with self._lock:
            self._counts[marker] = 0

    def up(self) -> None:
        self.down = False

    def close(self) -> None:
        self._go_down()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _go_down(self) -> None:
        self.down = True
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, server]
            losing: list[bool] = []
            threading.Thread(target=self._up, args=(client, server, losing), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, losing), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, losing: list[bool]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.down:
                    break
                with self._lock:
                    if self._lose is not None and self._lose in data:
                        self._lose = None
                        losing.append(True)
                    for marker in self._counts:
                        if marker in data:
                            self._counts[marker] += 1
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, losing: list[bool]) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if self.down:
                    break
                if losing:  # the server answered: the statement ran; the answer is lost
                    self.lost += 1
                    self._go_down()
                    break
                client.sendall(data)


@contextlib.contextmanager
def outage_proxy() -> Iterator[tuple[OutageProxy, str]]:
    """An :class:`OutageProxy` to the server and the DSN through it."""
    where = conninfo_to_dict(DSN)
    proxy = OutageProxy((str(where.get("host", "127.0.0.1")), int(where.get("port", 5432))))
    try:
        yield proxy, make_conninfo(DSN, host="127.0.0.1", port=proxy.port)
    finally:
        proxy.close()


async def test_after_an_unknown_outcome_the_next_commit_plans_on_the_row_as_stored(
    opened: Callable[..., PostgresSessionStore],
) -> None:
    # The server applies a commit, its answer is lost, and the server stays away
    # past reconnect_timeout: outcome unknown. The store must not keep planning on
    # the row it had before that commit: once the server is back, the same writer's
    # next commit (without an expected tail, as a Session sends it after a failure)
    # is planned on the row as stored and sent once — appended after the lost one,
    # which was applied, never doubled.
    reader = opened()
    with outage_proxy() as (proxy, dsn):
        store = opened(dsn, connect_timeout=1, reconnect_timeout=1)
        await store.create("s")
        history = [text("user", "first")]
        tail = (await store.commit("s", history)).tail
        history = [*history, text("assistant", "lost-answer")]
        proxy.lose_answer_then_go_down(b"lost-answer")
        with pytest.raises(StoreUnavailableError) as info:
            await store.commit("s", history, expected_tail=tail)
        assert info.value.details["outcome"] == "unknown"
        assert proxy.lost == 1
        assert await stored(reader, "s") == history  # applied after all

        proxy.up()
        deadline = time.monotonic() + 30
        while True:  # until the store's pool reconnected (a read, which plans nothing)
            try:
                await store.list()
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline, "the store never reconnected"
        history = [*history, text("user", "next-turn")]
        proxy.watch(b"next-turn")
        result = await store.commit("s", history)
        assert proxy.forwarded(b"next-turn") == 1  # planned on the stored row: sent once
        record = await reader.get("s")
        assert (record.messages, record.tail) == (history, result.tail)


# ---------------------------------------------------------------- statement_timeout


def _timeout_dsn(milliseconds: int) -> str:
    return make_conninfo(DSN, options=f"-c statement_timeout={milliseconds}")


def _check_cancelled(error: StoreUnavailableError, session_id: str | None) -> None:
    assert isinstance(error, OSError)  # what the store raised for it before: still caught
    assert error.code == "store_unavailable"
    assert error.details["reason"] == "statement_timeout"
    assert error.details["sqlstate"] == "57014"
    assert "statement_timeout" in error.message
    if session_id is not None:
        assert error.details["outcome"] == "not_applied"
        assert "nothing of it was applied" in error.message
    else:
        assert "outcome" not in error.details


async def test_a_commit_cancelled_by_statement_timeout_is_typed_and_not_applied(
    schema: str, opened: Callable[..., PostgresSessionStore]
) -> None:
    # A commit waits for a row lock held elsewhere until the server's
    # statement_timeout cancels it: its transaction rolled back. On every path (the
    # loop's connection, a pooled one, a rewrite's transaction) that is a typed error
    # saying so, at once — not a bare OSError, and never sent again.
    store = opened(_timeout_dsn(300), reconnect_timeout=10)
    reader = opened()
    first = [text("user", "first")]
    await store.create("s")
    await store.commit("s", first)
    await warmed_in(store)  # the next append goes on the loop's connection
    await store.create("u")  # its commit reads the row, then goes on a pooled one
    with rows_locked(schema, "s", "u"):
        attempts = [
            ("s", [*first, text("assistant", "on the loop")], False),
            ("s", [text("user", "rewritten")], True),
            ("u", [text("user", "pooled")], False),
        ]
        for session_id, messages, rewritten in attempts:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as info:
                await store.commit(session_id, messages, rewritten=rewritten)
            assert time.monotonic() - started < 3  # not retried until reconnect_timeout
            _check_cancelled(info.value, session_id)
            assert info.value.details["session_id"] == session_id
    assert await stored(reader, "s") == first
    assert await stored(reader, "u") == []
    again = [*first, text("assistant", "after")]
    assert (await store.commit("s", again)).message_count == 2
    assert await stored(reader, "s") == again


async def test_a_read_cancelled_by_statement_timeout_is_typed_and_not_retried(
    schema: str, opened: Callable[..., PostgresSessionStore]
) -> None:
    store = opened(_timeout_dsn(300), reconnect_timeout=10)
    await store.create("s")
    await store.commit("s", [text("user", "first")])
    holder = psycopg.connect(DSN, connect_timeout=5)
    try:
        holder.execute(f'LOCK TABLE "{schema}".perdure_sessions IN ACCESS EXCLUSIVE MODE')
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            await store.get("s")
        assert time.monotonic() - started < 3
    finally:
        holder.rollback()
        holder.close()
    _check_cancelled(info.value, None)
    assert [m["content"][0]["text"] for m in await stored(store, "s")] == ["first"]


# ---------------------------------------------------------------- libpq parameters in a URL


def test_libpq_parameters_in_a_store_url_reach_the_driver_as_written() -> None:
    url = (
        "postgresql://u@h:5432/d?options=-c%20statement_timeout%3D700&schema=app"
        "&application_name=my%20app&keep=a+b&ttl=60&sslmode=disable"
    )
    dsn, found = postgres_url(url)
    assert dsn == (
        "postgresql://u@h:5432/d?options=-c%20statement_timeout%3D700"
        "&application_name=my%20app&keep=a+b&sslmode=disable"
    )
    assert found == {"schema": "app", "ttl": 60.0}
    assert postgres_url("postgresql://u@h/d?schema=app") == (
        "postgresql://u@h/d",
        {"schema": "app"},
    )


async def test_a_store_url_with_spaces_in_libpq_parameters_opens_with_them(
    schema: str,
) -> None:
    name = f"perdure failures {uuid.uuid4().hex[:8]}"
    url = (
        f"{DSN}?schema={schema}&options=-c%20statement_timeout%3D4321"
        f"&application_name={name.replace(' ', '%20')}"
    )
    store = open_store(url)
    assert isinstance(store, PostgresSessionStore)
    try:
        await store.create("s")
        setting = await store.db.run(
            lambda conn: conn.execute("SHOW statement_timeout").fetchone(), doing="testing"
        )
        assert setting == ("4321ms",)
        seen = execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,))
        assert seen[0][0] >= 1
    finally:
        store.close()
