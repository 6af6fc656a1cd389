"""Interrupts (a tool asks the human) and cancellation from another thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import assert_model_valid, tool_call, tool_calls
from perdure import Agent, ToolContext, tool
from perdure.agent import Checkpoint, Snapshot, ToolStartEvent
from perdure.models import ScriptedModel

LOG: list[str] = []


@tool
def approve(amount: int, context: ToolContext) -> str:
    """Ask a human to approve a payment.

    Args:
        amount: dollars.
    """
    LOG.append(f"approve {amount}")
    answer = context.interrupt("approval", {"amount": amount})
    return f"approved={answer}"


@tool
def lookup(key: str) -> str:
    """Look something up.

    Args:
        key: what.
    """
    LOG.append(f"lookup {key}")
    return key.upper()


@pytest.fixture(autouse=True)
def _clear() -> None:
    LOG.clear()


def answer(result: Any, response: Any) -> list[Any]:
    return [
        {"interruptResponse": {"interruptId": i.id, "response": response}}
        for i in result.interrupts
    ]


def test_interrupt_round_trip() -> None:
    model = ScriptedModel(
        [tool_calls(("t1", "approve", {"amount": 30}), ("t2", "lookup", {"key": "x"})), "paid"]
    )
    agent = Agent(model=model, tools=[approve, lookup])
    result = agent("pay")
    assert result.stop_reason == "interrupt"
    assert [(i.name, i.reason) for i in result.interrupts] == [("approval", {"amount": 30})]
    assert agent.interrupt_state.activated
    assert_model_valid(agent.messages, allow_pending_last=True)
    done = agent(answer(result, "yes"))
    assert done.stop_reason == "end_turn"
    results = [b["toolResult"] for b in agent.messages[2]["content"]]
    assert [r["toolUseId"] for r in results] == ["t1", "t2"]
    assert results[0]["content"] == [{"text": "approved=yes"}]
    assert results[1]["content"] == [{"text": "X"}]
    # the finished tool did not run again on resume; the interrupted one did
    assert LOG == ["approve 30", "lookup x", "approve 30"]
    assert not agent.interrupt_state.activated
    assert_model_valid(agent.messages)


def test_interrupt_beats_checkpoint() -> None:
    model = ScriptedModel([tool_call("t1", "approve", amount=5), "ok"])
    agent = Agent(model=model, tools=[approve], checkpointing=True)
    first = agent("pay")
    assert first.stop_reason == "checkpoint"  # after_model, before the tool runs
    second = agent([{"checkpointResume": {"checkpoint": first.checkpoint.to_dict()}}])  # type: ignore[union-attr]
    assert second.stop_reason == "interrupt"  # no after_tools checkpoint
    assert second.checkpoint is None
    third = agent(answer(second, "no"))
    assert third.stop_reason == "checkpoint"
    assert third.checkpoint == Checkpoint("after_tools", 0)


def test_pending_interrupts_survive_a_snapshot() -> None:
    model = ScriptedModel([tool_call("t1", "approve", amount=9)])
    agent = Agent(model=model, tools=[approve])
    result = agent("pay")
    saved = agent.take_snapshot().to_json()
    fresh = Agent(model=ScriptedModel(["thanks"]), tools=[approve])
    fresh.load_snapshot(Snapshot.from_json(saved))
    assert [i.id for i in fresh.interrupt_state.pending] == [i.id for i in result.interrupts]
    done = fresh(answer(result, "ok"))
    assert done.stop_reason == "end_turn"
    assert fresh.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "approved=ok"}]


def test_interrupt_response_errors() -> None:
    agent = Agent(
        model=ScriptedModel(["hi", tool_call("t1", "approve", amount=1)]), tools=[approve]
    )
    agent("hello")
    with pytest.raises(ValueError, match="no tool calls are pending"):
        agent([{"interruptResponse": {"interruptId": "x", "response": 1}}])
    result = agent("pay")
    with pytest.raises(ValueError, match="unknown interrupt id"):
        agent([{"interruptResponse": {"interruptId": "nope", "response": 1}}])
    with pytest.raises(ValueError, match="interruptId"):
        agent([{"interruptResponse": {"response": 1}}])
    with pytest.raises(ValueError, match="only interruptResponse"):
        agent([*answer(result, 1), {"text": "hi"}])
    # A response no session could store (it joins the persisted interrupt state).
    with pytest.raises(ValueError, match=r"prompt\[0\]\.interruptResponse\.response\.x: nan"):
        agent(answer(result, {"x": float("nan")}))
    assert agent.interrupt_state.activated  # the failed calls changed nothing


def test_new_prompt_over_pending_interrupt_closes_the_call() -> None:
    model = ScriptedModel([tool_call("t1", "approve", amount=1), "moving on"])
    agent = Agent(model=model, tools=[approve])
    agent("pay")
    result = agent("forget it")
    assert str(result) == "moving on"
    assert not agent.interrupt_state.activated
    assert_model_valid(agent.messages)


def test_moving_on_from_an_interrupt_keeps_the_results_of_calls_that_ran(
    tmp_path: Path,
) -> None:
    # One model turn asks for two calls; one interrupts, the other runs (a side
    # effect). A new prompt instead of an answer closes only the interrupted call:
    # the one that ran keeps its real result, in this process and in the next.
    from perdure.session import FileSessionStore, Session

    store = FileSessionStore(tmp_path)
    model = ScriptedModel(
        [tool_calls(("t1", "approve", {"amount": 30}), ("t2", "lookup", {"key": "x"}))]
    )
    Agent(model=model, tools=[approve, lookup], session_manager=Session(store, "s"))("pay")
    assert LOG == ["approve 30", "lookup x"]
    resumed = Agent(
        model=ScriptedModel(["moving on"]),
        tools=[approve, lookup],
        session_manager=Session.resume(store, "s"),
    )
    assert resumed.interrupt_state.activated
    resumed("forget it")
    closing = resumed.messages[2]["content"]
    results = {b["toolResult"]["toolUseId"]: b["toolResult"] for b in closing if "toolResult" in b}
    assert results["t2"]["content"] == [{"text": "X"}]  # it ran: its result, not "not run"
    assert results["t2"].get("status") != "error"
    assert results["t1"]["status"] == "error"
    assert "was not run" in results["t1"]["content"][0]["text"]
    assert [b for b in closing if "text" in b] == [{"text": "forget it"}]
    assert LOG == ["approve 30", "lookup x"]  # nothing ran again
    assert_model_valid(resumed.messages)


def test_cancel_from_another_thread_stops_at_next_boundary() -> None:
    started = threading.Event()

    @tool
    def slow() -> str:
        """Take a while."""
        started.set()
        time.sleep(0.3)
        return "slow done"

    model = ScriptedModel([tool_call(f"t{i}", "slow") for i in range(5)])
    agent = Agent(model=model, tools=[slow])
    canceller = threading.Thread(target=lambda: (started.wait(5), agent.cancel()))
    canceller.start()
    result = agent("go")
    canceller.join()
    assert result.stop_reason == "cancelled"
    assert len(model.requests) == 1  # stopped before the next model call
    assert agent.messages[-1]["content"][0]["toolResult"]["content"] == [{"text": "slow done"}]
    assert_model_valid(agent.messages)
    # the next invocation is not cancelled
    agent.model = ScriptedModel(["fresh"])
    assert agent("again").stop_reason == "end_turn"


async def test_cancel_after_model_closes_the_calls_it_asked_for() -> None:
    model = ScriptedModel([tool_call("t1", "lookup", key="a"), "never"])
    agent = Agent(model=model, tools=[lookup])
    events = []
    async for event in agent.stream_async("go"):
        events.append(event)
        if type(event).__name__ == "ModelMessageEvent":
            agent.cancel()
    assert events[-1].result.stop_reason == "cancelled"  # type: ignore[attr-defined]
    assert not any(isinstance(e, ToolStartEvent) for e in events)
    assert LOG == []
    assert agent.messages[-1]["content"][0]["toolResult"]["status"] == "error"
    assert_model_valid(agent.messages)


async def test_cancel_mid_stream_appends_nothing_partial() -> None:
    model = ScriptedModel(["a long streamed answer with many words"], delay=0.01)
    agent = Agent(model=model)
    task = asyncio.create_task(agent.invoke_async("go"))
    await asyncio.sleep(0.03)
    agent.cancel()
    result = await task
    assert result.stop_reason == "cancelled"
    assert agent.messages == [{"role": "user", "content": [{"text": "go"}]}]


def test_cancel_beats_checkpoint() -> None:
    @tool
    def cancels(context: ToolContext) -> str:
        """Cancel the running invocation."""
        context.agent.cancel()
        return "ok"

    model = ScriptedModel([tool_call("t1", "cancels"), "never"])
    agent = Agent(model=model, tools=[cancels], checkpointing=True)
    first = agent("go")
    assert first.stop_reason == "checkpoint"
    second = agent([{"checkpointResume": {"checkpoint": first.checkpoint.to_dict()}}])  # type: ignore[union-attr]
    assert second.stop_reason == "cancelled"
    assert second.checkpoint is None


def test_cancel_without_a_running_turn_does_nothing() -> None:
    agent = Agent(model=ScriptedModel(["hi"]))
    agent.cancel()
    assert agent("hello").stop_reason == "end_turn"


class SilentModel:
    """A model that goes quiet for a long time before its first token."""

    async def stream(self, messages: Any, *, tool_specs: Any, system_prompt: Any) -> Any:
        await asyncio.sleep(30)
        yield None  # pragma: no cover - never reached


def test_cancel_does_not_wait_for_a_silent_model() -> None:
    agent = Agent(model=SilentModel())  # type: ignore[arg-type]
    timer = threading.Timer(0.2, agent.cancel)
    timer.start()
    started = time.perf_counter()
    result = agent("hello?")
    elapsed = time.perf_counter() - started
    timer.join()
    assert result.stop_reason == "cancelled"
    assert elapsed < 2, f"cancel took {elapsed:.1f} s"
    assert agent.messages == [{"role": "user", "content": [{"text": "hello?"}]}]


async def test_a_cancelled_wait_for_the_model_leaves_the_callers_task_uncancelled() -> None:
    # cancel() interrupts the wait for the model by cancelling the waiting task; the
    # cancellation is taken back, so the caller's own timeouts and awaits go on.
    agent = Agent(model=SilentModel())  # type: ignore[arg-type]
    asyncio.get_running_loop().call_later(0.1, agent.cancel)
    async with asyncio.timeout(5):
        result = await agent.invoke_async("hello?")
        assert result.stop_reason == "cancelled"
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0
        await asyncio.sleep(0.01)  # no CancelledError left pending for this task


async def test_a_cancel_while_the_caller_handles_an_event_does_not_reach_the_callers_code() -> None:
    # Stream events are handed to the caller in the same task; a cancel() arriving
    # while the caller's own code awaits must stop the stream before its next event,
    # never cancel what the caller awaits.
    model = ScriptedModel(["one two three four five six"], delay=0.001)
    agent = Agent(model=model)
    seen = 0
    async for _event in agent.stream_async("go"):
        seen += 1
        if seen == 2:
            threading.Thread(target=agent.cancel).start()
            await asyncio.sleep(0.05)  # the caller's await: must not be cancelled
    assert agent.messages == [{"role": "user", "content": [{"text": "go"}]}]


class StubbornModel:
    """A model that swallows the cancellation of its wait and keeps streaming."""

    async def stream(self, messages: Any, *, tool_specs: Any, system_prompt: Any) -> Any:
        from perdure.models import ModelResponse, TextDelta

        with contextlib.suppress(asyncio.CancelledError):  # ignores it
            await asyncio.sleep(30)
        yield TextDelta("still here")
        yield ModelResponse(
            message={"role": "assistant", "content": [{"text": "still here"}]},
            stop_reason="end_turn",
        )


async def test_a_model_that_swallows_the_interrupt_is_still_stopped() -> None:
    agent = Agent(model=StubbornModel())  # type: ignore[arg-type]
    asyncio.get_running_loop().call_later(0.1, agent.cancel)
    result = await agent.invoke_async("hello?")
    assert result.stop_reason == "cancelled"
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0
    assert agent.messages == [{"role": "user", "content": [{"text": "hello?"}]}]
