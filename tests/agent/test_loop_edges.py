"""Edges of the loop: context overflow recovery, abandoned streams, invocation payloads."""

from __future__ import annotations

import contextlib

import pytest

from helpers import assert_model_valid, tool_call
from perdure import Agent, SlidingWindowConversationManager, tool
from perdure.errors import ContextWindowOverflowError, ModelError, TurnRunningError
from perdure.hooks import BeforeInvocationEvent
from perdure.models import ScriptedModel
from perdure.types import Message


@tool
def ping() -> str:
    """Ping."""
    return "pong"


def history(turns: int) -> list[Message]:
    messages: list[Message] = []
    for i in range(turns):
        messages.append({"role": "user", "content": [{"text": f"q{i}"}]})
        messages.append({"role": "assistant", "content": [{"text": f"a{i}"}]})
    return messages


def test_context_overflow_reduces_the_context_and_retries() -> None:
    model = ScriptedModel([ContextWindowOverflowError("too long"), "fits now"])
    manager = SlidingWindowConversationManager(window_size=100)
    agent = Agent(model=model, messages=history(10), conversation_manager=manager)
    result = agent("and now?")
    assert str(result) == "fits now"
    assert len(model.requests) == 2
    assert len(model.requests[1]["messages"]) < len(model.requests[0]["messages"])
    assert manager.removed_message_count > 0
    assert_model_valid(agent.messages)


def test_context_overflow_that_cannot_be_reduced_propagates() -> None:
    model = ScriptedModel([ContextWindowOverflowError("too long")] * 20)
    agent = Agent(model=model)
    with pytest.raises(ContextWindowOverflowError):
        agent("hi")


async def test_abandoned_stream_releases_the_turn_when_closed() -> None:
    agent = Agent(model=ScriptedModel([tool_call("t1", "ping"), "done", "again"]), tools=[ping])
    async with contextlib.aclosing(agent.stream_async("go")) as stream:
        async for _event in stream:
            break
    assert not agent.turn_running
    result = await agent.invoke_async("next")
    assert result.stop_reason == "end_turn"
    assert_model_valid(agent.messages)


def test_before_invocation_event_carries_the_new_messages() -> None:
    seen: list[list[Message]] = []
    agent = Agent(model=ScriptedModel(["a"]))
    agent.hooks.add_callback(BeforeInvocationEvent, lambda e: seen.append(list(e.messages)))
    agent("hello")
    assert seen == [[{"role": "user", "content": [{"text": "hello"}]}]]


def test_turn_running_error_from_a_hook_inside_the_turn() -> None:
    errors: list[Exception] = []
    agent = Agent(model=ScriptedModel(["a"]))

    def reenter(event: BeforeInvocationEvent) -> None:
        try:
            agent.load_snapshot(agent.take_snapshot())
        except TurnRunningError as exc:
            errors.append(exc)

    agent.hooks.add_callback(BeforeInvocationEvent, reenter)
    agent("x")
    assert len(errors) == 1


def test_malformed_model_output_is_a_model_error() -> None:
    duplicate: Message = {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "same", "name": "ping", "input": {}}},
            {"toolUse": {"toolUseId": "same", "name": "ping", "input": {}}},
        ],
    }
    agent = Agent(model=ScriptedModel([duplicate]), tools=[ping])
    with pytest.raises(ModelError, match="reused a toolUseId"):
        agent("go")
    assert_model_valid(agent.messages)
