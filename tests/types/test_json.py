"""Bytes inside messages survive JSON (SPEC §2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.types import decode_bytes_values, encode_bytes_values, validate_storable
from perdure.types.json import MAX_NESTING, compact_json_bytes, encodes_as_utf8

# Keys and values shaped like perdure's own markers, so round trips meet them often.
MARKER_KEYS = st.sampled_from(["__bytes_encoded__", "__attachment__", "__perdure_dict__", "data"])
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.binary() | st.just("aGk="),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text() | MARKER_KEYS, children, max_size=4)
    ),
    max_leaves=15,
)


@given(values)
def test_round_trip_through_json(value: Any) -> None:
    encoded = encode_bytes_values(value)
    assert decode_bytes_values(json.loads(json.dumps(encoded))) == value


MARKER_SHAPED: list[Any] = [
    {"__bytes_encoded__": True, "data": "aGk="},
    {"__attachment__": "ab" * 32, "size": 3},
    {"__perdure_dict__": [["__bytes_encoded__", True], ["data", "aGk="]]},
    {"__perdure_dict__": {"x": 1}},
    {"outer": [{"__bytes_encoded__": True, "data": b"raw bytes"}]},
]


@pytest.mark.parametrize("value", MARKER_SHAPED)
def test_marker_shaped_content_round_trips_unchanged(value: Any) -> None:
    # A user's dict shaped like a marker is escaped on write, never read as a marker.
    stored = json.loads(json.dumps(encode_bytes_values(value)))
    assert decode_bytes_values(stored) == value
    assert decode_bytes_values(stored, lambda digest, size: b"loaded") == value


def test_data_written_before_escaping_reads_the_same() -> None:
    # Marker dicts in data written by an earlier perdure were real markers.
    old = {"image": {"__bytes_encoded__": True, "data": "aGk="}, "plain": {"a": [1, "x"]}}
    assert decode_bytes_values(old) == {"image": b"hi", "plain": {"a": [1, "x"]}}
    assert encode_bytes_values({"image": b"hi"}) == {
        "image": {"__bytes_encoded__": True, "data": "aGk="}
    }


def test_a_malformed_escape_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="__perdure_dict__"):
        decode_bytes_values({"__perdure_dict__": [["only a key"]]})


def test_marker_shape() -> None:
    assert encode_bytes_values({"b": b"\x00\x01"}) == {
        "b": {"__bytes_encoded__": True, "data": "AAE="}
    }
    assert encode_bytes_values((b"a",)) == [{"__bytes_encoded__": True, "data": "YQ=="}]


def test_bad_base64_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="base64"):
        decode_bytes_values({"__bytes_encoded__": True, "data": "***"})
    with pytest.raises(ValueError, match="non-string"):
        decode_bytes_values({"__bytes_encoded__": True, "data": 5})


def test_lookalike_dicts_are_left_alone() -> None:
    other = {"__bytes_encoded__": True, "data": "YQ==", "extra": 1}
    assert decode_bytes_values(other) == other


def test_compact_json_bytes_keeps_utf8_and_escapes_only_when_it_must() -> None:
    assert compact_json_bytes({"b": "é", "a": [1, None]}) == '{"b":"é","a":[1,null]}'.encode()
    assert compact_json_bytes({"b": 1, "a": 2}, sort_keys=True) == b'{"a":2,"b":1}'
    odd = {"name": "x\udc80y é"}
    data = compact_json_bytes(odd)
    assert data == b'{"name":"x\\udc80y \\u00e9"}'
    assert json.loads(data) == odd
    with pytest.raises(ValueError, match="JSON compliant"):
        compact_json_bytes({"x": float("nan")})


# Any text, lone surrogates included (characters() leaves them out).
ANY_CHAR = st.characters() | st.sampled_from(["\ud800", "\udbff", "\udc80", "\udfff"])


@given(st.text(ANY_CHAR))
def test_compact_json_bytes_round_trips_any_text(value: str) -> None:
    assert json.loads(compact_json_bytes({"v": value})) == {"v": value}


def test_encodes_as_utf8_refuses_only_lone_surrogates() -> None:
    assert encodes_as_utf8("plain")
    assert encodes_as_utf8("é 中文 🎉")
    assert not encodes_as_utf8("x\udc80")
    assert not encodes_as_utf8("\ud800")


@pytest.mark.parametrize(
    ("value", "path", "why"),
    [
        ({"x": float("nan")}, "v.x", "NaN"),
        ({"a": [1, {"b": float("inf")}]}, "v.a[1].b", "inf"),
        ({"a": {1: "one"}}, "v.a", "key 1 is a int"),
        ({"a": {"odd key": object()}}, "v.a['odd key']", "object is not JSON-serializable"),
        ([-float("inf")], "v[0]", "inf"),
    ],
)
def test_unstorable_values_are_refused_naming_their_path(value: Any, path: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_storable(value, "v")
    assert str(info.value).startswith(f"{path}: ")
    assert why in str(info.value)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


def test_nesting_is_limited_to_200_and_never_a_recursion_error() -> None:
    validate_storable(nested(MAX_NESTING), "v")
    with pytest.raises(ValueError, match="nesting deeper than 200"):
        validate_storable(nested(MAX_NESTING + 1), "v")
    with pytest.raises(ValueError, match="nesting deeper than 200"):
        validate_storable(nested(5000), "v")


def test_storable_values_pass() -> None:
    validate_storable(
        {"s": "x\udc80", "b": b"\x00", "n": None, "t": (1, 2.5), "i": 10**30, "f": -0.0}, "v"
    )
