"""Layer 0's per-process holders: what a child made by fork() starts with."""

from __future__ import annotations

import os
import threading

import pytest

from helpers import exit_code, fork_child
from perdure._runtime.threads import PerProcess, ProcessLock, StoreThread, fork_generation

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def test_a_lock_a_parent_thread_holds_at_the_fork_is_free_in_the_child() -> None:
    lock = ProcessLock()
    reentrant = ProcessLock(reentrant=True)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock, reentrant:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    assert not lock.acquire(blocking=False)
    assert lock.locked()
    assert reentrant.locked()

    def child() -> None:
        assert not lock.locked()
        assert not reentrant.locked()
        assert lock.acquire(timeout=1)
        assert lock.locked()
        with reentrant, reentrant:
            pass

    try:
        assert exit_code(fork_child(child, timeout=10)) == 0
    finally:
        release.set()
        holder.join()
    assert not lock.locked()
    assert not reentrant.locked()
    assert lock.acquire(blocking=False)  # the parent's lock is its own again
    lock.release()


def test_a_per_process_value_is_made_again_in_a_child_unless_carried() -> None:
    made: list[int] = []
    fresh = PerProcess(lambda: made.append(1) or object())
    carried: PerProcess[list[str]] = PerProcess(list, carry=lambda old: [*old, "carried"])
    parent_value = fresh.value
    carried.value.append("parent")
    generation = fork_generation()

    def child() -> None:
        assert fork_generation() == generation + 1
        assert fresh.value is not parent_value
        assert carried.value == ["parent", "carried"]
        fresh.value = "set here"
        assert fresh.value == "set here"

    assert exit_code(fork_child(child, timeout=10)) == 0
    assert fresh.value is parent_value
    assert carried.value == ["parent"]
    assert len(made) == 1


def test_a_store_thread_runs_work_in_a_child() -> None:
    worker = StoreThread("perdure-test-worker")
    assert worker.executor().submit(lambda: 1).result(5) == 1
    parent_executor = worker.executor()

    def child() -> None:
        assert worker.executor() is not parent_executor
        assert worker.executor().submit(lambda: 2).result(5) == 2
        worker.shutdown()

    assert exit_code(fork_child(child, timeout=10)) == 0
    assert worker.executor() is parent_executor
    worker.shutdown()


def test_a_child_forked_while_a_parent_thread_runs_a_turn_runs_its_own() -> None:
    """An agent's turn lock is the parent thread's alone: a forked child may take a turn."""
    from perdure import Agent
    from perdure.errors import TurnRunningError
    from perdure.models import ScriptedModel

    agent = Agent(model=ScriptedModel(["parent", "child"]))
    assert agent._turn_lock.acquire(blocking=False)  # as a turn in another thread holds it
    try:
        with pytest.raises(TurnRunningError):
            agent("in the parent")

        def child() -> None:
            assert str(agent("in the child")) == "parent"

        assert exit_code(fork_child(child, timeout=30)) == 0
    finally:
        agent._turn_lock.release()
