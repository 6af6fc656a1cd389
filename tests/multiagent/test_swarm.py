"""Swarm: hand-offs end a turn at once, share context, are limited, and are saved."""

from __future__ import annotations

from typing import Any

import pytest

from perdure import Agent, MemoryStorage
from perdure.models import ScriptedModel
from perdure.multiagent import Swarm
from perdure.session import SnapshotSessionManager
from perdure.types import Message


def handoff(to: Any, message: Any = "go on", context: Any = None, uid: str = "h1") -> Message:
    given: dict[str, Any] = {"agent": to, "message": message}
    if context is not None:
        given["context"] = context
    return {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": uid, "name": "handoff", "input": given}}],
    }


def agent(name: str, *responses: Any) -> Agent:
    return Agent(ScriptedModel(list(responses)), name=name, agent_id=name)


async def test_a_handoff_ends_the_turn_at_once_and_the_next_agent_answers() -> None:
    a = agent("a", handoff("b", "check the numbers", {"year": 2026}))
    b = agent("b", "checked")
    result = await Swarm([a, b]).invoke_async("task")
    assert result.status == "completed"
    assert result.node_history == ["a", "b"]
    assert result.results == {"a": "", "b": "checked"}
    assert result.context == {"year": 2026}
    assert result.handoffs == [{"from": "a", "to": "b", "message": "check the numbers"}]
    assert isinstance(a.model, ScriptedModel)
    assert len(a.model.requests) == 1
    assert a.messages[-1]["content"][0]["toolResult"]["status"] == "success"
    assert isinstance(b.model, ScriptedModel)
    prompt = b.model.requests[0]["messages"][-1]["content"][0]["text"]
    assert "a handed this task to you (b): check the numbers" in prompt
    assert '"year": 2026' in prompt
    assert "handoff" in [spec["name"] for spec in b.model.requests[0]["tool_specs"]]


async def test_a_bad_handoff_is_a_tool_error_the_agent_sees_and_the_turn_goes_on() -> None:
    a = agent("a", handoff("nobody"), handoff("a", uid="h2"), "I will do it myself")
    b = agent("b")
    result = await Swarm([a, b]).invoke_async("task")
    assert result.node_history == ["a"]
    assert str(result) == "I will do it myself"
    errors = [
        block["toolResult"]["content"][0]["text"]
        for m in a.messages
        for block in m["content"]
        if "toolResult" in block
    ]
    assert errors[0].startswith("unknown agent 'nobody'")
    assert errors[1].startswith("unknown agent 'a'")  # not to itself


async def test_past_max_handoffs_the_run_fails() -> None:
    a = agent("a", handoff("b"), handoff("b", uid="h2"))
    b = agent("b", handoff("a"))
    result = await Swarm([a, b], max_handoffs=2).invoke_async("task")
    assert result.status == "failed"
    assert result.node_history == ["a", "b", "a"]
    assert result.error is not None
    assert "max_handoffs (2)" in result.error


async def test_a_rebuilt_swarm_resumes_with_the_active_agent() -> None:
    storage = MemoryStorage()
    a = agent("a", handoff("b", "yours", {"k": "v"}))
    b = agent("b", RuntimeError("provider down"))
    first = await Swarm(
        [a, b], session_manager=SnapshotSessionManager("s", storage=storage)
    ).invoke_async("task")
    assert first.status == "failed"
    assert first.error is not None
    assert "agent 'b' failed" in first.error
    # A new process: new agents, b's model works now; a must not be asked again.
    a2 = agent("a")
    b2 = agent("b", "done by b")
    swarm = Swarm([a2, b2], session_manager=SnapshotSessionManager("s", storage=storage))
    second = await swarm.invoke_async("task")
    assert second.status == "completed"
    assert second.node_history == ["a", "b"]
    assert second.context == {"k": "v"}
    assert second.results["b"] == "done by b"
    assert len(a2.messages) == 3  # a's turn, restored from the manager
    assert isinstance(a2.model, ScriptedModel)
    assert a2.model.requests == []


def test_bad_swarms_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="at least one agent"):
        Swarm([])
    with pytest.raises(ValueError, match="distinct names"):
        Swarm([agent("x"), agent("x")])
    with pytest.raises(ValueError, match="entry 'zz'"):
        Swarm([agent("x")], entry="zz")
    with pytest.raises(ValueError, match="max_handoffs"):
        Swarm([agent("x")], max_handoffs=-1)
    with pytest.raises(ValueError, match="swarm_id 'a/b' is invalid"):
        Swarm([agent("x")], swarm_id="a/b")
    with pytest.raises(TypeError, match="must be Agents"):
        Swarm(["x"])  # type: ignore[list-item]
    taken = agent("y")
    Swarm([taken])
    with pytest.raises(ValueError, match="already has a tool named 'handoff'"):
        Swarm([taken])
