"""The sync façade's hand-off to perdure's loop: results, errors, interruption."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

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


def test_an_interrupt_before_the_coroutine_started_closes_it_at_once() -> None:
    """The loop is busy when the call arrives: the interrupt lands before the first step."""
    from perdure._runtime.loop import _get_loop

    ran = threading.Event()

    async def never_started() -> None:
        ran.set()

    main = threading.get_ident()
    loop = _get_loop()
    busy = threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        time.sleep(0.5)  # start() and cancel() queue up behind this

    loop.call_soon_threadsafe(hold_the_loop)
    assert busy.wait(5)

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
    assert run_blocking(answer()) == 42
