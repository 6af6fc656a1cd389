"""Checkpoint: validation, dict round trip and schema-version refusal (SPEC §3.1)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.agent.checkpoint import (
    CHECKPOINT_POSITIONS,
    CHECKPOINT_SCHEMA_VERSION,
    Checkpoint,
)
from perdure.errors import CheckpointError, PerdureError


def test_schema_version_constant() -> None:
    assert CHECKPOINT_SCHEMA_VERSION == "1.0"
    assert sorted(CHECKPOINT_POSITIONS) == ["after_model", "after_tools"]


def test_defaults_and_to_dict() -> None:
    checkpoint = Checkpoint(position="after_model", cycle_index=3)
    assert checkpoint.schema_version == "1.0"
    assert checkpoint.to_dict() == {
        "position": "after_model",
        "cycle_index": 3,
        "schema_version": "1.0",
    }


def test_is_frozen() -> None:
    checkpoint = Checkpoint(position="after_tools", cycle_index=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        checkpoint.cycle_index = 1  # type: ignore[misc]


def test_error_is_a_perdure_error_with_code() -> None:
    with pytest.raises(CheckpointError) as info:
        Checkpoint(position="after_model", cycle_index=-1)
    assert isinstance(info.value, PerdureError)
    assert info.value.code == "checkpoint_error"


@given(
    position=st.sampled_from(["after_model", "after_tools"]),
    cycle_index=st.integers(min_value=0, max_value=2**63),
)
def test_round_trip_through_json(position: Any, cycle_index: int) -> None:
    checkpoint = Checkpoint(position=position, cycle_index=cycle_index)
    restored = Checkpoint.from_dict(json.loads(json.dumps(checkpoint.to_dict())))
    assert restored == checkpoint
    assert restored.position == position
    assert restored.cycle_index == cycle_index


@pytest.mark.parametrize("position", ["before_model", "", "AFTER_MODEL", None, 1])
def test_bad_position_is_refused(position: Any) -> None:
    with pytest.raises(CheckpointError, match="position"):
        Checkpoint(position=position, cycle_index=0)


@pytest.mark.parametrize("cycle_index", [-1, True, False, 1.0, "1", None])
def test_bad_cycle_index_is_refused(cycle_index: Any) -> None:
    with pytest.raises(CheckpointError, match="cycle_index"):
        Checkpoint(position="after_tools", cycle_index=cycle_index)


def test_other_schema_version_is_refused_at_construction() -> None:
    with pytest.raises(CheckpointError, match=r"expected '1\.0', found '2\.0'"):
        Checkpoint(position="after_tools", cycle_index=0, schema_version="2.0")


@pytest.mark.parametrize("data", [None, [], "after_model", 3, ("after_model", 0, "1.0")])
def test_from_dict_refuses_non_dict(data: Any) -> None:
    with pytest.raises(CheckpointError, match="must be a dict"):
        Checkpoint.from_dict(data)


@pytest.mark.parametrize("key", ["position", "cycle_index", "schema_version"])
def test_from_dict_names_missing_key(key: str) -> None:
    data = Checkpoint(position="after_model", cycle_index=1).to_dict()
    del data[key]
    with pytest.raises(CheckpointError, match=f"missing key.*{key}"):
        Checkpoint.from_dict(data)


def test_from_dict_names_unknown_key() -> None:
    data = {**Checkpoint(position="after_model", cycle_index=1).to_dict(), "extra": 1}
    with pytest.raises(CheckpointError, match=r"unknown key.*extra"):
        Checkpoint.from_dict(data)


def test_from_dict_names_expected_and_found_version() -> None:
    data = {"position": "after_model", "cycle_index": 0, "schema_version": "0.9"}
    with pytest.raises(CheckpointError) as info:
        Checkpoint.from_dict(data)
    assert "expected '1.0'" in str(info.value)
    assert "found '0.9'" in str(info.value)


def test_from_dict_version_is_checked_before_fields() -> None:
    # A checkpoint of another schema may have other positions: report the version.
    data = {"position": "mid_tool", "cycle_index": 0, "schema_version": "2.0"}
    with pytest.raises(CheckpointError, match="schema_version mismatch"):
        Checkpoint.from_dict(data)


def test_from_dict_refuses_non_string_version() -> None:
    data = {"position": "after_model", "cycle_index": 0, "schema_version": 1.0}
    with pytest.raises(CheckpointError, match="schema_version must be a string"):
        Checkpoint.from_dict(data)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("position", "after_everything"),
        ("position", 7),
        ("cycle_index", "3"),
        ("cycle_index", -2),
        ("cycle_index", True),
    ],
)
def test_from_dict_names_bad_field(field: str, value: Any) -> None:
    data = {**Checkpoint(position="after_model", cycle_index=1).to_dict(), field: value}
    with pytest.raises(CheckpointError, match=field):
        Checkpoint.from_dict(data)
