"""Bytes inside messages survive JSON (SPEC §2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.types import decode_bytes_values, encode_bytes_values
from perdure.types.json import compact_json_bytes, encodes_as_utf8

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=15,
)


@given(values)
def test_round_trip_through_json(value: Any) -> None:
    encoded = encode_bytes_values(value)
    assert decode_bytes_values(json.loads(json.dumps(encoded))) == value


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
