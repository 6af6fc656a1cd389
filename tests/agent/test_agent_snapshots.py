"""agent.take_snapshot / load_snapshot (SPEC §3.2)."""

from __future__ import annotations

import asyncio

import pytest

from helpers import tool_call
from perdure import Agent, SlidingWindowConversationManager, tool
from perdure.agent import Snapshot, SnapshotField
from perdure.errors import SnapshotError, TurnRunningError
from perdure.models import ScriptedModel

IMAGE = {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n\x00\xff"}}}


@tool
def note(text: str) -> str:
    """Note something.

    Args:
        text: the note.
    """
    return text


def busy_agent() -> Agent:
    agent = Agent(
        model=ScriptedModel([tool_call("t1", "note", text="x"), "done"]),
        tools=[note],
        system_prompt="sys",
        state={"step": "filtered", "ids": [1, 2]},
        conversation_manager=SlidingWindowConversationManager(window_size=10),
    )
    agent([{"text": "look"}, IMAGE])  # type: ignore[list-item]
    agent.model_state["cursor"] = "abc"
    return agent


def test_session_preset_takes_everything_but_the_system_prompt() -> None:
    snapshot = busy_agent().take_snapshot()
    assert set(snapshot.data) == {
        "messages",
        "state",
        "conversation_manager_state",
        "interrupt_state",
        "model_state",
    }
    assert snapshot.schema_version == "1.0"
    assert snapshot.scope == "agent"
    assert snapshot.created_at


def test_include_and_exclude() -> None:
    agent = busy_agent()
    snapshot = agent.take_snapshot(include=["system_prompt"], exclude=[SnapshotField.messages])
    assert "system_prompt" in snapshot.data
    assert "messages" not in snapshot.data
    only = agent.take_snapshot(preset=None, include=["state"])
    assert set(only.data) == {"state"}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"include": ["no_such_field"]}, "no_such_field"),
        ({"preset": "everything"}, "everything"),
        ({"preset": None}, "no snapshot fields"),
        ({"preset": None, "include": ["state"], "exclude": ["state"]}, "no snapshot fields"),
    ],
)
def test_snapshot_field_errors_name_the_problem(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(SnapshotError) as info:
        busy_agent().take_snapshot(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value).lower()
    assert info.value.code == "snapshot_error"


def test_snapshot_is_a_deep_copy() -> None:
    agent = busy_agent()
    snapshot = agent.take_snapshot()
    agent.messages[0]["content"][0]["text"] = "changed"
    agent.state.set("step", "changed")
    assert snapshot.data["messages"][0]["content"][0]["text"] == "look"
    assert snapshot.data["state"]["step"] == "filtered"


def test_round_trip_through_json_restores_a_new_agent() -> None:
    agent = busy_agent()
    saved = agent.take_snapshot(include=["system_prompt"], app_data={"run": 7}).to_json()
    fresh = Agent(model=ScriptedModel(["again"]), tools=[note])
    fresh.load_snapshot(Snapshot.from_json(saved))
    assert fresh.messages == agent.messages
    assert fresh.messages[0]["content"][1]["image"]["source"]["bytes"] == b"\x89PNG\r\n\x00\xff"
    assert fresh.state.get() == {"step": "filtered", "ids": [1, 2]}
    assert fresh.system_prompt == "sys"
    assert fresh.model_state == {"cursor": "abc"}
    assert Snapshot.from_json(saved).app_data == {"run": 7}
    assert str(fresh("more")) == "again"


def test_load_restores_only_fields_present() -> None:
    agent = busy_agent()
    only_state = agent.take_snapshot(preset=None, include=["state"])
    other = Agent(
        model=ScriptedModel([]), messages=[{"role": "user", "content": [{"text": "keep"}]}]
    )
    other.load_snapshot(only_state)
    assert other.messages == [{"role": "user", "content": [{"text": "keep"}]}]
    assert other.state.get("step") == "filtered"


def test_conversation_manager_state_round_trips() -> None:
    manager = SlidingWindowConversationManager(window_size=2)
    agent = Agent(model=ScriptedModel(["a", "b"]), conversation_manager=manager)
    agent("one")
    agent("two")
    assert manager.removed_message_count == 2
    fresh_manager = SlidingWindowConversationManager(window_size=2)
    fresh = Agent(model=ScriptedModel([]), conversation_manager=fresh_manager)
    fresh.load_snapshot(agent.take_snapshot())
    assert fresh_manager.removed_message_count == 2


def test_invalid_snapshot_is_refused_before_anything_changes() -> None:
    agent = busy_agent()
    good = agent.take_snapshot()
    target = Agent(model=ScriptedModel([]))
    wrong_version = Snapshot.from_dict({**good.to_dict(), "schema_version": "2.0"})
    with pytest.raises(SnapshotError, match=r"2\.0"):
        target.load_snapshot(wrong_version)
    bad_field = Snapshot.from_dict(
        {**good.to_dict(), "data": {**good.to_dict()["data"], "bogus": 1}}
    )
    with pytest.raises(SnapshotError, match="bogus"):
        target.load_snapshot(bad_field)
    assert target.messages == []


async def test_load_snapshot_during_a_running_turn_raises() -> None:
    agent = Agent(model=ScriptedModel(["slowly streamed words here"], delay=0.05))
    snapshot = Agent(model=ScriptedModel([]), state={"k": 1}).take_snapshot()
    task = asyncio.create_task(agent.invoke_async("go"))
    await asyncio.sleep(0.02)
    with pytest.raises(TurnRunningError):
        agent.load_snapshot(snapshot)
    await task
    assert [m["content"][0]["text"] for m in agent.messages] == ["go", "slowly streamed words here"]
