"""AgentState (SPEC §3.3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.state import AgentState

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(key=st.text(min_size=1), value=json_values)
def test_set_get_round_trip(key: str, value: Any) -> None:
    state = AgentState()
    state.set(key, value)
    assert state.get(key) == value
    assert state.get() == {key: value}


def test_missing_key_is_none_and_get_all_is_a_copy() -> None:
    state = AgentState({"a": {"nested": [1]}})
    assert state.get("missing") is None
    everything = state.get()
    everything["a"]["nested"].append(2)
    assert state.get("a") == {"nested": [1]}


def test_values_are_deep_copied_in_and_out() -> None:
    value = {"list": [1, 2]}
    state = AgentState()
    state.set("k", value)
    value["list"].append(3)
    assert state.get("k") == {"list": [1, 2]}
    out = state.get("k")
    out["list"].append(4)
    assert state.get("k") == {"list": [1, 2]}


def test_version_grows_on_every_set_and_delete() -> None:
    state = AgentState()
    assert state.version == 0
    state.set("a", 1)
    state.set("a", 1)
    state.delete("a")
    state.delete("never-there")
    assert state.version == 4
    assert "a" not in state


@pytest.mark.parametrize("bad", [object(), {1, 2}, b"bytes", float("nan"), {"k": lambda: 1}])
def test_non_json_value_names_the_key(bad: Any) -> None:
    state = AgentState()
    with pytest.raises(ValueError, match="'the_key'"):
        state.set("the_key", bad)
    assert state.get() == {}
    assert state.version == 0


def test_bad_keys_and_initial() -> None:
    with pytest.raises(TypeError, match="key"):
        AgentState().set(1, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        AgentState().set("", "x")
    with pytest.raises(TypeError, match="initial"):
        AgentState([("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'x'"):
        AgentState({"x": object()})


def test_values_that_would_come_back_different_are_refused() -> None:
    state = AgentState()
    with pytest.raises(ValueError, match=r"'k'.*key 1 is a int"):
        state.set("k", {1: "a"})  # it would come back as {"1": "a"}
    with pytest.raises(ValueError, match=r"'k'\.x\[0\]: nan"):
        state.set("k", {"x": [float("nan")]})
    assert state.get() == {}
    assert state.version == 0


def test_deep_nesting_is_a_value_error_not_a_recursion_error() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = {"k": deep}
    state = AgentState()
    with pytest.raises(ValueError, match="nesting deeper than 200"):
        state.set("deep", deep)
    with pytest.raises(ValueError, match="nesting deeper than 200"):
        AgentState({"deep": deep})


def test_tuples_are_stored_as_lists_at_once() -> None:
    # What get() returns after set() is what it returns after a save and restore.
    state = AgentState({"t": (1, 2)})
    state.set("point", {"xy": (3, (4, 5))})
    assert state.get("t") == [1, 2]
    assert state.get("point") == {"xy": [3, [4, 5]]}
