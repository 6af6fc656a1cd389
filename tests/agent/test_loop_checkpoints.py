"""Loop checkpoints (SPEC §3.1): where the loop pauses and how it resumes."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import assert_model_valid, tool_call
from perdure import Agent, tool
from perdure.agent import CHECKPOINT_SCHEMA_VERSION, Checkpoint, CheckpointEvent
from perdure.errors import CheckpointError
from perdure.models import ScriptedModel

RUNS: list[str] = []


@tool
def step(name: str) -> str:
    """Record that a step ran.

    Args:
        name: the step.
    """
    RUNS.append(name)
    return f"ran {name}"


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RUNS.clear()


def resume(ckpt: Checkpoint) -> list[Any]:
    return [{"checkpointResume": {"checkpoint": ckpt.to_dict()}}]


def two_tool_script() -> ScriptedModel:
    return ScriptedModel(
        [tool_call("t1", "step", name="a"), tool_call("t2", "step", name="b"), "all done"]
    )


def test_checkpoints_pause_after_model_and_after_tools_in_every_tool_cycle() -> None:
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    seen: list[tuple[str, int]] = []
    result = agent("go")
    while result.stop_reason == "checkpoint":
        assert result.checkpoint is not None
        seen.append((result.checkpoint.position, result.checkpoint.cycle_index))
        if result.checkpoint.position == "after_model":
            assert ["a", "b"][: result.checkpoint.cycle_index] == RUNS  # tools not run yet
            assert_model_valid(agent.messages, allow_pending_last=True)
        else:
            assert_model_valid(agent.messages)
        result = agent(resume(result.checkpoint))
    assert seen == [("after_model", 0), ("after_tools", 0), ("after_model", 1), ("after_tools", 1)]
    assert result.stop_reason == "end_turn"
    assert str(result) == "all done"
    assert RUNS == ["a", "b"]  # each tool exactly once
    assert_model_valid(agent.messages)


def test_no_checkpoint_in_a_cycle_without_tools() -> None:
    agent = Agent(model=ScriptedModel(["plain answer"]), checkpointing=True)
    result = agent("hi")
    assert result.stop_reason == "end_turn"
    assert result.checkpoint is None


def test_resume_adds_no_message_and_after_model_is_not_emitted_again() -> None:
    model = two_tool_script()
    agent = Agent(model=model, tools=[step], checkpointing=True)
    first = agent("go")
    assert first.checkpoint == Checkpoint(position="after_model", cycle_index=0)
    count = len(agent.messages)
    requests = len(model.requests)
    second = agent(resume(first.checkpoint))
    # resumed after_model: ran the pending tool, did not call the model, paused after tools
    assert second.checkpoint == Checkpoint(position="after_tools", cycle_index=0)
    assert len(model.requests) == requests
    assert len(agent.messages) == count + 1  # only the tool results, no prompt message
    third = agent(resume(second.checkpoint))
    assert third.checkpoint == Checkpoint(position="after_model", cycle_index=1)


async def test_checkpoint_event_is_streamed() -> None:
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    events = [e async for e in agent.stream_async("go")]
    checkpoints = [e for e in events if isinstance(e, CheckpointEvent)]
    assert [c.checkpoint.position for c in checkpoints] == ["after_model"]


def test_resume_on_a_new_agent_does_not_rerun_tools() -> None:
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    paused = agent("go")
    paused = agent(resume(paused.checkpoint))  # type: ignore[arg-type]
    assert paused.checkpoint == Checkpoint("after_tools", 0)
    wire = paused.checkpoint.to_dict()
    # a "new process": fresh agent, the same history, the checkpoint as plain JSON data
    model = ScriptedModel([tool_call("t2", "step", name="b"), "finished"])
    fresh = Agent(model=model, tools=[step], messages=agent.messages, checkpointing=True)
    nxt = fresh([{"checkpointResume": {"checkpoint": wire}}])
    assert nxt.checkpoint == Checkpoint("after_model", 1)
    assert RUNS == ["a"]


def test_after_model_resume_when_results_were_already_recorded_skips_the_tools() -> None:
    # A process paused after_model, ran the tools, persisted the results and died
    # before it could report after_tools: resuming the after_model checkpoint must
    # not run the tools again.
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    first = agent("go")
    agent(resume(first.checkpoint))  # type: ignore[arg-type]
    assert RUNS == ["a"]
    model = ScriptedModel(["finished"])
    fresh = Agent(model=model, messages=agent.messages, tools=[step], checkpointing=True)
    result = fresh(resume(first.checkpoint))  # type: ignore[arg-type]
    assert result.stop_reason == "end_turn"
    assert RUNS == ["a"]


def test_resume_block_requires_checkpointing() -> None:
    agent = Agent(model=two_tool_script(), tools=[step])
    with pytest.raises(ValueError, match="checkpointing=False"):
        agent(resume(Checkpoint("after_model", 0)))


def test_resume_block_without_checkpoint_key_is_a_key_error() -> None:
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    agent("go")
    with pytest.raises(KeyError):
        agent([{"checkpointResume": {}}])


@pytest.mark.parametrize(
    "bad",
    [
        {"position": "after_model", "cycle_index": 0, "schema_version": "0.9"},
        {"position": "somewhere", "cycle_index": 0, "schema_version": CHECKPOINT_SCHEMA_VERSION},
        {"position": "after_model", "cycle_index": -1, "schema_version": CHECKPOINT_SCHEMA_VERSION},
        {"position": "after_model", "schema_version": CHECKPOINT_SCHEMA_VERSION},
        "not a dict",
    ],
)
def test_wrong_checkpoint_dict_is_a_checkpoint_error(bad: Any) -> None:
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    agent("go")
    with pytest.raises(CheckpointError) as info:
        agent([{"checkpointResume": {"checkpoint": bad}}])
    assert info.value.code == "checkpoint_error"
    assert RUNS == []


def test_checkpoint_that_does_not_fit_the_history_is_refused() -> None:
    agent = Agent(model=ScriptedModel(["hi"]), tools=[step], checkpointing=True)
    agent("hello")
    with pytest.raises(CheckpointError, match="does not match"):
        agent(resume(Checkpoint("after_tools", 0)))
    with pytest.raises(CheckpointError, match="does not match"):
        agent(resume(Checkpoint("after_model", 0)))


def test_resume_block_must_be_alone() -> None:
    agent = Agent(model=two_tool_script(), tools=[step], checkpointing=True)
    first = agent("go")
    with pytest.raises(ValueError, match="only block"):
        agent([*resume(first.checkpoint), {"text": "and more"}])  # type: ignore[arg-type]


def test_a_new_prompt_over_a_pending_checkpoint_closes_the_calls() -> None:
    model = ScriptedModel([tool_call("t1", "step", name="a"), "fine"])
    agent = Agent(model=model, tools=[step], checkpointing=True)
    first = agent("go")
    assert first.checkpoint == Checkpoint("after_model", 0)
    result = agent("never mind, just answer")
    assert str(result) == "fine"
    assert RUNS == []
    closing = agent.messages[2]
    assert closing["role"] == "user"
    assert closing["content"][0]["toolResult"]["status"] == "error"
    assert closing["content"][-1] == {"text": "never mind, just answer"}
    assert_model_valid(agent.messages)
