"""Bytes inside messages survive JSON (SPEC §2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.types import decode_bytes_values, encode_bytes_values

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
