"""perdure ⇄ Anthropic Messages mapping: pure functions, no server."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.errors import ModelConnectionError
from perdure.models import ReasoningDelta, TextDelta, ToolUseDelta
from perdure.models._anthropic_format import (
    AnthropicStreamState,
    anthropic_stop_reason,
    from_anthropic_messages,
    to_anthropic_messages,
    to_anthropic_tools,
)
from perdure.types import Message

GIF = b"GIF89a\x01\x00"


def _user(*blocks: Any) -> Message:
    return {"role": "user", "content": list(blocks)}


def _assistant(*blocks: Any) -> Message:
    return {"role": "assistant", "content": list(blocks)}


def test_text_image_and_tool_blocks_map_to_typed_blocks() -> None:
    messages = [
        _user({"text": "what is in it?"}, {"image": {"format": "gif", "source": {"bytes": GIF}}}),
        _assistant(
            {"text": "Checking."},
            {"toolUse": {"toolUseId": "toolu_1", "name": "look", "input": {"zoom": 2}}},
        ),
        _user(
            {
                "toolResult": {
                    "toolUseId": "toolu_1",
                    "status": "error",
                    "content": [{"text": "lens cracked"}, {"json": {"code": 7}}],
                }
            }
        ),
    ]
    before = copy.deepcopy(messages)
    wire = to_anthropic_messages(messages)
    assert messages == before
    assert wire == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in it?"},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/gif",
                        "data": base64.b64encode(GIF).decode(),
                    },
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"zoom": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [
                        {"type": "text", "text": "lens cracked"},
                        {"type": "text", "text": '{"code": 7}'},
                    ],
                    "is_error": True,
                }
            ],
        },
    ]


def test_consecutive_user_messages_merge_with_tool_results_first() -> None:
    # A failed model call leaves [.., user(results)] and the next prompt adds user(text).
    messages = [
        _user({"text": "go"}),
        _assistant({"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}),
        _user(
            {"text": "note first"},
            {"toolResult": {"toolUseId": "t1", "status": "success", "content": []}},
        ),
        _user({"text": "and then"}),
    ]
    wire = to_anthropic_messages(messages)
    assert [item["role"] for item in wire] == ["user", "assistant", "user"]
    assert wire[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1"},
        {"type": "text", "text": "note first"},
        {"type": "text", "text": "and then"},
    ]


def test_empty_text_and_empty_messages_are_dropped_and_neighbours_merge() -> None:
    messages = [
        _user({"text": "one"}),
        _assistant({"text": "  \n"}),  # whitespace-only: the API refuses it
        _user({"text": ""}, {"text": "two"}),
    ]
    assert to_anthropic_messages(messages) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]


def test_reasoning_goes_back_only_with_a_signature() -> None:
    wire = to_anthropic_messages(
        [
            _user({"text": "q"}),
            _assistant(
                {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig=="}}},
                {"reasoningContent": {"redactedContent": "EmwKAhgB"}},
                {"reasoningContent": {"reasoningText": {"text": "unsigned"}}},
                {"text": "answer"},
            ),
        ]
    )
    assert wire[1]["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
        {"type": "redacted_thinking", "data": "EmwKAhgB"},
        {"type": "text", "text": "answer"},
    ]


def test_documents_and_non_object_tool_input() -> None:
    wire = to_anthropic_messages(
        [
            _user(
                {"document": {"format": "pdf", "name": "spec", "source": {"bytes": b"%PDF"}}},
                {"document": {"format": "txt", "name": "notes", "source": {"bytes": b"plain"}}},
            ),
            _assistant({"toolUse": {"toolUseId": "t", "name": "f", "input": '{"cut off'}}),
        ]
    )
    assert wire[0]["content"] == [
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="},
            "title": "spec",
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "plain"},
            "title": "notes",
        },
    ]
    assert wire[1]["content"][0]["input"] == {}


@pytest.mark.parametrize(
    ("message", "error", "match"),
    [
        (
            _user({"image": {"format": "tiff", "source": {"bytes": b""}}}),
            ValueError,
            "image format",
        ),
        (
            _assistant({"image": {"format": "png", "source": {"bytes": b""}}}),
            ValueError,
            "assistant",
        ),
        (_user({"image": {"format": "png", "source": {}}}), TypeError, "source must be"),
    ],
)
def test_what_cannot_be_carried_is_named(
    message: Message, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=rf"messages\[0\]\.content\[0\].*{match}"):
        to_anthropic_messages([message])


def test_tool_specs_use_input_schema() -> None:
    spec: Any = {"name": "f", "description": "does f", "inputSchema": {"json": {"type": "object"}}}
    assert to_anthropic_tools([spec]) == [
        {"name": "f", "description": "does f", "input_schema": {"type": "object"}}
    ]


# ----------------------------------------------------------------- round trip

_text = st.text(min_size=1, max_size=20).filter(str.strip)
_image = st.builds(
    lambda fmt, data: {"image": {"format": fmt, "source": {"bytes": data}}},
    st.sampled_from(["png", "jpeg", "gif", "webp"]),
    st.binary(max_size=16),
)
_inputs = st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)


@st.composite
def _histories(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    for turn in range(draw(st.integers(1, 4))):
        messages.append(
            _user(
                *draw(
                    st.lists(
                        st.one_of(_text.map(lambda t: {"text": t}), _image), min_size=1, max_size=3
                    )
                )
            )
        )
        texts = draw(st.lists(_text.map(lambda t: {"text": t}), max_size=2))
        calls = [
            {"toolUse": {"toolUseId": f"toolu_{turn}_{i}", "name": "f", "input": value}}
            for i, value in enumerate(draw(st.lists(_inputs, max_size=2)))
        ]
        messages.append(_assistant(*(texts or [{"text": "ok"}]), *calls))
        if calls:
            results = [
                {
                    "toolResult": {
                        "toolUseId": call["toolUse"]["toolUseId"],
                        "status": draw(st.sampled_from(["success", "error"])),
                        "content": draw(
                            st.lists(
                                st.one_of(_text.map(lambda t: {"text": t}), _image), max_size=2
                            )
                        ),
                    }
                }
                for call in calls
            ]
            messages.append(_user(*results))
            messages.append(_assistant({"text": "done"}))
    return messages


@given(_histories())
def test_to_and_from_anthropic_round_trips(messages: list[Message]) -> None:
    back, system = from_anthropic_messages(to_anthropic_messages(messages), "sys")
    assert back == messages
    assert system == "sys"


def test_from_anthropic_reads_strings_and_system_blocks() -> None:
    messages, system = from_anthropic_messages(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
            },
        ],
        [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    )
    assert messages == [
        _user({"text": "hi"}),
        _user({"toolResult": {"toolUseId": "t", "status": "success", "content": [{"text": "ok"}]}}),
    ]
    assert system == "a\n\nb"
    with pytest.raises(ValueError, match="only base64"):
        from_anthropic_messages(
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}],
                }
            ]
        )


# ------------------------------------------------------------------ streaming


def _feed(state: AnthropicStreamState, events: list[dict[str, Any]]) -> list[Any]:
    return [out for event in events for out in state.feed(event)]


def test_stream_state_assembles_thinking_text_and_tool_use() -> None:
    state = AnthropicStreamState()
    events = [
        {
            "type": "message_start",
            "message": {
                "usage": {
                    "input_tokens": 10,
                    "cache_read_input_tokens": 100,
                    "cache_creation_input_tokens": 5,
                    "output_tokens": 1,
                }
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Let me"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "EqQB"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "text_delta", "text": "Sure."},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"q": '},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '"x"}'},
        },
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 42},
        },
        {"type": "message_stop"},
    ]
    assert _feed(state, events) == [
        ReasoningDelta("Let me"),
        TextDelta("Sure."),
        ToolUseDelta("toolu_9", "f", ""),
        ToolUseDelta("toolu_9", "f", '{"q": '),
        ToolUseDelta("toolu_9", "f", '"x"}'),
    ]
    final = state.finish()
    assert final.message["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Let me", "signature": "EqQB"}}},
        {"text": "Sure."},
        {"toolUse": {"toolUseId": "toolu_9", "name": "f", "input": {"q": "x"}}},
    ]
    assert final.stop_reason == "tool_use"
    assert final.usage == {"inputTokens": 115, "outputTokens": 42, "totalTokens": 157}


def test_a_tool_use_without_input_gets_an_empty_object_and_unknown_blocks_are_skipped() -> None:
    state = AnthropicStreamState()
    _feed(
        state,
        [
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 3, "output_tokens": 1}},
            },
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "server_tool_use", "id": "s"},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": "{}"},
            },
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t", "name": "now", "input": {}},
            },
            {"type": "content_block_stop", "index": 1},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 5},
            },
            {"type": "message_stop"},
        ],
    )
    assert state.finish().message["content"] == [
        {"toolUse": {"toolUseId": "t", "name": "now", "input": {}}}
    ]


def test_a_stream_without_message_stop_was_cut_short() -> None:
    state = AnthropicStreamState()
    state.feed({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})
    with pytest.raises(ModelConnectionError, match="message_stop"):
        state.finish()


@pytest.mark.parametrize(
    ("reason", "calls", "expected"),
    [
        ("end_turn", False, "end_turn"),
        ("tool_use", True, "tool_use"),
        ("max_tokens", True, "max_tokens"),
        ("stop_sequence", False, "stop_sequence"),
        ("refusal", False, "content_filtered"),
        ("pause_turn", False, "end_turn"),
        ("model_context_window_exceeded", False, "max_tokens"),
        (None, True, "tool_use"),
        (None, False, "end_turn"),
    ],
)
def test_stop_reasons(reason: str | None, calls: bool, expected: str) -> None:
    assert anthropic_stop_reason(reason, has_tool_calls=calls) == expected
