"""to_tool_result and error_result: every kind of return value, and JSON round trips."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.tools import error_result, to_tool_result
from perdure.types import CONTENT_BLOCK_KEYS

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=15,
)


def _is_special(value: object) -> bool:
    """Strings and content-block lists have their own rules; ToolResult-like dicts too."""
    if isinstance(value, str):
        return True
    if (
        isinstance(value, list)
        and value
        and all(isinstance(b, dict) and len(b) == 1 and set(b) <= CONTENT_BLOCK_KEYS for b in value)
    ):
        return True
    return isinstance(value, dict) and "status" in value and "content" in value


@given(JSON_VALUES.filter(lambda v: not _is_special(v)))
def test_json_values_round_trip_through_one_text_block(value: object) -> None:
    result = to_tool_result("id", value)
    assert result["toolUseId"] == "id"
    assert result["status"] == "success"
    assert len(result["content"]) == 1
    assert json.loads(result["content"][0]["text"]) == value


@given(st.text())
def test_strings_are_kept_verbatim(value: str) -> None:
    assert to_tool_result("id", value) == {
        "toolUseId": "id",
        "status": "success",
        "content": [{"text": value}],
    }


def test_json_keeps_non_ascii() -> None:
    assert to_tool_result("id", {"städte": ["東京"]})["content"] == [
        {"text": '{"städte": ["東京"]}'}
    ]


def test_none_is_null_text() -> None:
    assert to_tool_result("id", None)["content"] == [{"text": "null"}]


@pytest.mark.parametrize("status", ["success", "error"])
def test_tool_result_dicts_are_kept_with_the_right_id(status: str) -> None:
    original: dict[str, Any] = {
        "toolUseId": "stale",
        "status": status,
        "content": [{"text": "x"}, {"json": {"a": 1}}],
    }
    snapshot = copy.deepcopy(original)
    result = to_tool_result("fresh", original)
    assert result == {"toolUseId": "fresh", "status": status, "content": snapshot["content"]}
    assert original == snapshot
    assert result["content"] is not original["content"]
    # Without an id is fine too.
    expected: dict[str, Any] = {"toolUseId": "x", "status": status, "content": []}
    assert to_tool_result("x", {"status": status, "content": []}) == expected


@pytest.mark.parametrize(
    "lookalike",
    [
        {"status": "pending", "content": []},
        {"status": "success", "content": "text"},
        {"status": "success", "content": [1]},
        {"status": "success", "content": [], "extra": 1},
        {"status": "success"},
    ],
)
def test_dicts_that_are_not_tool_results_become_json(lookalike: dict[str, Any]) -> None:
    result = to_tool_result("id", lookalike)
    assert result["status"] == "success"
    assert json.loads(result["content"][0]["text"]) == lookalike


def test_content_block_lists_become_the_content() -> None:
    blocks = [{"text": "a"}, {"image": {"format": "png", "source": {"bytes": b"\x89"}}}]
    result = to_tool_result("id", blocks)
    assert result == {"toolUseId": "id", "status": "success", "content": blocks}
    assert result["content"] is not blocks


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ([], "[]"),
        ([{"text": 1}], '[{"text": 1}]'),
        ([{"text": "a", "json": 1}], '[{"text": "a", "json": 1}]'),
        ([{"unknown": "a"}], '[{"unknown": "a"}]'),
        ((1, 2), "[1, 2]"),
    ],
)
def test_lists_that_are_not_content_blocks_become_json(value: object, text: str) -> None:
    assert to_tool_result("id", value)["content"] == [{"text": text}]


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Opaque(), "<Opaque>"),
        (b"raw", "b'raw'"),
        (math.nan, "nan"),
        ({"k": {1, 2}}, "{'k': {1, 2}}"),
    ],
)
def test_non_serializable_values_use_repr(value: object, text: str) -> None:
    assert to_tool_result("id", value)["content"] == [{"text": text}]


def test_self_referencing_values_use_repr() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert to_tool_result("id", loop)["content"] == [{"text": "[[...]]"}]


def test_tool_use_id_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="tool_use_id"):
        to_tool_result(5, "x")  # type: ignore[arg-type]


def test_error_result() -> None:
    assert error_result("id", "it broke") == {
        "toolUseId": "id",
        "status": "error",
        "content": [{"text": "it broke"}],
    }
