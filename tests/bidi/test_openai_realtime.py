"""OpenAIRealtimeModel against a local server speaking the Realtime API's events.

The server (``tests/realtime_server.py``) is a real WebSocket server on loopback; the
adapter connects to it as it would to ``wss://api.openai.com/v1/realtime``.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perdure import tool
from perdure.bidi import BidiAgent, BidiEvent, OpenAIRealtimeModel
from perdure.errors import (
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelServerError,
)
from perdure.session import SnapshotSessionManager
from perdure.storage import LocalFileStorage
from realtime_server import DROP, EXPIRE, KEY, RealtimeServer, audio, call, realtime_server

calls: list[str] = []


@tool
def weather(city: str) -> str:
    """Today's weather.

    Args:
        city: where.
    """
    calls.append(city)
    return f"sunny in {city}"


def model(server: RealtimeServer, **kw: Any) -> OpenAIRealtimeModel:
    return OpenAIRealtimeModel(base_url=server.url, api_key=kw.pop("api_key", KEY), **kw)


async def until_complete(agent: BidiAgent) -> list[BidiEvent]:
    events: list[BidiEvent] = []
    async for event in agent.receive():
        events.append(event)
        if event["type"] == "response_complete":
            break
    return events


def texts(agent: BidiAgent) -> list[str]:
    out = []
    for message in agent.messages:
        block = message["content"][0]
        out.append(block.get("text") or next(iter(block)))
    return out


async def test_a_turn_with_a_tool_call_goes_over_the_wire_as_the_api_speaks() -> None:
    calls.clear()
    script = [[call("weather", "call_1", city="Oslo")], ["It is sunny in Oslo."]]
    async with realtime_server(script) as server:
        agent = BidiAgent(model(server), tools=[weather], system_prompt="Be brief.")
        await agent.start()
        await agent.send("weather in Oslo?")
        events = await until_complete(agent)
        await agent.stop()
    assert [e["type"] for e in events] == [
        "tool_use",
        "tool_result",
        "text_delta",  # the server streams the answer in two pieces
        "text_delta",
        "transcript",
        "response_complete",
    ]
    assert "".join(e["text"] for e in events if e["type"] == "text_delta") == (
        "It is sunny in Oslo."
    )
    assert calls == ["Oslo"]
    assert server.requests == [("/v1/realtime?model=gpt-realtime", f"Bearer {KEY}")]
    (update,) = server.events("session.update")
    assert update["session"]["type"] == "realtime"
    assert update["session"]["instructions"] == "Be brief."
    assert update["session"]["output_modalities"] == ["text"]
    (spec,) = update["session"]["tools"]
    assert spec["type"] == "function"
    assert spec["name"] == "weather"
    assert spec["parameters"]["properties"]["city"]["type"] == "string"
    items = [e["item"] for e in server.events("conversation.item.create")]
    assert items == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "weather in Oslo?"}],
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny in Oslo"},
    ]
    assert len(server.events("response.create")) == 2
    assert texts(agent) == ["weather in Oslo?", "toolUse", "toolResult", "It is sunny in Oslo."]
    assert agent.messages[1]["content"][0]["toolUse"] == {
        "toolUseId": "call_1",
        "name": "weather",
        "input": {"city": "Oslo"},
    }


async def test_calls_of_one_response_are_answered_by_one_response_create() -> None:
    calls.clear()
    script = [
        [call("weather", "c1", city="Oslo"), call("weather", "c2", city="Rome")],
        ["Sunny in both."],
    ]
    async with realtime_server(script) as server:
        agent = BidiAgent(model(server), tools=[weather])
        await agent.start()
        await agent.send("Oslo and Rome?")
        await until_complete(agent)
        await agent.stop()
    assert calls == ["Oslo", "Rome"]
    outputs = [e["item"]["call_id"] for e in server.events("conversation.item.create")[1:]]
    assert outputs == ["c1", "c2"]
    # One for the user's turn, one once both calls had their outputs: a second one
    # while a response is running is refused by the API.
    kinds = [e["type"] for e in server.connections[0]]
    assert kinds.count("response.create") == 2
    assert kinds.index("response.create", kinds.index("response.create") + 1) > max(
        i for i, e in enumerate(server.connections[0]) if e.get("item", {}).get("call_id") == "c2"
    )


async def test_speech_goes_in_and_out_as_bytes_and_only_transcripts_enter_the_history() -> None:
    heard = {"type": "conversation.item.input_audio_transcription.completed", "transcript": "hi"}
    script = [[heard, audio(b"\x00\x01speech"), audio(b"\xff more"), "Hello there."]]
    async with realtime_server(script) as server:
        agent = BidiAgent(model(server, session={"output_modalities": ["audio"]}))
        await agent.start()
        await agent.send_audio(b"\x10\x20pcm")
        await agent.send("(spoken above)")
        events = await until_complete(agent)
        await agent.stop()
    (appended,) = server.events("input_audio_buffer.append")
    assert base64.b64decode(appended["audio"]) == b"\x10\x20pcm"
    assert server.events("session.update")[0]["session"]["output_modalities"] == ["audio"]
    assert [e.get("audio") for e in events if e["type"] == "audio"] == [
        b"\x00\x01speech",
        b"\xff more",
    ]
    assert texts(agent) == ["(spoken above)", "hi", "Hello there."]
    with pytest.raises(RuntimeError, match="send_audio before start"):
        await agent.send_audio(b"late")


async def test_transcripts_come_piece_by_piece_and_only_the_finished_ones_are_kept(
    tmp_path: Path,
) -> None:
    def piece(kind: str, delta: str) -> dict[str, Any]:
        return {"type": kind, "delta": delta}

    heard = "conversation.item.input_audio_transcription"
    spoken = "response.output_audio_transcript"
    script = [
        [
            piece(f"{heard}.delta", "what's the "),
            piece(f"{heard}.delta", "weather?"),
            {"type": f"{heard}.completed", "transcript": "what's the weather?"},
            piece(f"{spoken}.delta", "Sunny "),
            piece(f"{spoken}.delta", ""),  # an empty piece says nothing: no event
            piece(f"{spoken}.delta", "today."),
            {"type": f"{spoken}.done", "transcript": "Sunny today."},
        ]
    ]
    storage = LocalFileStorage(tmp_path / "snapshots")
    async with realtime_server(script) as server:
        manager = SnapshotSessionManager("s", storage=storage)
        agent = BidiAgent(model(server), agent_id="voice", session_manager=manager)
        await agent.start()
        await agent.send_audio(b"\x10pcm")
        await agent.send("(spoken above)")
        events = await until_complete(agent)
        await agent.stop()
    assert [(e["type"], e.get("role"), e.get("text")) for e in events] == [
        ("text_delta", "user", "what's the "),
        ("text_delta", "user", "weather?"),
        ("transcript", "user", "what's the weather?"),
        ("text_delta", "assistant", "Sunny "),
        ("text_delta", "assistant", "today."),
        ("transcript", "assistant", "Sunny today."),
        ("response_complete", None, None),
    ]
    assert texts(agent) == ["(spoken above)", "what's the weather?", "Sunny today."]
    reader = BidiAgent(model(server), agent_id="voice")
    await SnapshotSessionManager("s", storage=storage).restore_snapshot(reader.snapshot_agent)
    assert texts(reader) == texts(agent)  # the pieces were never saved


async def test_a_text_delta_that_is_not_text_is_a_model_error() -> None:
    bad = {"type": "response.output_text.delta", "delta": {"text": "nested"}}
    async with realtime_server([[bad]]) as server:
        agent = BidiAgent(model(server))
        await agent.start()
        await agent.send("hi")
        with pytest.raises(ModelError, match=r"output_text\.delta.* without a text delta"):
            await until_complete(agent)
        await agent.stop()
    assert texts(agent) == ["hi"]


async def test_text_sent_while_a_response_runs_is_answered_after_it() -> None:
    # Typing ahead: the second text goes in at once, its response is asked for once
    # the running one is done (a second response.create now would be refused).
    script = [[{"pause": 0.2}, "Answer one."], ["Answer two."]]
    async with realtime_server(script) as server:
        agent = BidiAgent(model(server))
        await agent.start()
        await agent.send("one")
        await agent.send("two")
        await until_complete(agent)
        await until_complete(agent)
        await agent.stop()
    assert texts(agent) == ["one", "two", "Answer one.", "Answer two."]
    assert server.refused == 0
    kinds = [e["type"] for e in server.connections[0]]
    assert kinds.count("response.create") == 2


async def test_a_restored_agent_opens_its_connection_with_the_whole_history(tmp_path: Path) -> None:
    calls.clear()
    script = [[call("weather", "call_1", city="Oslo")], ["Sunny."], ["Still sunny."]]
    async with realtime_server(script) as server:
        manager = SnapshotSessionManager("call", storage=LocalFileStorage(tmp_path))
        first = BidiAgent(model(server), tools=[weather], agent_id="voice", session_manager=manager)
        await first.start()
        await first.send("weather in Oslo?")
        await until_complete(first)
        await first.stop()
        # Another process: a new manager and model, the same storage.
        manager = SnapshotSessionManager("call", storage=LocalFileStorage(tmp_path))
        again = BidiAgent(model(server), tools=[weather], agent_id="voice", session_manager=manager)
        await again.start()
        await again.send("and now?")
        await until_complete(again)
        await again.stop()
    replayed = [e["item"] for e in server.events("conversation.item.create", 1)]
    assert replayed == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "weather in Oslo?"}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny in Oslo"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Sunny."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "and now?"}],
        },
    ]
    assert texts(again)[-1] == "Still sunny."
    assert calls == ["Oslo"]


@pytest.mark.parametrize("ending", [EXPIRE, DROP])
async def test_an_expired_or_dropped_connection_is_restarted_with_the_history(ending: str) -> None:
    script = [["First answer."], [ending], ["Answer on the new connection."]]
    async with realtime_server(script) as server:
        agent = BidiAgent(model(server), agent_id="voice")
        await agent.start()
        await agent.send("one")
        await until_complete(agent)
        await agent.send("two")
        events: list[str] = []
        async for event in agent.receive():
            events.append(event["type"])
            if event["type"] == "restart_required":
                break
        assert events == ["restart_required"]  # "two" got no answer on the old one
        assert len(server.connections) == 2  # restarted before the event was yielded
        await agent.send("three")
        await until_complete(agent)
        await agent.stop()
    # The new connection was given the history, then the new turn.
    replayed = [
        e["item"]["content"][0]["text"] for e in server.events("conversation.item.create", 1)
    ]
    assert replayed == ["one", "First answer.", "two", "three"]
    assert texts(agent) == ["one", "First answer.", "two", "three", "Answer on the new connection."]


async def test_a_server_that_closes_every_connection_at_once_is_not_reconnected_for_ever() -> None:
    async with realtime_server([], close_at_once=True) as server:
        agent = BidiAgent(model(server))
        await agent.start()
        await agent.send("hi")
        with pytest.raises(ModelConnectionError, match="closed the connection before any event"):
            await until_complete(agent)
        await agent.stop()
    assert len(server.connections) == 1  # no reconnection


async def test_refusals_and_failures_are_model_errors_that_say_why() -> None:
    async with realtime_server([]) as server:
        wrong = BidiAgent(model(server, api_key="sk-wrong"))
        with pytest.raises(ModelAuthenticationError, match="Incorrect API key"):
            await wrong.start()
        assert not wrong.model.open  # type: ignore[attr-defined]
    rate = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "code": "rate_limit_exceeded",
            "message": "Slow down.",
        },
    }
    async with realtime_server([[rate]]) as server:
        agent = BidiAgent(model(server))
        await agent.start()
        await agent.send("hi")
        with pytest.raises(ModelRateLimitError, match="Slow down"):
            await until_complete(agent)
        await agent.stop()
    failed = {0: {"type": "server_error", "message": "The server had an error."}}
    async with realtime_server([["partial"]], failed=failed) as server:
        agent = BidiAgent(model(server))
        await agent.start()
        await agent.send("hi")
        with pytest.raises(ModelServerError, match="The server had an error"):
            await until_complete(agent)
        await agent.stop()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    nobody = OpenAIRealtimeModel(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, open_timeout=2
    )
    with pytest.raises(ModelConnectionError, match="cannot connect"):
        await nobody.start(system_prompt=None, tool_specs=[], messages=[])


async def test_bad_arguments_and_histories_are_refused_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelAuthenticationError, match="OPENAI_API_KEY"):
        OpenAIRealtimeModel()
    with pytest.raises(ValueError, match="must not set \\['tools'\\]"):
        OpenAIRealtimeModel(api_key="k", session={"tools": []})
    with pytest.raises(ValueError, match="base_url must be"):
        OpenAIRealtimeModel(api_key="k", base_url="ftp://example.com")
    with pytest.raises(ValueError, match="open_timeout"):
        OpenAIRealtimeModel(api_key="k", open_timeout=0)
    picture = {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}
    async with realtime_server([]) as server:
        adapter = model(server)
        with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\] is a 'image' block"):
            await adapter.start(
                system_prompt=None,
                tool_specs=[],
                messages=[{"role": "user", "content": [picture]}],  # type: ignore[list-item]
            )
        assert server.connections == []  # refused before connecting
        with pytest.raises(RuntimeError, match="send before start"):
            await adapter.send({"type": "text", "text": "hi"})
        await adapter.start(system_prompt=None, tool_specs=[], messages=[])
        with pytest.raises(ValueError, match="cannot send an input of type 'video'"):
            await adapter.send({"type": "video"})  # type: ignore[typeddict-item]
        with pytest.raises(ValueError, match="an audio input needs bytes"):
            await adapter.send({"type": "audio", "audio": "not bytes"})  # type: ignore[typeddict-item]
        await adapter.stop()
        await adapter.stop()  # idempotent
    await asyncio.sleep(0)


def test_importing_the_adapter_does_not_import_websockets() -> None:
    code = (
        "import sys\n"
        "from perdure.bidi import OpenAIRealtimeModel\n"
        "OpenAIRealtimeModel(api_key='k')\n"
        "assert 'websockets' not in sys.modules, 'imported at import time'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
