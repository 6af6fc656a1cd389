"""perdure ⇄ OpenAI Chat Completions mapping: pure functions, no server."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.errors import ModelConnectionError
from perdure.models import ModelResponse, ReasoningDelta, TextDelta, ToolUseDelta
from perdure.models._openai_format import (
    TOOL_ERROR_PREFIX,
    OpenAIStreamState,
    from_openai_messages,
    openai_stop_reason,
    to_openai_messages,
    to_openai_tools,
)
from perdure.types import Message, ToolSpec

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


def test_system_prompt_comes_first_and_a_lone_text_is_a_string() -> None:
    wire = to_openai_messages([{"role": "user", "content": [{"text": "hi"}]}], "be brief")
    assert wire == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert to_openai_messages([{"role": "user", "content": [{"text": "hi"}]}]) == [
        {"role": "user", "content": "hi"}
    ]


def test_image_becomes_a_data_url_part_beside_text() -> None:
    messages: list[Message] = [
        {
            "role": "user",
            "content": [
                {"text": "what is this?"},
                {"image": {"format": "png", "source": {"bytes": PNG}}},
            ],
        }
    ]
    wire = to_openai_messages(messages)
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert wire == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


def test_tool_round_trip_maps_calls_results_and_error_status() -> None:
    messages: list[Message] = [
        {"role": "user", "content": [{"text": "add"}]},
        {
            "role": "assistant",
            "content": [
                {"text": "On it."},
                {"toolUse": {"toolUseId": "c1", "name": "add", "input": {"a": 1, "b": 2}}},
                {"toolUse": {"toolUseId": "c2", "name": "boom", "input": {}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "c1",
                        "status": "success",
                        "content": [{"text": "3"}],
                    }
                },
                {
                    "toolResult": {
                        "toolUseId": "c2",
                        "status": "error",
                        "content": [{"text": "kaboom"}, {"json": {"why": "x"}}],
                    }
                },
            ],
        },
    ]
    before = copy.deepcopy(messages)
    wire = to_openai_messages(messages)
    assert messages == before  # never mutated
    assert wire[1] == {
        "role": "assistant",
        "content": "On it.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "boom", "arguments": "{}"}},
        ],
    }
    assert wire[2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": TOOL_ERROR_PREFIX + 'kaboom\n\n{"why": "x"}',
        },
    ]


def test_tool_results_precede_the_users_text_and_tool_images_follow_as_user_content() -> None:
    messages: list[Message] = [
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "c1", "name": "snap", "input": {}}}],
        },
        {
            "role": "user",
            "content": [
                {"text": "and also this"},
                {
                    "toolResult": {
                        "toolUseId": "c1",
                        "status": "success",
                        "content": [
                            {"text": "here"},
                            {"image": {"format": "jpg", "source": {"bytes": b"\xff\xd8"}}},
                        ],
                    }
                },
            ],
        },
    ]
    wire = to_openai_messages(messages)
    assert wire[0] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "snap", "arguments": "{}"}}
        ],
    }
    assert [m["role"] for m in wire[1:]] == ["tool", "user", "user"]
    assert wire[1]["content"] == "here"
    assert wire[2]["content"][0]["text"] == "Attachments returned by tool call c1:"
    assert wire[2]["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,/9g")
    assert wire[3] == {"role": "user", "content": "and also this"}


def test_documents_pdf_as_file_and_text_inline() -> None:
    wire = to_openai_messages(
        [
            {
                "role": "user",
                "content": [
                    {"document": {"format": "pdf", "name": "spec", "source": {"bytes": b"%PDF"}}},
                    {"document": {"format": "md", "name": "notes", "source": {"bytes": b"# hi"}}},
                ],
            }
        ]
    )
    file_part, text_part = wire[0]["content"]
    assert file_part == {
        "type": "file",
        "file": {"filename": "spec.pdf", "file_data": "data:application/pdf;base64,JVBERg=="},
    }
    assert text_part == {"type": "text", "text": "[document: notes]\n# hi"}


def test_reasoning_is_not_sent_back() -> None:
    wire = to_openai_messages(
        [
            {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "hmm"}}},
                    {"text": "answer"},
                ],
            }
        ]
    )
    assert wire == [{"role": "assistant", "content": "answer"}]


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (
            {"role": "user", "content": [{"image": {"format": "bmp", "source": {"bytes": b""}}}]},
            r"messages\[0\]\.content\[0\]: image format",
        ),
        (
            {
                "role": "assistant",
                "content": [{"image": {"format": "png", "source": {"bytes": b""}}}],
            },
            r"messages\[0\]\.content\[0\]",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"document": {"format": "docx", "name": "d", "source": {"bytes": b""}}}
                ],
            },
            r"document format",
        ),
    ],
)
def test_blocks_the_format_cannot_carry_raise_value_error_naming_where(
    message: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        to_openai_messages([message])


def test_image_without_bytes_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"messages\[0\]\.content\[0\]: source must be"):
        to_openai_messages(
            [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "x"}}}]}]
        )


def test_tool_specs_become_functions() -> None:
    spec: ToolSpec = {
        "name": "add",
        "description": "Add two numbers.",
        "inputSchema": {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    }
    assert to_openai_tools([spec]) == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
        }
    ]


# ----------------------------------------------------------------- round trip

_text = st.text(min_size=1, max_size=20)
_ids = st.text(alphabet="abcdef0123456789", min_size=4, max_size=8)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_image = st.builds(
    lambda fmt, data: {"image": {"format": fmt, "source": {"bytes": data}}},
    st.sampled_from(["png", "jpeg", "gif", "webp"]),
    st.binary(max_size=16),
)


@st.composite
def _histories(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    for _ in range(draw(st.integers(1, 4))):
        user_blocks = draw(
            st.lists(st.one_of(_text.map(lambda t: {"text": t}), _image), min_size=1, max_size=3)
        )
        messages.append({"role": "user", "content": user_blocks})
        texts = draw(st.lists(_text.map(lambda t: {"text": t}), max_size=2))
        calls = [
            {"toolUse": {"toolUseId": f"call_{i}_{tid}", "name": name, "input": value}}
            for i, (tid, name, value) in enumerate(
                draw(
                    st.lists(
                        st.tuples(
                            _ids,
                            st.sampled_from(["add", "look"]),
                            st.dictionaries(st.text(max_size=5), _json_value, max_size=3),
                        ),
                        max_size=2,
                    )
                )
            )
        ]
        if not texts and not calls:
            texts = [{"text": "ok"}]
        messages.append({"role": "assistant", "content": [*texts, *calls]})
        if calls:
            results = [
                {
                    "toolResult": {
                        "toolUseId": call["toolUse"]["toolUseId"],
                        "status": draw(st.sampled_from(["success", "error"])),
                        "content": [{"text": draw(_text)}],
                    }
                }
                for call in calls
            ]
            messages.append({"role": "user", "content": results})
    return messages


@given(_histories(), st.none() | _text)
def test_to_and_from_openai_round_trips(messages: list[Message], system: str | None) -> None:
    back, back_system = from_openai_messages(to_openai_messages(messages, system))
    # Tool results and the user turn after them fold into one user message.
    expected: list[Message] = []
    for message in messages:
        if (
            expected
            and message["role"] == "user"
            and expected[-1]["role"] == "user"
            and any("toolResult" in b for b in expected[-1]["content"])
        ):
            expected[-1] = {
                "role": "user",
                "content": [*expected[-1]["content"], *message["content"]],
            }
        else:
            expected.append(message)
    assert back == expected
    assert back_system == system


def test_from_openai_rejects_remote_images_and_unknown_roles() -> None:
    with pytest.raises(ValueError, match="data: URLs"):
        from_openai_messages(
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
                }
            ]
        )
    with pytest.raises(ValueError, match="unknown role 'function'"):
        from_openai_messages([{"role": "function", "content": "x"}])


# ------------------------------------------------------------------ streaming


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_state_assembles_text_reasoning_and_usage() -> None:
    state = OpenAIStreamState()
    events = [
        *state.feed(_chunk({"role": "assistant", "reasoning_content": "think "})),
        *state.feed(_chunk({"reasoning": "more"})),
        *state.feed(_chunk({"content": "Hel"})),
        *state.feed(_chunk({"content": "lo"}, "stop")),
        *state.feed({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
    ]
    assert events == [
        ReasoningDelta("think "),
        ReasoningDelta("more"),
        TextDelta("Hel"),
        TextDelta("lo"),
    ]
    final = state.finish()
    assert final == ModelResponse(
        message={
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "think more"}}},
                {"text": "Hello"},
            ],
        },
        stop_reason="end_turn",
        usage={"inputTokens": 7, "outputTokens": 3, "totalTokens": 10},
    )


def test_stream_state_assembles_interleaved_parallel_calls_by_index() -> None:
    state = OpenAIStreamState()
    feed = [
        _chunk(
            {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]}
        ),
        _chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "b", "function": {"name": "g", "arguments": '{"y"'}}
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}),
        _chunk({"tool_calls": [{"index": 1, "function": {"arguments": ": 2}"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "tool_calls"),
    ]
    events = [event for chunk in feed for event in state.feed(chunk)]
    assert events == [
        ToolUseDelta("a", "f", ""),
        ToolUseDelta("b", "g", '{"y"'),
        ToolUseDelta("a", "f", '{"x": '),
        ToolUseDelta("b", "g", ": 2}"),
        ToolUseDelta("a", "f", "1}"),
    ]
    final = state.finish()
    assert final.stop_reason == "tool_use"
    assert final.message["content"] == [
        {"toolUse": {"toolUseId": "a", "name": "f", "input": {"x": 1}}},
        {"toolUse": {"toolUseId": "b", "name": "g", "input": {"y": 2}}},
    ]
    assert final.usage == {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}


def test_stream_state_tolerates_compatible_servers_quirks() -> None:
    state = OpenAIStreamState()
    # no index and no id (some servers), a whole call in one chunk, "stop" beside calls,
    # a second call reusing index 0 with a new id, and arguments that are not JSON.
    state.feed(_chunk({"tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}))
    state.feed(
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "z", "function": {"name": "g", "arguments": "{oops"}}
                ]
            }
        )
    )
    state.feed(_chunk({}, "stop"))
    final = state.finish()
    first, second = (block["toolUse"] for block in final.message["content"])
    assert first["toolUseId"].startswith("call_")
    assert first["input"] == {"x": 1}
    assert second == {"toolUseId": "z", "name": "g", "input": "{oops"}
    assert final.stop_reason == "tool_use"


def test_a_stream_without_finish_reason_was_cut_short() -> None:
    state = OpenAIStreamState()
    state.feed(_chunk({"content": "partial"}))
    with pytest.raises(ModelConnectionError, match="no finish_reason"):
        state.finish()


@pytest.mark.parametrize(
    ("finish", "calls", "expected"),
    [
        ("stop", False, "end_turn"),
        ("stop", True, "tool_use"),
        ("tool_calls", True, "tool_use"),
        ("function_call", True, "tool_use"),
        ("length", False, "max_tokens"),
        ("length", True, "max_tokens"),
        ("content_filter", False, "content_filtered"),
        ("something_new", False, "end_turn"),
    ],
)
def test_finish_reasons_map_to_stop_reasons(finish: str, calls: bool, expected: str) -> None:
    assert openai_stop_reason(finish, has_tool_calls=calls) == expected
