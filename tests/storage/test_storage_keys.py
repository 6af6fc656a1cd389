"""The pure key rules shared by every backend."""

from __future__ import annotations

import pytest

from perdure.storage import validate_key, validate_prefix
from perdure.storage.keys import (
    check_data,
    check_expected,
    prefix_upper_bound,
    validate_list_args,
)


@pytest.mark.parametrize(
    "key", ["a", "a/b", "sessions/s-1/agents/x/latest", "é/日本", "a.b/.hidden", "..x", "x.."]
)
def test_valid_keys_come_back_unchanged(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "empty"),
        ("/a", "starts with '/'"),
        ("a/../b", "'..' segment"),
        ("a/./b", "'.' segment"),
        ("a//b", "empty segment"),
        ("a/", "empty segment"),
        ("a\\b", "backslash"),
        ("a\x00", "NUL"),
        ("\udc80", "UTF-8"),
    ],
)
def test_invalid_keys_say_why_and_name_the_key(key: str, why: str) -> None:
    with pytest.raises(ValueError, match="key") as info:
        validate_key(key)
    assert why in str(info.value)
    assert repr(key) in str(info.value)


def test_the_argument_name_is_used_in_messages() -> None:
    with pytest.raises(ValueError, match=r"^chunk_key "):
        validate_key("", "chunk_key")
    with pytest.raises(TypeError, match="key must be a str"):
        validate_key(3)


@pytest.mark.parametrize("prefix", ["", "a", "a/", "a/b", "a/.", "a/..", "sessions/x/"])
def test_prefixes_may_end_with_a_partial_or_empty_segment(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["/", "a//", "../a", "a/./b", "a\\", "\x00"])
def test_bad_prefixes(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        validate_prefix(prefix)


def test_list_arguments() -> None:
    validate_list_args("", None, None)
    validate_list_args("a/", 0, "a/b")
    with pytest.raises(ValueError, match="limit"):
        validate_list_args("", -1, None)
    with pytest.raises(TypeError, match="limit"):
        validate_list_args("", 1.5, None)
    with pytest.raises(ValueError, match="start_after"):
        validate_list_args("", None, "\udc80")


def test_check_data() -> None:
    assert check_data(b"x") == b"x"
    assert check_data(bytearray(b"y")) == b"y"
    with pytest.raises(TypeError, match="data must be bytes, got str"):
        check_data("x")


def test_upper_bound_of_prefixes() -> None:
    assert prefix_upper_bound("") is None
    assert prefix_upper_bound("ab") == "ac"
    assert prefix_upper_bound("a\ud7ff") == "a\ue000"
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\U0010ffff") is None


def test_an_expected_version_is_a_str_or_none() -> None:
    assert check_expected(None) is None
    assert check_expected("7") == "7"
    for bad in (7, b"7", 7.0):
        with pytest.raises(TypeError, match="expected"):
            check_expected(bad)
