"""A child made by fork() runs agent turns on the stores and the loop it inherited.

The parent has used everything first: perdure's event loop (a sync call), the
stores' connections and worker threads, and — in the harder cases — one of its
threads holds a store's lock at the moment of the fork (the SQLite store's
background fold of its WAL, the file store's writer thread). The child must run a
whole turn, and what it commits must be what the parent then reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import exit_code, fork_child
from perdure import Agent
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session
from perdure.session.store import SessionStore
from perdure.stores.sqlite import SQLiteSessionStore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

TIMEOUT = 30


def _texts(messages: Any) -> list[str]:
    return [m["content"][0]["text"] for m in messages]


def _store(kind: str, path: Path, **options: Any) -> SessionStore:
    if kind == "file":
        return FileSessionStore(path / "files", **options)
    return SQLiteSessionStore(path / "sessions.db", **options)


def _traced(body: Callable[[], None]) -> Callable[[], None]:
    """``body``, printing what it raises (the child's exit code says only that it did)."""

    def run() -> None:
        try:
            body()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            raise

    return run


def _child_turn(agent: Agent, store: SessionStore) -> Callable[[], None]:
    """The child's work: a full turn, then a read through the inherited store."""

    def body() -> None:
        result = agent("y")
        assert str(result) == "child answer", result
        record = asyncio.run(store.get("s1"))
        assert _texts(record.messages) == ["x", "parent answer", "y", "child answer"]

    return _traced(body)


def _stored(kind: str, path: Path) -> list[str]:
    async def read() -> list[str]:
        return _texts((await _store(kind, path).get("s1")).messages)

    return asyncio.run(read())


def _parent_agent(store: SessionStore) -> Agent:
    agent = Agent(
        model=ScriptedModel(["parent answer", "child answer"]),
        session_manager=Session(store, "s1"),
    )
    assert str(agent("x")) == "parent answer"  # perdure's loop thread now runs
    return agent


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_forked_child_runs_a_turn_after_the_parent_made_sync_calls(
    kind: str, tmp_path: Path
) -> None:
    store = _store(kind, tmp_path)
    agent = _parent_agent(store)
    pid = fork_child(_child_turn(agent, store), timeout=TIMEOUT)
    assert exit_code(pid) == 0
    assert _stored(kind, tmp_path) == ["x", "parent answer", "y", "child answer"]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_multiprocessing_fork_child_runs_a_turn(kind: str, tmp_path: Path) -> None:
    store = _store(kind, tmp_path)
    agent = _parent_agent(store)
    process = multiprocessing.get_context("fork").Process(target=_child_turn(agent, store))
    process.start()
    process.join(TIMEOUT)
    if process.exitcode is None:
        process.kill()
        process.join()
    assert process.exitcode == 0
    assert _stored(kind, tmp_path) == ["x", "parent answer", "y", "child answer"]


@pytest.fixture
def held() -> Iterator[tuple[threading.Event, threading.Event]]:
    """(reached, release): a parent's thread parks inside a store's lock until released."""
    reached, release = threading.Event(), threading.Event()
    yield reached, release
    release.set()


def test_a_forked_child_runs_a_turn_during_a_background_wal_fold(
    tmp_path: Path, held: tuple[threading.Event, threading.Event]
) -> None:
    reached, release = held
    store = SQLiteSessionStore(tmp_path / "sessions.db", durability="none")
    agent = _parent_agent(store)
    # The fold runs for real on the store's fold thread, holding the reader
    # connection's lock; it only waits, in the middle, until the fork is done.
    fold = store._checkpoint_wal

    def paused_fold(conn: Any) -> None:
        if threading.current_thread().name.startswith("perdure-sqlite-fold"):
            reached.set()
            release.wait(TIMEOUT)
        fold(conn)

    store._checkpoint_wal = paused_fold  # type: ignore[method-assign]

    async def fill() -> None:  # appends on the loop until one starts a background fold
        history: list[Any] = []
        for i in range(5000):
            history.append({"role": "user", "content": [{"text": f"filler {i}"}]})
            await store.commit("filler", list(history))
            if reached.is_set():
                return

    asyncio.run(store.create("filler"))
    asyncio.run(fill())
    assert reached.wait(TIMEOUT), "no background fold started"
    assert store._fold_in_flight() is not None
    pid = fork_child(_child_turn(agent, store), timeout=TIMEOUT)
    code = exit_code(pid)
    release.set()
    assert code == 0
    assert _stored("sqlite", tmp_path) == ["x", "parent answer", "y", "child answer"]


def test_a_forked_child_runs_a_turn_while_the_file_writer_thread_holds_the_store(
    tmp_path: Path, held: tuple[threading.Event, threading.Event]
) -> None:
    reached, release = held
    store = FileSessionStore(tmp_path / "files")
    agent = _parent_agent(store)

    def busy_writer() -> None:  # the writer thread in the middle of a write
        with store._guard:
            reached.set()
            release.wait(TIMEOUT)

    store._write_executor().submit(busy_writer)
    assert reached.wait(TIMEOUT)
    pid = fork_child(_child_turn(agent, store), timeout=TIMEOUT)
    code = exit_code(pid)
    release.set()
    assert code == 0
    assert _stored("file", tmp_path) == ["x", "parent answer", "y", "child answer"]


def test_a_child_does_not_keep_its_parents_session_lock(tmp_path: Path) -> None:
    """A child forked while the parent holds a session's lock neither shares the
    hold (it is locked out like any other process) nor keeps the lock file open."""
    store = FileSessionStore(tmp_path / "files")
    asyncio.run(store.create("s1"))
    lock_dir = tmp_path / "files" / ".locks"

    def child() -> None:
        from perdure.errors import SessionLockedError

        async def try_lock() -> None:
            async with store.writer_lock("s1"):
                pass

        try:
            asyncio.run(try_lock())
        except SessionLockedError:
            pass
        else:
            raise AssertionError("the child took the lock its parent holds")
        open_files = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the descriptor listdir itself used
                open_files.add(os.readlink(f"/proc/self/fd/{fd}"))
        assert str(lock_dir / "s1.lock") not in open_files, open_files

    async def parent() -> int:
        async with store.writer_lock("s1"):  # held until the child is done
            return exit_code(fork_child(_traced(child), timeout=TIMEOUT))

    assert asyncio.run(parent()) == 0


def test_sqlite_storage_reopens_its_connection_in_a_forked_child(tmp_path: Path) -> None:
    from perdure.storage import SQLiteStorage

    storage = SQLiteStorage(tmp_path / "blobs.db")
    asyncio.run(storage.write("a", b"parent"))
    parent_conn = storage._slot.conn

    def child() -> None:
        assert storage._slot.conn is None  # the parent's is left alone
        asyncio.run(storage.write("b", b"child"))
        assert asyncio.run(storage.read("a")) == b"parent"
        assert storage._slot.conn is not None
        assert storage._slot.conn is not parent_conn

    assert exit_code(fork_child(_traced(child), timeout=TIMEOUT)) == 0
    assert storage._slot.conn is parent_conn  # the parent's connection goes on
    assert asyncio.run(storage.list("")) == ["a", "b"]
    storage.close()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_memory_store_goes_on_in_a_forked_child(where: str, tmp_path: Path) -> None:
    from perdure.memory import LocalMemoryStore

    path = tmp_path / "memory.db" if where == "file" else ":memory:"
    store = LocalMemoryStore(path, namespace="u1")
    asyncio.run(store.add("the parent likes green tea"))
    parent_conn = store._db._slot.conn

    def child() -> None:
        # A file is reopened; an in-memory database lives only in the connection,
        # so the child goes on with its own copy of it.
        asyncio.run(store.add("the child likes coffee"))
        assert (store._db._slot.conn is parent_conn) == (where == "memory")
        found = asyncio.run(store.search("tea coffee", limit=5))
        assert sorted(e.content for e in found) == [
            "the child likes coffee",
            "the parent likes green tea",
        ]

    assert exit_code(fork_child(_traced(child), timeout=TIMEOUT)) == 0
    found = [e.content for e in asyncio.run(store.search("tea coffee", limit=5))]
    expected = ["the child likes coffee", "the parent likes green tea"]
    assert sorted(found) == (expected if where == "file" else expected[1:])
