"""BidiAgent: messages, tools mid-stream, connection restarts, and seed 003's save points."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from perdure import Agent, MemoryStorage, NullConversationManager, tool
from perdure.agent.conversation.pairing import INTERRUPTED_TOOL_RESULT_TEXT
from perdure.bidi import BidiAgent, BidiEvent, ScriptedBidiModel
from perdure.models import ScriptedModel
from perdure.session import SnapshotSessionManager


@tool
def weather(city: str) -> str:
    """Today's weather.

    Args:
        city: where.
    """
    if city == "Atlantis":
        raise LookupError("no such city")
    return f"sunny in {city}"


def tool_use(city: str, uid: str = "t1") -> BidiEvent:
    return {
        "type": "tool_use",
        "toolUse": {"toolUseId": uid, "name": "weather", "input": {"city": city}},
    }


async def until(agent: BidiAgent, *kinds: str) -> list[BidiEvent]:
    events = []
    async for event in agent.receive():
        events.append(event)
        if event["type"] in kinds:
            break
    return events


async def stored(storage: MemoryStorage, agent_id: str = "voice") -> list[str]:
    """The texts of the stored snapshot_latest, read as a plain agent would."""
    reader = Agent(
        ScriptedModel([]), agent_id=agent_id, conversation_manager=NullConversationManager()
    )
    await SnapshotSessionManager("s", storage=storage).restore_snapshot(reader)
    return [
        block.get("text") or next(iter(block))
        for message in reader.messages
        for block in message["content"]
    ]


def manager(storage: MemoryStorage, strategy: str = "message", **kw: Any) -> SnapshotSessionManager:
    return SnapshotSessionManager(
        "s",
        storage=storage,
        bidi_agent_save_latest_on=strategy,  # type: ignore[arg-type]
        **kw,
    )


async def test_messages_enter_the_history_and_are_saved_one_by_one() -> None:
    storage = MemoryStorage()
    model = ScriptedBidiModel(
        [["hello!"], [{"type": "transcript", "role": "user", "text": "(heard) bye"}, "bye!"]]
    )
    agent = BidiAgent(model, agent_id="voice", session_manager=manager(storage))
    await agent.start()
    await agent.send("hi")
    assert await stored(storage) == ["hi"]  # saved before the model answered
    events = await until(agent, "response_complete")
    assert [e["type"] for e in events] == ["transcript", "response_complete"]
    assert await stored(storage) == ["hi", "hello!"]
    await agent.send("thanks")
    await until(agent, "response_complete")
    assert [m["role"] for m in agent.messages] == ["user", "assistant", "user", "user", "assistant"]
    assert await stored(storage) == ["hi", "hello!", "thanks", "(heard) bye", "bye!"]
    assert model.sent == [{"type": "text", "text": "hi"}, {"type": "text", "text": "thanks"}]
    await agent.stop()
    assert model.stops == 1


async def test_a_tool_runs_mid_stream_and_its_result_goes_back_over_the_connection() -> None:
    model = ScriptedBidiModel(
        [[tool_use("Oslo")], ["It is sunny."], [tool_use("Atlantis", "t2")], ["Sorry."]]
    )
    agent = BidiAgent(model, tools=[weather], agent_id="voice")
    await agent.start()
    assert model.starts[0]["tool_specs"][0]["name"] == "weather"
    await agent.send("weather in Oslo?")
    events = await until(agent, "response_complete")
    assert [e["type"] for e in events] == [
        "tool_use",
        "tool_result",
        "transcript",
        "response_complete",
    ]
    assert model.sent[1] == {
        "type": "tool_result",
        "toolResult": {
            "toolUseId": "t1",
            "status": "success",
            "content": [{"text": "sunny in Oslo"}],
        },
    }
    assert agent.messages[1]["content"][0]["toolUse"]["toolUseId"] == "t1"
    assert agent.messages[2]["content"][0]["toolResult"]["toolUseId"] == "t1"
    await agent.send("and Atlantis?")
    events = await until(agent, "response_complete")
    failed = events[1]["toolResult"]
    assert failed["status"] == "error"
    assert "no such city" in failed["content"][0]["text"]
    await agent.stop()


async def test_a_connection_never_opens_on_a_call_without_its_result() -> None:
    # The stream is cancelled while a tool runs: the call is in the history, its
    # result is not. The next connection (a restart here) opens with it closed.
    started, storage = asyncio.Event(), MemoryStorage()

    @tool
    async def slow(city: str) -> str:
        """Slow weather.

        Args:
            city: where.
        """
        started.set()
        await asyncio.sleep(60)
        return "late"

    call = {"toolUseId": "t9", "name": "slow", "input": {"city": "Oslo"}}
    model = ScriptedBidiModel([[{"type": "tool_use", "toolUse": call}]])
    agent = BidiAgent(model, tools=[slow], agent_id="voice", session_manager=manager(storage))
    await agent.start()
    await agent.send("weather?")
    reading = asyncio.create_task(until(agent, "response_complete"))
    await started.wait()
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert "toolUse" in agent.messages[-1]["content"][0]
    await agent.restart()
    closing = {
        "toolUseId": "t9",
        "status": "error",
        "content": [{"text": INTERRUPTED_TOOL_RESULT_TEXT}],
    }
    assert model.starts[-1]["messages"][-1] == {
        "role": "user",
        "content": [{"toolResult": closing}],
    }
    assert agent.messages == model.starts[-1]["messages"]
    assert await stored(storage) == ["weather?", "toolUse", "toolResult"]
    await agent.stop()
    # A history given with a call left open before other messages is repaired too.
    given = BidiAgent(
        ScriptedBidiModel(),
        messages=[
            {"role": "user", "content": [{"text": "hi"}]},
            {"role": "assistant", "content": [{"toolUse": call}]},
            {"role": "assistant", "content": [{"text": "moving on"}]},
        ],
    )
    await given.start()
    assert [next(iter(m["content"][0])) for m in given.messages] == [
        "text",
        "toolUse",
        "toolResult",
        "text",
    ]
    await given.stop()


@pytest.mark.parametrize("strategy", ["message", "stop", "trigger"])
async def test_saves_happen_at_the_seeds_points(strategy: str) -> None:
    storage = MemoryStorage()
    asked: list[int] = []

    def trigger(*, agent_data: Any) -> bool:
        assert isinstance(agent_data, BidiAgent)
        asked.append(len(agent_data.messages))
        return True

    model = ScriptedBidiModel([["one", {"type": "restart_required"}], ["two"]])
    sm = manager(storage, strategy, snapshot_trigger=trigger)
    agent = BidiAgent(model, agent_id="voice", session_manager=sm)
    await agent.start()
    await agent.send("go")
    assert await stored(storage) == (["go"] if strategy == "message" else [])
    events = await until(agent, "restart_required")
    assert events[-1]["type"] == "restart_required"
    # Before the restart: latest saved (every strategy here: trigger says True), the
    # trigger asked, an immutable snapshot appended; then the connection reopened
    # with the history.
    assert await stored(storage) == ["go", "one"]
    assert asked == [2]
    assert len(model.starts) == 2
    assert model.starts[1]["messages"] == agent.messages
    assert len(await sm.list_snapshot_ids(agent)) == 1
    await agent.send("again")
    await until(agent, "response_complete")
    await agent.stop()
    assert asked == [2, 4]
    assert await stored(storage) == ["go", "one", "again", "two"]
    assert len(await sm.list_snapshot_ids(agent)) == 2


async def test_trigger_strategy_saves_nothing_unless_the_trigger_fires() -> None:
    storage = MemoryStorage()
    sm = manager(storage, "trigger", snapshot_trigger=lambda *, agent_data: False)
    agent = BidiAgent(ScriptedBidiModel([["hey"]]), agent_id="voice", session_manager=sm)
    await agent.start()
    await agent.send("hi")
    await until(agent, "response_complete")
    await agent.stop()
    assert await stored(storage) == []


async def test_restored_before_start_and_never_while_started() -> None:
    storage = MemoryStorage()
    first = BidiAgent(
        ScriptedBidiModel([["hello"]]), agent_id="voice", session_manager=manager(storage)
    )
    await first.start()
    await first.send("hi")
    await until(first, "response_complete")
    await first.stop()

    model = ScriptedBidiModel()
    again = BidiAgent(model, agent_id="voice", session_manager=manager(storage))
    assert again.messages == []  # nothing is read before start
    await again.start()
    assert again.messages == first.messages
    assert model.starts[0]["messages"] == first.messages  # the model starts from it
    with pytest.raises(RuntimeError, match="while it is started"):
        await again.session_manager.restore_snapshot(again)  # type: ignore[union-attr]
    await again.stop()
    assert await again.session_manager.restore_snapshot(again) is True  # type: ignore[union-attr]


async def test_misuse_is_refused() -> None:
    with pytest.raises(TypeError, match="BidiModel"):
        BidiAgent(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SnapshotSessionManager"):
        BidiAgent(ScriptedBidiModel(), session_manager=object())  # type: ignore[arg-type]
    agent = BidiAgent(ScriptedBidiModel())
    with pytest.raises(RuntimeError, match="send before start"):
        await agent.send("hi")
    await agent.start()
    with pytest.raises(RuntimeError, match="started already"):
        await agent.start()
    with pytest.raises(TypeError, match="text must be a str"):
        await agent.send(3)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="ran out of responses"):
        await agent.send("hi")
    await agent.stop()
    await agent.stop()  # idempotent


@pytest.mark.parametrize(
    ("event", "named"),
    [
        ({"type": "transcript", "role": "system", "text": "x"}, "a transcript event needs"),
        ({"type": "transcript", "role": "assistant"}, "a transcript event needs"),
        ({"type": "tool_use"}, "a tool_use event needs"),
        ({"type": "tool_use", "toolUse": {"name": "weather"}}, "a tool_use event needs"),
    ],
)
async def test_a_malformed_event_from_the_model_is_refused_and_nothing_enters_the_history(
    event: BidiEvent, named: str
) -> None:
    agent = BidiAgent(ScriptedBidiModel([[event]]), tools=[weather], agent_id="voice")
    await agent.start()
    await agent.send("hi")
    with pytest.raises(ValueError, match=named):
        await until(agent, "response_complete")
    assert [m["content"][0] for m in agent.messages] == [{"text": "hi"}]
    await agent.stop()


class _Says:
    """A BidiModel whose connection yields ``events`` as they are, whatever they are."""

    def __init__(self, *events: Any) -> None:
        self.events = events

    async def start(self, **kwargs: Any) -> None:
        pass

    async def send(self, event: Any) -> None:
        pass

    async def receive(self) -> Any:
        for event in self.events:
            yield event

    async def stop(self) -> None:
        pass


@pytest.mark.parametrize("event", ["hello", 5, None, ["transcript"]])
async def test_an_event_that_is_no_dict_is_refused_by_name(event: Any) -> None:
    agent = BidiAgent(_Says(event), agent_id="voice")
    await agent.start()
    await agent.send("hi")
    with pytest.raises(ValueError, match=r"receive\(\) yielded .* not an event dict"):
        await until(agent, "response_complete")
    assert [m["content"][0] for m in agent.messages] == [{"text": "hi"}]
    await agent.stop()


def test_a_script_that_holds_no_events_is_refused_when_it_is_made() -> None:
    with pytest.raises(TypeError, match=r"responses\[0\]\[1\] must be a text or an event"):
        ScriptedBidiModel([["ok", 5]])
    with pytest.raises(TypeError, match=r"responses\[1\]\[0\] must be .* 'type'"):
        ScriptedBidiModel([["ok"], [{"text": "no type"}]])
    with pytest.raises(TypeError, match=r"responses\[0\] must be a list of events, got str"):
        ScriptedBidiModel(["ok"])
    with pytest.raises(TypeError, match="responses must be a list of responses"):
        ScriptedBidiModel("ok")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"greeting\[0\] must be"):
        ScriptedBidiModel(greeting=[3])  # type: ignore[list-item]


async def test_text_deltas_are_passed_on_and_neither_kept_nor_saved() -> None:
    storage = MemoryStorage()
    saves: list[int] = []

    class Counting(SnapshotSessionManager):
        async def save_snapshot(self, agent: Any, *, is_latest: bool) -> str | None:
            saves.append(len(agent.messages))
            return await super().save_snapshot(agent, is_latest=is_latest)

    model = ScriptedBidiModel([["Sunny in  Oslo today."]], text_deltas=True)
    agent = BidiAgent(model, agent_id="voice", session_manager=Counting("s", storage=storage))
    await agent.start()
    await agent.send("weather?")
    events = await until(agent, "response_complete")
    await agent.stop()
    deltas = [e for e in events if e["type"] == "text_delta"]
    assert [e["text"] for e in deltas] == ["Sunny ", "in  ", "Oslo ", "today."]
    assert {e["role"] for e in deltas} == {"assistant"}
    assert [e["type"] for e in events[len(deltas) :]] == ["transcript", "response_complete"]
    assert [m["content"][0]["text"] for m in agent.messages] == [
        "weather?",
        "Sunny in  Oslo today.",
    ]
    assert await stored(storage) == ["weather?", "Sunny in  Oslo today."]
    assert saves == [1, 2, 2]  # each message, then on stop: never at a delta
    # Off by default: the script's events, exactly.
    plain = ScriptedBidiModel([["Sunny in Oslo."]])
    quiet = BidiAgent(plain)
    await quiet.start()
    await quiet.send("weather?")
    assert [e["type"] for e in await until(quiet, "response_complete")] == [
        "transcript",
        "response_complete",
    ]
    await quiet.stop()


async def test_speech_is_passed_to_the_model_and_kept_out_of_the_history() -> None:
    model = ScriptedBidiModel([["heard you"]])
    agent = BidiAgent(model)
    with pytest.raises(RuntimeError, match="send_audio before start"):
        await agent.send_audio(b"x")
    await agent.start()
    with pytest.raises(TypeError, match="chunk must be bytes"):
        await agent.send_audio("not bytes")  # type: ignore[arg-type]
    await agent.send_audio(bytearray(b"\x01\x02"))
    await agent.send("over")
    await until(agent, "response_complete")
    await agent.stop()
    assert model.sent == [{"type": "audio", "audio": b"\x01\x02"}, {"type": "text", "text": "over"}]
    assert [m["content"][0]["text"] for m in agent.messages] == ["over", "heard you"]
