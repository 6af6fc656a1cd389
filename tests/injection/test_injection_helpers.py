"""The pure helpers of perdure.injection: escaping, folding, user turns."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.injection import (
    escape_xml_attr,
    escape_xml_text,
    fold_into_last_user_message,
    is_user_turn,
    latest_text,
)
from perdure.types import Message


def user(*blocks: Any) -> Message:
    return {"role": "user", "content": [{"text": b} if isinstance(b, str) else b for b in blocks]}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": [{"text": text}]}


def result(tool_use_id: str, text: str = "ok") -> dict[str, Any]:
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "success", "content": [{"text": text}]}
    }


# --------------------------------------------------------------------------- escaping


def test_escape_text_escapes_ampersand_first() -> None:
    assert escape_xml_text("a < b > c & d") == "a &lt; b &gt; c &amp; d"
    assert escape_xml_text("&lt;") == "&amp;lt;"  # not left as an entity
    assert escape_xml_text("</entry></memory>") == "&lt;/entry&gt;&lt;/memory&gt;"
    assert escape_xml_text('"quotes" stay') == '"quotes" stay'


def test_escape_attr_also_escapes_quotes() -> None:
    assert escape_xml_attr("""a"b'c<&>""") == "a&quot;b&apos;c&lt;&amp;&gt;"


@pytest.mark.parametrize("function", [escape_xml_text, escape_xml_attr])
def test_escape_refuses_non_str(function: Any) -> None:
    with pytest.raises(TypeError, match="must be a str"):
        function(b"bytes")


@given(st.text())
def test_escaped_text_has_no_markup_and_round_trips(text: str) -> None:
    for escaped in (escape_xml_text(text), escape_xml_attr(text)):
        assert "<" not in escaped
        assert ">" not in escaped
        unescaped = (
            escaped.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", '"')
            .replace("&apos;", "'")
            .replace("&amp;", "&")
        )
        assert unescaped == text
    assert '"' not in escape_xml_attr(text)
    assert "'" not in escape_xml_attr(text)


# --------------------------------------------------------------------------- folding


def test_fold_prepends_on_a_fresh_user_turn() -> None:
    messages = [user("hi"), assistant("hello"), user("what theme?", {"json": {"x": 1}})]
    new, tail = fold_into_last_user_message(messages, "<memory/>")
    assert new[-1]["content"] == [
        {"text": "<memory/>"},
        {"text": "what theme?"},
        {"json": {"x": 1}},
    ]
    assert tail == 3  # the whole last message differs from what is stored
    assert new[:-1] == messages[:-1]


def test_fold_appends_after_tool_results() -> None:
    messages = [
        user("run it"),
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "x", "input": {}}}],
        },
        user(result("t1")),
    ]
    new, tail = fold_into_last_user_message(messages, "injected")
    assert new[-1]["content"] == [result("t1"), {"text": "injected"}]
    assert tail == 1  # only the injected block; the results are as stored


def test_fold_places_text_between_closing_results_and_a_new_prompt() -> None:
    messages = [user(result("t1"), result("t2"), "new question")]
    new, tail = fold_into_last_user_message(messages, "X")
    assert new[-1]["content"] == [
        result("t1"),
        result("t2"),
        {"text": "X"},
        {"text": "new question"},
    ]
    assert tail == 2


@pytest.mark.parametrize("messages", [[], [user("q"), assistant("a")]])
def test_fold_without_a_last_user_message_injects_nothing(messages: list[Message]) -> None:
    new, tail = fold_into_last_user_message(messages, "X")
    assert (new, tail) == (messages, 0)
    assert new is not messages


def test_fold_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="messages"):
        fold_into_last_user_message("hi", "X")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text"):
        fold_into_last_user_message([user("q")], None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text"):
        fold_into_last_user_message([user("q")], "")


_block = st.one_of(
    st.builds(lambda t: {"text": t}, st.text(max_size=20)),
    st.builds(lambda i: result(i), st.text(min_size=1, max_size=5)),
)
_message = st.builds(
    lambda role, blocks: {"role": role, "content": blocks},
    st.sampled_from(["user", "assistant"]),
    st.lists(_block, max_size=4),
)


@given(st.lists(_message, max_size=5), st.text(min_size=1, max_size=20))
def test_fold_never_mutates_its_input(messages: list[Message], text: str) -> None:
    before = copy.deepcopy(messages)
    identities = [(id(m), id(m["content"])) for m in messages]
    new, tail = fold_into_last_user_message(messages, text)
    assert messages == before
    assert [(id(m), id(m["content"])) for m in messages] == identities
    assert len(new) == len(messages)
    if tail:
        last = new[-1]["content"]
        assert last[len(last) - tail] == {"text": text}
        stored = messages[-1]["content"]
        assert last[: len(last) - tail] == stored[: len(last) - tail]  # prefix as stored
        results = [i for i, b in enumerate(last) if "toolResult" in b]
        assert all(i < len(last) - tail for i in results)  # results stay first
    else:
        assert new == messages


# --------------------------------------------------------------------------- turns


def test_user_turn_and_tool_turn() -> None:
    assert is_user_turn([user("hi")])
    assert not is_user_turn([user(result("t1"))])
    assert is_user_turn([user(result("t1"), "and a new question")])
    assert not is_user_turn([user("hi"), assistant("a")])
    assert not is_user_turn([])


def test_latest_text_skips_messages_without_text() -> None:
    messages = [assistant("first"), user("q"), {"role": "assistant", "content": []}]
    assert latest_text(messages, "assistant") == "first"
    assert latest_text(messages, "user") == "q"
    assert latest_text([user(result("t1"))], "user") is None
