"""ScriptedModel plays back its script exactly as SPEC §3 describes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from perdure.errors import ModelError
from perdure.models import Model, ModelResponse, ScriptedModel, TextDelta, ToolUseDelta
from perdure.types import Message

USER: list[Message] = [{"role": "user", "content": [{"text": "hi"}]}]


async def play(model: ScriptedModel, messages: list[Message] = USER) -> list[Any]:
    return [e async for e in model.stream(messages, tool_specs=[], system_prompt="sys")]


async def test_string_becomes_an_end_turn_text_message_streamed_in_pieces() -> None:
    events = await play(ScriptedModel(["hello big world"]))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "hello big world"
    assert len([e for e in events if isinstance(e, TextDelta)]) == 3
    final = events[-1]
    assert isinstance(final, ModelResponse)
    assert final.stop_reason == "end_turn"
    assert final.message == {"role": "assistant", "content": [{"text": "hello big world"}]}
    assert final.usage["totalTokens"] == final.usage["inputTokens"] + final.usage["outputTokens"]


async def test_message_with_tool_use_is_a_tool_use_turn() -> None:
    message: Message = {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {"x": 1}}}],
    }
    events = await play(ScriptedModel([message]))
    assert events[0] == ToolUseDelta("t", "f", '{"x": 1}')
    assert events[-1].stop_reason == "tool_use"
    assert events[-1].message == message


async def test_callable_sees_the_request_and_exceptions_are_raised() -> None:
    seen: list[list[Message]] = []

    def respond(messages: list[Message]) -> str:
        seen.append(messages)
        return f"you said {messages[-1]['content'][0]['text']}"

    model = ScriptedModel([respond, RuntimeError("provider exploded")])
    events = await play(model)
    assert str(events[-1].message["content"][0]["text"]) == "you said hi"
    assert seen == [USER]
    with pytest.raises(RuntimeError, match="provider exploded"):
        await play(model)


async def test_model_response_passes_through() -> None:
    response = ModelResponse(
        message={"role": "assistant", "content": [{"text": "cut"}]}, stop_reason="max_tokens"
    )
    events = await play(ScriptedModel([response]))
    assert events[-1] is response


async def test_records_every_request_as_deep_copies() -> None:
    model = ScriptedModel(["a"])
    messages: list[Message] = [{"role": "user", "content": [{"text": "original"}]}]
    await play(model, messages)
    messages[0]["content"][0]["text"] = "changed"
    assert model.requests == [
        {
            "messages": [{"role": "user", "content": [{"text": "original"}]}],
            "tool_specs": [],
            "system_prompt": "sys",
        }
    ]


async def test_record_none_plays_the_same_script_and_keeps_no_copy() -> None:
    recording, silent = ScriptedModel(["a", "b"]), ScriptedModel(["a", "b"], record="none")
    for _ in range(2):
        assert [repr(e) for e in await play(recording)] == [repr(e) for e in await play(silent)]
    assert len(recording.requests) == 2
    assert silent.requests == []
    assert silent.calls == recording.calls == 2
    with pytest.raises(ModelError, match=r"ScriptedModel ran out of responses: call 3"):
        await play(silent)  # the count is right without a record


async def test_input_tokens_follow_the_whole_request_as_it_grows_and_changes() -> None:
    # Kept incrementally across calls (a long run is not quadratic in the model), the
    # estimate is still the JSON of the whole request / 4, whatever the request.
    model = ScriptedModel(["ok"] * 6, record="none")
    history: list[Message] = []

    def expected() -> int:
        return max(1, len(json.dumps(history, default=str)) // 4)

    for i in range(3):
        history.append({"role": "user", "content": [{"text": f"question {i} " * (i + 1)}]})
        assert (await play(model, list(history)))[-1].usage["inputTokens"] == expected()
        history.append({"role": "assistant", "content": [{"text": "ok"}]})
    history[-1] = {"role": "assistant", "content": [{"text": "redacted, and longer " * 9}]}
    assert (await play(model, list(history)))[-1].usage["inputTokens"] == expected()
    history[:] = [{"role": "user", "content": [{"text": "a summary " * 40}]}]  # compacted
    assert (await play(model, list(history)))[-1].usage["inputTokens"] == expected()
    history.clear()
    assert (await play(model, []))[-1].usage["inputTokens"] == 1


def test_record_must_be_copy_or_none() -> None:
    with pytest.raises(ValueError, match="record must be 'copy' or 'none'"):
        ScriptedModel([], record="lazy")  # type: ignore[arg-type]


async def test_running_out_and_bad_responses_are_clear_errors() -> None:
    model = ScriptedModel(["only"])
    await play(model)
    assert model.remaining == 0
    with pytest.raises(ModelError, match=r"ScriptedModel ran out of responses: call 2"):
        await play(model)
    with pytest.raises(ModelError, match="ScriptedModel response"):
        await play(ScriptedModel([42]))  # type: ignore[list-item]
    with pytest.raises(ModelError, match="content"):
        await play(ScriptedModel([{"role": "assistant", "content": "x"}]))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of responses"):
        ScriptedModel("just a string")


def test_scripted_model_satisfies_the_protocol() -> None:
    assert isinstance(ScriptedModel([]), Model)
