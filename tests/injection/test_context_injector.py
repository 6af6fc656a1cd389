"""ContextInjector on a real agent: what the model sees, and what is never stored."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, Snapshot, tool
from perdure.injection import ContextInjector, InjectionContext
from perdure.models import ScriptedModel
from perdure.types import Message

MARK = "<now>INJECTED-7f3a</now>"


@tool
def lookup(city: str) -> str:
    """Look up the weather.

    Args:
        city: the city.
    """
    return f"sunny in {city}"


def call_lookup(tool_use_id: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"text": "Checking."},
            {"toolUse": {"toolUseId": tool_use_id, "name": "lookup", "input": {"city": "Oslo"}}},
        ],
    }


def last_user(request: dict[str, Any]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = request["messages"][-1]["content"]
    return content


def mentions(obj: Any, text: str = "INJECTED-7f3a") -> bool:
    return text in json.dumps(obj, default=str)


def test_text_reaches_the_request_prepended_and_never_the_history() -> None:
    model = ScriptedModel(["one", "two", "three"])
    agent = Agent(model=model, plugins=[ContextInjector(lambda ctx: MARK)])
    for prompt in ("first", "second", "third"):
        agent(prompt)
    assert [last_user(r) for r in model.requests] == [
        [{"text": MARK}, {"text": "first"}],
        [{"text": MARK}, {"text": "second"}],
        [{"text": MARK}, {"text": "third"}],
    ]
    # Earlier turns are sent as stored: the old injections are gone from them.
    assert not mentions(model.requests[2]["messages"][:-1])
    assert [m["content"] for m in agent.messages] == [
        [{"text": "first"}],
        [{"text": "one"}],
        [{"text": "second"}],
        [{"text": "two"}],
        [{"text": "third"}],
        [{"text": "three"}],
    ]
    saved = agent.take_snapshot().to_json()
    assert not mentions(saved)
    restored = Agent(model=ScriptedModel([]))
    restored.load_snapshot(Snapshot.from_json(saved))
    assert restored.messages == agent.messages


def test_nothing_injected_reaches_a_session_store_on_disk(tmp_path: Path) -> None:
    session_module = pytest.importorskip("perdure.session")
    store = session_module.FileSessionStore(tmp_path / "sessions")
    session = session_module.Session(store)
    model = ScriptedModel([call_lookup("t1"), "Sunny.", "Bye."])
    agent = Agent(
        model=model,
        tools=[lookup],
        session_manager=session,
        plugins=[ContextInjector(lambda ctx: MARK, trigger="every_turn")],
    )
    agent("weather?")
    agent("thanks")
    assert sum(mentions(r["messages"]) for r in model.requests) == 3
    files = [p for p in (tmp_path / "sessions").rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert b"INJECTED-7f3a" not in path.read_bytes(), path
    assert not mentions(agent.messages)


def test_user_turn_trigger_skips_tool_turns_every_turn_appends_after_results() -> None:
    model = ScriptedModel([call_lookup("t1"), "Sunny."])
    agent = Agent(model=model, tools=[lookup], plugins=[ContextInjector(lambda ctx: MARK)])
    agent("weather?")
    assert last_user(model.requests[0])[0] == {"text": MARK}
    assert not mentions(model.requests[1]["messages"])  # a tool-result turn

    model = ScriptedModel([call_lookup("t1"), "Sunny."])
    agent = Agent(
        model=model,
        tools=[lookup],
        plugins=[ContextInjector(lambda ctx: MARK, trigger="every_turn")],
    )
    agent("weather?")
    results_turn = last_user(model.requests[1])
    assert "toolResult" in results_turn[0]
    assert results_turn[-1] == {"text": MARK}
    assert not mentions(agent.messages)


def test_predicate_sees_messages_state_and_agent() -> None:
    seen: list[InjectionContext] = []

    def only_for_vips(ctx: InjectionContext) -> bool:
        seen.append(ctx)
        return bool(ctx.state.get("vip"))

    model = ScriptedModel(["a", "b"])
    agent = Agent(model=model, plugins=[ContextInjector(lambda ctx: MARK, trigger=only_for_vips)])
    agent("hello")
    agent.state.set("vip", True)
    agent("again")
    assert not mentions(model.requests[0]["messages"])
    assert mentions(model.requests[1]["messages"])
    assert seen[0].agent is agent
    assert seen[0].state is agent.state
    assert seen[0].messages[-1]["content"] == [{"text": "hello"}]
    # The context holds a copy: changing it changes nothing stored.
    seen[0].messages.clear()
    assert len(agent.messages) == 4


def test_render_gets_a_copy_it_may_scribble_on() -> None:
    def vandal(ctx: InjectionContext) -> str:
        ctx.messages[-1]["content"].append({"text": "vandalised"})
        return MARK

    model = ScriptedModel(["ok"])
    agent = Agent(model=model, plugins=[ContextInjector(vandal)])
    before = copy.deepcopy(agent.messages)
    agent("hi")
    assert before == []
    assert agent.messages[0]["content"] == [{"text": "hi"}]


async def test_async_render_is_awaited() -> None:
    async def render(ctx: InjectionContext) -> str:
        await asyncio.sleep(0)
        return MARK

    model = ScriptedModel(["ok"])
    agent = Agent(model=model, plugins=[ContextInjector(render)])
    await agent.invoke_async("hi")
    assert last_user(model.requests[0])[0] == {"text": MARK}


def _boom(ctx: InjectionContext) -> str:
    raise RuntimeError("render exploded")


@pytest.mark.parametrize(
    ("render", "trigger", "warning"),
    [
        (_boom, "user_turn", "render callback raised"),
        (lambda ctx: None, "user_turn", "returned None"),
        (lambda ctx: "", "user_turn", "returned ''"),
        (lambda ctx: 42, "user_turn", "not a str"),
        (lambda ctx: MARK, lambda ctx: 1 / 0, "trigger"),
    ],
    ids=["render-raises", "render-None", "render-empty", "render-not-str", "predicate-raises"],
)
def test_fail_open(
    render: Any, trigger: Any, warning: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(["still answered"])
    agent = Agent(model=model, plugins=[ContextInjector(render, trigger=trigger)])
    with caplog.at_level(logging.WARNING, logger="perdure"):
        result = agent("hi")
    assert str(result) == "still answered"
    assert last_user(model.requests[0]) == [{"text": "hi"}]
    records = [r for r in caplog.records if r.name.startswith("perdure")]
    assert records
    assert all(r.levelno == logging.WARNING for r in records)
    assert warning in " ".join(r.getMessage() for r in records)


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="render"):
        ContextInjector("not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trigger"):
        ContextInjector(lambda ctx: "x", trigger="userTurn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trigger"):
        ContextInjector(lambda ctx: "x", trigger=3)  # type: ignore[arg-type]
    injector = ContextInjector(lambda ctx: "x")
    assert injector.name == "perdure:context-injector"
    assert injector.trigger == "user_turn"
