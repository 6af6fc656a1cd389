"""The sync façade runs a call's first step at once: what a call that never waits keeps.

A coroutine that finishes without waiting (a bare agent turn) is run by
``run_blocking`` without a pass of the event loop. These tests pin what it must still
be: a real task's step, with the loop running, its async generators tracked and
callbacks it scheduled run before the call returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from perdure import Agent
from perdure._runtime import loop as loop_module
from perdure._runtime.loop import run_blocking
from perdure.models import ScriptedModel

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


@pytest.fixture
def selects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The selector calls perdure's loop makes (each is a pass of the loop)."""
    run_blocking(asyncio.sleep(0))  # the loop exists
    loop: Any = loop_module._runner.value.loop
    calls: list[Any] = []
    real = loop._selector.select

    def counted(timeout: Any = None) -> Any:
        calls.append(timeout)
        return real(timeout)

    monkeypatch.setattr(loop._selector, "select", counted)
    return calls


async def plain() -> str:
    return "done"


def test_a_call_that_never_waits_runs_without_a_pass_of_the_loop(selects: list[Any]) -> None:
    assert loop_module._EAGER  # CPython's own loop: the fast path is there to take
    assert run_blocking(plain()) == "done"
    agent = Agent(model=ScriptedModel(["hi"] * 3, record="none"))
    assert str(agent("hello")) == "hi"
    assert selects == []


def test_a_call_that_waits_still_runs_on_the_loop(selects: list[Any]) -> None:
    async def waits() -> int:
        await asyncio.sleep(0.01)
        return 7

    assert run_blocking(waits()) == 7
    assert selects  # the loop ran for the timer


def test_the_first_step_is_a_running_task_of_perdures_loop() -> None:
    seen: dict[str, Any] = {}

    async def look() -> None:
        loop = asyncio.get_running_loop()
        seen["loop_running"] = loop.is_running()
        seen["task"] = asyncio.current_task()
        seen["is_perdures"] = loop is loop_module._runner.value.loop
        async with asyncio.timeout(5):  # entered in the first step: needs a current task
            seen["timeout_ok"] = True
            await asyncio.sleep(0)

    run_blocking(look())
    assert seen["loop_running"]
    assert seen["is_perdures"]
    assert seen["timeout_ok"]
    assert isinstance(seen["task"], asyncio.Task)
    with pytest.raises(RuntimeError):  # and afterwards, no loop is left running here
        asyncio.get_running_loop()
    assert not loop_module._runner.value.loop.is_running()  # type: ignore[union-attr]


def test_the_call_sees_the_callers_context_and_does_not_change_it() -> None:
    async def read_and_set() -> str:
        before = VAR.get()
        VAR.set("inside")
        return before

    token = VAR.set("caller")
    try:
        assert run_blocking(read_and_set()) == "caller"
        assert VAR.get() == "caller"  # the call ran in a copy, as a task does
    finally:
        VAR.reset(token)


def test_callbacks_and_tasks_the_step_scheduled_run_before_the_call_returns() -> None:
    ran: list[str] = []

    async def schedules() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(ran.append, "callback")
        future = loop.create_future()
        future.add_done_callback(lambda _f: ran.append("done callback"))
        future.set_result(None)

    run_blocking(schedules())
    assert ran == ["callback", "done callback"]


def test_an_async_generator_left_open_in_the_step_is_closed_by_the_loop() -> None:
    closed: list[bool] = []

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            await asyncio.sleep(0)  # only a close run by the loop gets past this
            closed.append(True)

    async def leaves_it_open() -> int:
        gen = numbers()
        return await gen.__anext__()  # dropped after one item, never closed here

    assert run_blocking(leaves_it_open()) == 1
    gc.collect()  # the loop's finalizer hook schedules its aclose()
    run_blocking(asyncio.sleep(0.01))  # ... which the next passes of the loop run
    assert closed == [True]


def test_errors_of_a_call_that_never_waits_reach_the_caller() -> None:
    async def fails(error: BaseException) -> None:
        raise error

    with pytest.raises(ValueError, match="bad"):
        run_blocking(fails(ValueError("bad")))
    with pytest.raises(KeyboardInterrupt):
        run_blocking(fails(KeyboardInterrupt()))
    with pytest.raises(asyncio.CancelledError):
        run_blocking(fails(asyncio.CancelledError()))
    assert run_blocking(plain()) == "done"  # the loop is fine afterwards
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_a_sync_call_from_inside_the_step_is_refused_as_from_the_loop() -> None:
    agent = Agent(model=ScriptedModel(["hi"], record="none"))

    async def nested() -> None:
        agent("hello")  # perdure's own loop is running on this thread

    with pytest.raises(RuntimeError, match="own event loop"):
        run_blocking(nested())
