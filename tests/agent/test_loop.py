"""The agent loop: prompts, tool cycles, errors, guards and the sync façade."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from helpers import assert_model_valid, tool_call, tool_calls
from perdure import Agent, NullConversationManager, tool
from perdure.agent import (
    ModelMessageEvent,
    ResultEvent,
    TextDeltaEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from perdure.errors import ModelError, TurnRunningError
from perdure.models import ModelResponse, ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: first.
        b: second.
    """
    return a + b


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


def test_text_turn_returns_result_and_history() -> None:
    agent = Agent(model=ScriptedModel(["hello there"]))
    result = agent("hi")
    assert result.stop_reason == "end_turn"
    assert str(result) == "hello there"
    assert agent.messages == [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"text": "hello there"}]},
    ]
    assert result.usage["totalTokens"] > 0


def test_tool_cycle_runs_tool_and_feeds_result_back() -> None:
    model = ScriptedModel([tool_call("t1", "add", a=2, b=3), "five"])
    agent = Agent(model=model, tools=[add], system_prompt="be brief")
    result = agent("2+3?")
    assert str(result) == "five"
    results = agent.messages[2]["content"]
    assert results == [
        {"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"text": "5"}]}}
    ]
    # the second request carried the tool result, the tool spec and the system prompt
    second = model.requests[1]
    assert second["messages"][-1] == agent.messages[2]
    assert [spec["name"] for spec in second["tool_specs"]] == ["add"]
    assert second["system_prompt"] == "be brief"
    assert_model_valid(agent.messages)


def test_tool_exception_and_unknown_tool_become_error_results() -> None:
    model = ScriptedModel([tool_calls(("t1", "explode", {}), ("t2", "no_such_tool", {})), "sorry"])
    agent = Agent(model=model, tools=[explode])
    agent("go")
    by_id = {b["toolResult"]["toolUseId"]: b["toolResult"] for b in agent.messages[2]["content"]}
    assert by_id["t1"]["status"] == "error"
    assert "kaboom" in by_id["t1"]["content"][0]["text"]
    assert by_id["t2"]["status"] == "error"
    assert "no_such_tool" in by_id["t2"]["content"][0]["text"]
    assert_model_valid(agent.messages)


def test_bad_tool_input_becomes_error_result() -> None:
    model = ScriptedModel([tool_call("t1", "add", a="two", b=3), "ok"])
    agent = Agent(model=model, tools=[add])
    agent("go")
    result = agent.messages[2]["content"][0]["toolResult"]
    assert result["status"] == "error"
    assert "'a'" in result["content"][0]["text"]


async def test_two_slow_tools_run_concurrently() -> None:
    running = 0
    peak = 0

    @tool
    async def slow_async(label: str) -> str:
        """Sleep a while.

        Args:
            label: a name.
        """
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.3)
        running -= 1
        return label

    @tool
    def slow_sync(label: str) -> str:
        """Block a while.

        Args:
            label: a name.
        """
        time.sleep(0.3)
        return label

    model = ScriptedModel(
        [
            tool_calls(
                ("a", "slow_async", {"label": "a"}),
                ("b", "slow_async", {"label": "b"}),
                ("c", "slow_sync", {"label": "c"}),
                ("d", "slow_sync", {"label": "d"}),
            ),
            "done",
        ]
    )
    agent = Agent(model=model, tools=[slow_async, slow_sync])
    started = time.perf_counter()
    await agent.invoke_async("go")
    elapsed = time.perf_counter() - started
    assert peak == 2
    assert elapsed < 0.9, f"four 0.3 s tools took {elapsed:.2f} s: not concurrent"
    # results come back in call order whatever order they finished in
    ids = [b["toolResult"]["toolUseId"] for b in agent.messages[2]["content"]]
    assert ids == ["a", "b", "c", "d"]


async def test_stream_yields_typed_events_in_order() -> None:
    model = ScriptedModel([tool_call("t1", "add", narration="adding", a=1, b=1), "two"])
    agent = Agent(model=model, tools=[add])
    events = [event async for event in agent.stream_async("1+1")]
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "ResultEvent"
    assert "".join(e.text for e in events if isinstance(e, TextDeltaEvent)) == "addingtwo"
    start = next(i for i, e in enumerate(events) if isinstance(e, ToolStartEvent))
    end = next(i for i, e in enumerate(events) if isinstance(e, ToolEndEvent))
    first_message = next(i for i, e in enumerate(events) if isinstance(e, ModelMessageEvent))
    assert first_message < start < end
    end_event = events[end]
    assert isinstance(end_event, ToolEndEvent)
    assert end_event.result["content"] == [{"text": "2"}]
    result_event = events[-1]
    assert isinstance(result_event, ResultEvent)
    assert result_event.result.stop_reason == "end_turn"


def test_prompt_forms() -> None:
    agent = Agent(model=ScriptedModel(["a", "b", "c"]))
    agent([{"text": "blocks"}, {"text": "two"}])
    assert agent.messages[0] == {"role": "user", "content": [{"text": "blocks"}, {"text": "two"}]}
    agent(
        [
            {"role": "user", "content": [{"text": "m1"}]},
            {"role": "assistant", "content": [{"text": "m2"}]},
            {"role": "user", "content": [{"text": "m3"}]},
        ]
    )
    assert [m["content"][0]["text"] for m in agent.messages[2:5]] == ["m1", "m2", "m3"]
    agent.messages.append({"role": "user", "content": [{"text": "appended"}]})
    result = agent()  # None: go on from the history
    assert str(result) == "c"


@pytest.mark.parametrize(
    ("prompt", "error", "fragment"),
    [
        (42, TypeError, "prompt must be"),
        (b"bytes", TypeError, "prompt must be"),
        ({"text": "a dict"}, TypeError, "prompt must be"),
        ([], ValueError, "empty"),
        (["not a dict"], TypeError, "prompt[0]"),
        ([{"bogus": 1}], ValueError, "prompt[0]"),
        ([{"text": 5}], ValueError, "'text' must be a str"),
        ([{"role": "system", "content": []}], ValueError, "role"),
        ([{"role": "user", "content": "x"}], TypeError, "content"),
        ([{"role": "user", "content": []}, {"text": "x"}], ValueError, "mixes"),
    ],
)
def test_bad_prompt_gets_clear_error(prompt: Any, error: type[Exception], fragment: str) -> None:
    agent = Agent(model=ScriptedModel(["unused"]))
    with pytest.raises(error, match=None) as info:
        agent(prompt)
    assert fragment in str(info.value)
    assert agent.messages == []  # nothing appended


def test_prompt_none_without_history_is_rejected() -> None:
    with pytest.raises(ValueError, match="no history"):
        Agent(model=ScriptedModel([]))()


def test_bad_constructor_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="model"):
        Agent(model=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model spec 'not a model' is malformed"):
        Agent(model="not a model")
    with pytest.raises(ValueError, match="agent_id"):
        Agent(model=ScriptedModel([]), agent_id="a/b")
    with pytest.raises(ValueError, match="max_cycles"):
        Agent(model=ScriptedModel([]), max_cycles=0)
    with pytest.raises(TypeError, match="state"):
        Agent(model=ScriptedModel([]), state=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON-serializable"):
        Agent(model=ScriptedModel([]), state={"k": object()})
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        Agent(model=ScriptedModel([]), messages=[{"role": "bot", "content": []}])  # type: ignore[list-item]


def test_max_cycles_stops_with_clear_reason_and_valid_history() -> None:
    model = ScriptedModel([tool_call(f"t{i}", "add", a=i, b=i) for i in range(10)])
    agent = Agent(model=model, tools=[add], max_cycles=3)
    result = agent("loop forever")
    assert result.stop_reason == "max_cycles"
    assert len(model.requests) == 3
    assert_model_valid(agent.messages)


def test_model_error_propagates_and_history_stays_valid() -> None:
    model = ScriptedModel([tool_call("t1", "add", a=1, b=2), ModelError("provider down")])
    agent = Agent(model=model, tools=[add])
    with pytest.raises(ModelError, match="provider down"):
        agent("go")
    assert_model_valid(agent.messages)
    assert agent.messages[-1]["content"][0]["toolResult"]["toolUseId"] == "t1"


def test_scripted_model_running_out_names_itself() -> None:
    agent = Agent(model=ScriptedModel(["only one"]))
    agent("one")
    with pytest.raises(ModelError, match="ScriptedModel"):
        agent("two")


def test_max_tokens_with_partial_tool_call_closes_it() -> None:
    message = tool_call("t1", "add", a=1, b=2)
    model = ScriptedModel([ModelResponse(message=message, stop_reason="max_tokens")])
    agent = Agent(model=model, tools=[add])
    result = agent("go")
    assert result.stop_reason == "max_tokens"
    assert_model_valid(agent.messages)


async def test_second_invocation_while_running_raises_turn_running() -> None:
    model = ScriptedModel(["slow answer", "other"], delay=0.05)
    agent = Agent(model=model)
    first = asyncio.create_task(agent.invoke_async("one"))
    await asyncio.sleep(0.02)
    assert agent.turn_running
    with pytest.raises(TurnRunningError) as info:
        await agent.invoke_async("two")
    assert info.value.code == "turn_running"
    result = await first
    assert str(result) == "slow answer"
    assert [m["content"][0]["text"] for m in agent.messages] == ["one", "slow answer"]
    assert not agent.turn_running


async def test_sync_call_inside_running_loop_runs_on_perdures_loop() -> None:
    # A notebook cell or a web handler: the call blocks this thread only (SPEC §7).
    agent = Agent(model=ScriptedModel(["x"]))
    assert str(agent("hi")) == "x"
    assert [m["content"][0]["text"] for m in agent.messages] == ["hi", "x"]


def test_sync_call_on_perdures_own_loop_thread_names_async_twin() -> None:
    # From a tool of a running agent the sync call would wait for itself.
    inner = Agent(model=ScriptedModel(["never"]))
    errors: list[str] = []

    @tool
    async def nested() -> str:
        """Call another agent synchronously (an async tool runs on perdure's loop)."""
        try:
            inner("hi")
        except RuntimeError as exc:
            errors.append(str(exc))
        return "done"

    outer = Agent(model=ScriptedModel([tool_call("n1", "nested"), "ok"]), tools=[nested])
    assert str(outer("go")) == "ok"
    assert len(errors) == 1
    assert "invoke_async" in errors[0]
    assert inner.messages == []


def test_sync_call_from_a_sync_tool_works() -> None:
    # A sync tool runs in a worker thread, which runs no loop: nothing to refuse.
    inner = Agent(model=ScriptedModel(["inner answer"]))

    @tool
    def nested() -> str:
        """Call another agent synchronously."""
        return str(inner("hi"))

    outer = Agent(model=ScriptedModel([tool_call("n1", "nested"), "ok"]), tools=[nested])
    assert str(outer("go")) == "ok"
    assert [m["content"][0]["text"] for m in inner.messages] == ["hi", "inner answer"]


def test_sync_calls_share_one_long_lived_loop() -> None:
    loops: list[int] = []
    threads: list[int] = []

    @tool
    async def where() -> str:
        """Report the loop."""
        loops.append(id(asyncio.get_running_loop()))
        threads.append(threading.get_ident())
        return "here"

    agent = Agent(
        model=ScriptedModel([tool_call(f"t{i}", "where") if i % 2 == 0 else "ok" for i in range(6)])
    )
    agent.tool_registry.register(where)
    before = threading.active_count()
    for _ in range(3):
        agent("where?")
    other = Agent(model=ScriptedModel([tool_call("x", "where"), "ok"]), tools=[where])
    other("where?")
    assert len(set(loops)) == 1, "every sync call must run on the same event loop"
    assert len(set(threads)) == 1
    assert threading.active_count() <= before + 1


class HistoryWatchingModel:
    """Answers at once, noting the history object each call was handed and its length."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []  # (id of the list, its length at the call)

    async def stream(self, messages: Any, *, tool_specs: Any, system_prompt: Any) -> Any:
        self.seen.append((id(messages), len(messages)))
        yield ModelResponse(
            message={"role": "assistant", "content": [{"text": "ok"}]}, stop_reason="end_turn"
        )


async def test_a_model_call_is_handed_the_history_without_a_copy() -> None:
    # A copy of the history per model call made each turn cost time in proportion to
    # the conversation's length: 100k messages took 540 us a message against 21 at 1k.
    # The Model protocol forbids adapters to mutate what they are handed, so the loop
    # hands over the agent's own list.
    model = HistoryWatchingModel()
    history = [
        {"role": role, "content": [{"text": f"{role} {i}"}]}
        for i in range(500)
        for role in ("user", "assistant")
    ]
    agent = Agent(
        model=model,  # type: ignore[arg-type]
        messages=history,
        conversation_manager=NullConversationManager(),
    )
    await agent.invoke_async("one")
    await agent.invoke_async("two")
    assert model.seen == [(id(agent.messages), 1001), (id(agent.messages), 1003)]
    assert agent.messages[-1] == {"role": "assistant", "content": [{"text": "ok"}]}
