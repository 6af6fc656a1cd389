"""Group commit in the SQLite store: many sessions' commits made durable by one sync.

Commits that arrive while the store's writer thread is busy wait for it and go
together in the next transaction, each in a savepoint of its own. These tests hold
the writer connection from the test (as a running batch would) so that commits pile
up deterministically, then check what the batch made of them.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from perdure._runtime.group import GroupWriter
from perdure.errors import SessionConflictError, SessionLockedError
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message


def history(n: int, prefix: str) -> list[Message]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"{prefix}{i}"}]}
        for i in range(n)
    ]


@contextmanager
def counting_commits(store: SQLiteSessionStore) -> Iterator[list[str]]:
    """The COMMIT statements the store's writer connection runs meanwhile."""
    seen: list[str] = []
    conn = store._writer.conn
    assert conn is not None, "open the writer first (one commit)"
    conn.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


async def seed(store: SQLiteSessionStore, ids: list[str], n: int) -> None:
    for sid in ids:
        await store.create(sid)
        await store.commit(sid, history(n, sid))


async def pile_up(store: SQLiteSessionStore, commits: list[asyncio.Task[object]]) -> None:
    """Let the tasks submit while the writer is held, so they wait as one batch."""
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert not any(task.done() for task in commits)


def test_commits_that_wait_for_a_busy_writer_share_one_transaction(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    ids = [f"s{i}" for i in range(8)]

    async def run() -> list[str]:
        await seed(store, ids, 1)
        with counting_commits(store) as seen:
            with store._writer.lock:  # a batch in progress holds the writer
                tasks = [asyncio.create_task(store.commit(sid, history(3, sid))) for sid in ids]
                await pile_up(store, tasks)  # type: ignore[arg-type]
            results = await asyncio.gather(*tasks)
        assert [r.message_count for r in results] == [3] * len(ids)
        return seen

    seen = asyncio.run(run())
    # The first commit may have been taken alone before the writer was found busy;
    # every other one went in one transaction with the rest.
    assert 1 <= len(seen) <= 2, seen
    for sid in ids:
        assert asyncio.run(store.get(sid)).messages == history(3, sid)
    store.close()


def test_a_commit_that_fails_in_a_batch_fails_alone(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")

    async def run() -> list[object]:
        await seed(store, ["a", "b", "c"], 2)
        stale = (await store.get("b")).tail
        await store.commit("b", history(3, "b"))  # "b" moves on: the stale tail is stale
        with store._writer.lock:
            tasks = [
                asyncio.create_task(store.commit("a", history(4, "a"))),
                asyncio.create_task(store.commit("b", history(5, "b"), expected_tail=stale)),
                asyncio.create_task(store.commit("c", history(4, "c"))),
                # The same session twice in one batch: the second builds on the first.
                asyncio.create_task(store.commit("a", history(6, "a"))),
            ]
            await pile_up(store, tasks)  # type: ignore[arg-type]
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(run())
    assert isinstance(outcomes[1], SessionConflictError)
    assert [getattr(o, "message_count", None) for o in outcomes] == [4, None, 4, 6]
    assert asyncio.run(store.get("a")).messages == history(6, "a")
    assert asyncio.run(store.get("b")).messages == history(3, "b")
    assert asyncio.run(store.get("c")).messages == history(4, "c")
    store.close()


def test_a_batch_whose_transaction_fails_acknowledges_none_and_the_store_goes_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    store = SQLiteSessionStore(path, busy_timeout=0.05)

    asyncio.run(seed(store, ["a", "b"], 2))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another connection holds the database

    async def locked() -> list[object]:
        with store._writer.lock:
            tasks = [
                asyncio.create_task(store.commit("a", history(3, "a"))),
                asyncio.create_task(store.commit("b", history(3, "b"))),
            ]
            await pile_up(store, tasks)  # type: ignore[arg-type]
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        outcomes = asyncio.run(locked())
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert all(isinstance(o, SessionLockedError) for o in outcomes), outcomes
    assert asyncio.run(store.get("a")).messages == history(2, "a")
    # Nothing the failed batch remembered stands in for the stored rows.
    assert asyncio.run(store.commit("a", history(4, "a"))).message_count == 4
    assert asyncio.run(store.get("a")).messages == history(4, "a")
    store.close()


def test_a_commit_cancelled_before_its_batch_starts_is_not_written(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")

    async def run() -> None:
        await seed(store, ["a", "b"], 1)
        with store._writer.lock:
            first = asyncio.create_task(store.commit("a", history(2, "a")))
            await pile_up(store, [first])  # type: ignore[list-item]
            # The writer thread now waits for the connection with "a" in hand.
            second = asyncio.create_task(store.commit("b", history(2, "b")))
            await asyncio.sleep(0.01)
            second.cancel()
        assert (await first).message_count == 2
        with pytest.raises(asyncio.CancelledError):
            await second

    asyncio.run(run())
    assert asyncio.run(store.get("b")).messages == history(1, "b")
    store.close()


def test_flushes_of_a_non_durable_store_are_synced_together(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db", durability="invocation")

    async def run() -> None:
        await seed(store, ["a", "b", "c"], 2)
        with store._writer.lock:
            tasks = [asyncio.create_task(store.flush(sid)) for sid in ("a", "b", "c")]
            tasks.append(asyncio.create_task(store.commit("a", history(3, "a"))))
            await pile_up(store, tasks)  # type: ignore[arg-type]
        assert await asyncio.gather(*tasks[:3]) == [None, None, None]
        assert (await tasks[3]).message_count == 3  # type: ignore[attr-defined]

    asyncio.run(run())
    assert asyncio.run(store.get("a")).messages == history(3, "a")
    store.close()


# ---------------------------------------------------------------- GroupWriter itself


def test_group_writer_gives_each_item_its_own_outcome_from_any_loop() -> None:
    batches: list[list[int]] = []
    gate = threading.Event()

    def run_batch(items: object) -> list[object]:
        gate.wait(5)
        batches.append(list(items))  # type: ignore[call-overload]
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]  # type: ignore[attr-defined]

    writer: GroupWriter[int, int] = GroupWriter("test-group", run_batch)
    results: dict[int, object] = {}

    def submit_from_own_loop(item: int) -> None:
        async def one() -> None:
            try:
                results[item] = await writer.submit(item)
            except ValueError as exc:
                results[item] = exc

        asyncio.run(one())

    threads = [threading.Thread(target=submit_from_own_loop, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    threading.Event().wait(0.2)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert sorted(i for batch in batches for i in batch) == list(range(6))
    assert len(batches) < 6  # items that waited went together
    for i in range(6):
        if i % 2:
            assert str(results[i]) == f"odd {i}"
        else:
            assert results[i] == i * 10
    writer.shutdown()


def test_group_writer_fails_every_item_when_the_batch_raises() -> None:
    def run_batch(items: object) -> list[object]:
        raise OSError("disk gone")

    writer: GroupWriter[int, int] = GroupWriter("test-group", run_batch)

    async def run() -> None:
        with pytest.raises(OSError, match="disk gone"):
            await writer.submit(1)
        with pytest.raises(OSError, match="disk gone"):  # and the next batch runs too
            await writer.submit(2)

    asyncio.run(run())
    writer.shutdown()


def test_a_batch_wakes_each_submitting_loop_once() -> None:
    """Sixteen items of one batch, submitted from one loop, come back in one call from
    the writer thread (each call a wake-up of the loop: a self-pipe write under the
    GIL), not one per item; a second loop's items come back in a call of their own."""
    gate = threading.Event()

    def run_batch(items: object) -> list[object]:
        gate.wait(5)
        return [i * 2 for i in items]  # type: ignore[attr-defined]

    writer: GroupWriter[int, int] = GroupWriter("test-group", run_batch)
    wakes: list[int] = []

    async def sixteen(first: int) -> list[int]:
        loop = asyncio.get_running_loop()
        threadsafe = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                wakes.append(first)
            return threadsafe(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        return await asyncio.gather(*(writer.submit(first + i) for i in range(16)))

    async def main() -> None:
        held = asyncio.create_task(writer.submit(-1))  # the batch the others wait behind
        await asyncio.sleep(0.05)
        other: list[list[int]] = []
        thread = threading.Thread(target=lambda: other.append(asyncio.run(sixteen(100))))
        thread.start()
        mine = asyncio.create_task(sixteen(0))
        await asyncio.sleep(0.2)
        gate.set()
        assert await mine == [i * 2 for i in range(16)]
        assert await held == -2
        thread.join(10)
        assert other == [[(100 + i) * 2 for i in range(16)]]

    asyncio.run(main())
    # The held item's batch wakes this loop once; the next batch, all 32 items, once
    # each loop (one wake an item would be 1 + 16 + 16).
    assert sorted(wakes) == [0, 0, 100]
    writer.shutdown()


def test_a_submitter_cancelled_after_its_batch_started_leaves_the_others_their_outcomes() -> None:
    started, gate = threading.Event(), threading.Event()
    ran: list[list[int]] = []

    def run_batch(items: object) -> list[object]:
        started.set()
        gate.wait(5)
        ran.append(list(items))  # type: ignore[call-overload]
        return list(items)  # type: ignore[call-overload]

    writer: GroupWriter[int, int] = GroupWriter("test-group", run_batch)

    async def main() -> None:
        first = asyncio.create_task(writer.submit(1))
        assert await asyncio.to_thread(started.wait, 5)
        others = [asyncio.create_task(writer.submit(i)) for i in (2, 3, 4)]
        await asyncio.sleep(0.05)
        first.cancel()  # its batch runs: it is written all the same
        others[1].cancel()  # still queued: withdrawn, never run
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        with pytest.raises(asyncio.CancelledError):
            await others[1]
        assert [await others[0], await others[2]] == [2, 4]

    asyncio.run(main())
    assert ran == [[1], [2, 4]]
    writer.shutdown()


def test_a_batch_goes_without_savepoints_until_one_of_its_commits_fails(tmp_path: Path) -> None:
    """Savepoints cost two statements a commit: a batch first goes without, and only a
    batch one of whose commits fails is rolled back and run again with them."""
    store = SQLiteSessionStore(tmp_path / "s.db")
    seen: list[str] = []

    async def batch(commits: list[tuple[str, int, str | None]]) -> list[object]:
        with store._writer.lock:
            tasks = [
                asyncio.create_task(store.commit(sid, history(n, sid), expected_tail=tail))
                for sid, n, tail in commits
            ]
            await pile_up(store, tasks)  # type: ignore[arg-type]
        return await asyncio.gather(*tasks, return_exceptions=True)

    async def run() -> tuple[list[object], list[str], list[object], list[str]]:
        await seed(store, ["a", "b", "c"], 2)
        conn = store._writer.conn
        assert conn is not None
        conn.set_trace_callback(seen.append)
        good = await batch([("a", 3, None), ("b", 3, None), ("c", 3, None)])
        clean, seen[:] = list(seen), []
        stale = (await store.get("b")).tail
        await store.commit("b", history(4, "b"))
        seen.clear()
        mixed = await batch([("a", 4, None), ("b", 5, stale), ("c", 4, None)])
        return good, clean, mixed, list(seen)

    good, clean, mixed, retried = asyncio.run(run())
    assert [getattr(o, "message_count", None) for o in good] == [3, 3, 3]
    # (The first commit of each batch may be taken alone before the writer was found
    # busy, as in the tests above; the others go together.)
    assert not any(sql.startswith("SAVEPOINT") for sql in clean), clean
    assert 1 <= clean.count("COMMIT") <= 2
    assert isinstance(mixed[1], SessionConflictError)
    assert [getattr(o, "message_count", None) for o in mixed] == [4, None, 4]
    # Tried once without savepoints and rolled back, then again with one a commit.
    assert retried.count("ROLLBACK") == 1, retried
    assert sum(sql == "SAVEPOINT perdure_commit" for sql in retried) in (2, 3)
    assert 1 <= retried.count("COMMIT") <= 2
    for sid, n in (("a", 4), ("b", 4), ("c", 4)):
        assert asyncio.run(store.get(sid)).messages == history(n, sid)
    store.close()
