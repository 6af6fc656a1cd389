"""The sync façade's hand-off to perdure's loop: results, errors, interruption."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import threading
import time
from typing import Any

import pytest

from perdure._runtime.loop import run_blocking


async def answer() -> int:
    await asyncio.sleep(0)
    return 42


async def fail(error: BaseException) -> None:
    await asyncio.sleep(0)
    raise error


def test_the_result_and_the_error_of_the_coroutine_reach_the_caller() -> None:
    assert run_blocking(answer()) == 42
    with pytest.raises(ValueError, match="bad input"):
        run_blocking(fail(ValueError("bad input")))
    assert run_blocking(answer()) == 42  # the loop goes on


def test_a_base_exception_in_the_coroutine_reaches_the_caller_and_spares_the_loop() -> None:
    with pytest.raises(SystemExit):
        run_blocking(fail(SystemExit(3)))
    with pytest.raises(KeyboardInterrupt):
        run_blocking(fail(KeyboardInterrupt()))
    assert run_blocking(answer()) == 42  # perdure's loop thread is still running


def test_an_interrupt_while_waiting_cancels_the_coroutine() -> None:
    started, stopped = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    main = threading.get_ident()

    def interrupt() -> None:
        started.wait(5)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_blocking(forever())
    assert stopped.is_set()  # cancelled before the call returned
    assert run_blocking(answer()) == 42


def test_while_a_call_runs_a_sigint_wakes_the_loop_through_a_socket_it_watches() -> None:
    """A SIGINT that lands just before the loop's select() must not wait there
    unhandled: the C handler writes to a wakeup fd, and the loop watches its socket.
    (Set once the loop runs: the call's first step, run before it, does no select().)"""
    seen: dict[str, int] = {}

    def wakeup_fd() -> int:
        fd = signal.set_wakeup_fd(-1)  # read it (and put it back at once)
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        return fd

    async def look() -> None:
        seen["first step"] = wakeup_fd()
        await asyncio.sleep(0)  # the loop runs the rest
        seen["fd"] = wakeup_fd()

    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    run_blocking(look())
    assert seen["first step"] == before
    assert seen["fd"] >= 0
    peer = socket.socket(fileno=os.dup(seen["fd"]))
    try:  # the other end is one the loop reads: a byte written there wakes it
        assert peer.type == socket.SOCK_STREAM
        assert peer.getpeername() is not None
    finally:
        peer.close()
    after = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(after)
    assert after == before  # given back when the call ended


def test_interrupts_at_any_moment_of_a_call_each_end_it_at_once() -> None:
    """SIGINTs sent after random short delays, many times: each call ends within a
    second, never left waiting in select() for the hour it was asked to sleep."""
    rng = random.Random(7)
    main = threading.get_ident()
    slow: list[int] = []

    async def forever() -> None:
        await asyncio.sleep(3600)

    def one_call(delay: float) -> bool:
        """One call interrupted after ``delay``; False when the interrupt was lost."""
        done, lost = threading.Event(), threading.Event()

        def interrupt() -> None:
            time.sleep(delay)
            signal.pthread_kill(main, signal.SIGINT)
            if not done.wait(1.0):  # lost: a second one raises at once
                lost.set()
                signal.pthread_kill(main, signal.SIGINT)

        sender = threading.Thread(target=interrupt, daemon=True)
        try:  # it may land before the call, too
            sender.start()
            run_blocking(forever())
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the call ended without the interrupt")
        done.set()
        sender.join(5)
        return not lost.is_set()

    for attempt in range(150):
        if not one_call(rng.uniform(0, 0.002)):
            slow.append(attempt)
    assert slow == []
    assert run_blocking(answer()) == 42


def test_an_interrupt_before_the_coroutine_started_closes_it_at_once() -> None:
    """The loop is busy with another thread's call when this one is handed over: the
    interrupt lands before the coroutine's first step."""
    ran = threading.Event()
    busy = threading.Event()

    async def never_started() -> None:
        ran.set()

    async def hold_the_loop() -> None:
        busy.set()
        time.sleep(0.5)  # noqa: ASYNC251 - blocks the loop: start() and cancel() queue up

    holder = threading.Thread(target=run_blocking, args=(hold_the_loop(),))
    holder.start()
    assert busy.wait(5)
    main = threading.get_ident()

    def interrupt() -> None:
        time.sleep(0.1)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    began = time.monotonic()
    coro = never_started()
    with pytest.raises(KeyboardInterrupt):
        run_blocking(coro)
    assert time.monotonic() - began < 2  # not the 5 s fallback wait
    assert not ran.is_set()
    assert coro.cr_frame is None  # closed: no "never awaited" warning later
    holder.join(5)
    assert run_blocking(answer()) == 42


async def thread_ident() -> int:
    await asyncio.sleep(0)
    return threading.get_ident()


def test_a_call_from_a_thread_without_a_loop_runs_on_that_thread() -> None:
    """No hand-off to another thread: a sync turn costs what the async one does."""
    assert run_blocking(thread_ident()) == threading.get_ident()
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(run_blocking(thread_ident())))
    worker.start()
    worker.join(5)
    assert seen == [worker.ident]


def test_concurrent_calls_share_the_loop_and_none_waits_for_another() -> None:
    """A second thread's call joins the loop the first one runs; the first returns as
    soon as its own coroutine is done, while the second's goes on (in a thread)."""
    loop_of: dict[str, asyncio.AbstractEventLoop] = {}
    first_in, second_in = threading.Event(), threading.Event()
    ended: dict[str, float] = {}

    async def first() -> None:
        loop_of["first"] = asyncio.get_running_loop()
        first_in.set()
        for _ in range(500):  # stay on the loop until the second call is in
            if second_in.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)

    async def second() -> None:
        loop_of["second"] = asyncio.get_running_loop()
        second_in.set()
        await asyncio.sleep(1.5)

    def call(name: str, coro: Any) -> None:
        run_blocking(coro)
        ended[name] = time.monotonic()

    began = time.monotonic()
    a = threading.Thread(target=call, args=("first", first()))
    a.start()
    assert first_in.wait(5)
    b = threading.Thread(target=call, args=("second", second()))
    b.start()
    a.join(10)
    b.join(10)
    assert loop_of["first"] is loop_of["second"]
    assert ended["first"] - began < 1.0  # did not wait for the second call's 1.5 s
    assert ended["second"] - began >= 1.5
    assert run_blocking(thread_ident()) == threading.get_ident()  # back on the caller


def test_ctrl_c_on_the_main_thread_cancels_the_coroutine_at_its_await() -> None:
    """Run on the caller's thread, a SIGINT cancels the coroutine (its ``finally`` runs
    at the ``await`` it was in) and the call then raises ``KeyboardInterrupt``."""
    where: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            where.append("cancelled at the await")
            raise

    threading.Timer(0.2, signal.pthread_kill, (threading.get_ident(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        run_blocking(forever())
    assert where == ["cancelled at the await"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert run_blocking(answer()) == 42


def test_tasks_a_call_leaves_running_go_on_after_it_returns() -> None:
    """A call that leaves work on the loop (a memory extraction job, a tool's background
    task) returns at once, and that work goes on without a next sync call: code in
    another loop may wait for it (``asyncio.run(manager.flush())``)."""
    finished = threading.Event()
    rounds: list[int] = []

    async def background() -> None:
        for i in range(5):
            await asyncio.sleep(0.02)
            rounds.append(i)
        finished.set()

    async def start_and_return() -> str:
        task = asyncio.get_running_loop().create_task(background())
        keep.append(task)
        return "returned"

    keep: list[asyncio.Task[None]] = []
    assert run_blocking(start_and_return()) == "returned"
    assert not finished.is_set()  # the call did not wait for it

    async def wait_elsewhere() -> bool:
        return await asyncio.to_thread(finished.wait, 10)

    assert asyncio.run(wait_elsewhere())  # another loop, no perdure call in between
    assert rounds == [0, 1, 2, 3, 4]
    deadline = time.monotonic() + 5  # the loop thread stops once nothing is left
    while time.monotonic() < deadline and run_blocking(thread_ident()) != threading.get_ident():
        time.sleep(0.05)
    assert run_blocking(thread_ident()) == threading.get_ident()


def test_a_long_call_making_many_tasks_keeps_only_the_live_ones_in_mind() -> None:
    """The loop remembers the tasks a call makes (to see, when it ends, whether any are
    left to run); finished ones are dropped as they pile up, never kept for the call."""
    from perdure._runtime.loop import _runner

    async def tick() -> None:
        await asyncio.sleep(0)

    async def many() -> int:
        for _ in range(20):
            await asyncio.gather(*(tick() for _ in range(500)))
        return len(_runner.value.made)

    assert run_blocking(many()) <= 1024 + 500
