"""Snapshot model: field resolution, serialization round trips and validation (SPEC §3.2)."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.agent.snapshot import (
    SNAPSHOT_PRESETS,
    SNAPSHOT_SCHEMA_VERSION,
    Snapshot,
    SnapshotField,
    resolve_snapshot_fields,
)
from perdure.errors import PerdureError, SnapshotError

ALL_FIELDS = frozenset(SnapshotField)
SESSION_FIELDS = ALL_FIELDS - {SnapshotField.system_prompt}


def _messages() -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"text": "what is in this picture?"},
                {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n\x00\xff"}}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "zoom", "input": {"x": 1}}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "success",
                        "content": [{"text": "ok"}],
                    }
                }
            ],
        },
        {"role": "assistant", "content": [{"text": "a cat"}]},
    ]


def _full_snapshot() -> Snapshot:
    return Snapshot(
        data={
            "messages": _messages(),
            "state": {"counter": 2, "nested": {"a": [1, 2]}},
            "conversation_manager_state": {
                "__name__": "SlidingWindowConversationManager",
                "removed_message_count": 4,
            },
            "interrupt_state": {"interrupts": {}, "activated": False},
            "system_prompt": "be brief",
            "model_state": {},
        },
        app_data={"user": "u1", "tags": ["x"]},
    )


# --- resolve_snapshot_fields -------------------------------------------------------


def test_field_values() -> None:
    assert [member.value for member in SnapshotField] == [
        "messages",
        "state",
        "conversation_manager_state",
        "interrupt_state",
        "system_prompt",
        "model_state",
    ]
    assert SNAPSHOT_SCHEMA_VERSION == "1.0"


def test_session_preset_is_everything_but_system_prompt() -> None:
    assert SNAPSHOT_PRESETS["session"] == SESSION_FIELDS
    assert resolve_snapshot_fields(preset="session") == SESSION_FIELDS


def test_include_adds_to_preset() -> None:
    assert resolve_snapshot_fields(preset="session", include=["system_prompt"]) == ALL_FIELDS


def test_include_alone_accepts_members_and_strings() -> None:
    result = resolve_snapshot_fields(include=[SnapshotField.messages, "state"])
    assert result == {SnapshotField.messages, SnapshotField.state}


def test_bare_string_is_one_field() -> None:
    assert resolve_snapshot_fields(include="system_prompt") == {SnapshotField.system_prompt}


def test_exclude_removes_after_include() -> None:
    result = resolve_snapshot_fields(
        preset="session", include=["system_prompt"], exclude=["messages", SnapshotField.state]
    )
    assert result == ALL_FIELDS - {SnapshotField.messages, SnapshotField.state}


def test_exclude_wins_over_include() -> None:
    result = resolve_snapshot_fields(include=["messages", "state"], exclude=["state"])
    assert result == {SnapshotField.messages}


def test_result_is_frozenset_of_members() -> None:
    result = resolve_snapshot_fields(include=["messages"])
    assert isinstance(result, frozenset)
    assert all(isinstance(item, SnapshotField) for item in result)


def test_unknown_preset_is_named_with_valid_presets() -> None:
    with pytest.raises(SnapshotError, match=r"unknown snapshot preset 'full'.*session") as info:
        resolve_snapshot_fields(preset="full")
    assert isinstance(info.value, PerdureError)
    assert info.value.code == "snapshot_error"


@pytest.mark.parametrize("argument", ["include", "exclude"])
def test_unknown_field_is_named_with_valid_fields(argument: str) -> None:
    kwargs: dict[str, Any] = {"preset": "session", argument: ["messages", "history"]}
    with pytest.raises(SnapshotError, match=rf"'history' in {argument}.*model_state"):
        resolve_snapshot_fields(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"include": []},
        {"include": ["messages"], "exclude": ["messages"]},
        {"preset": "session", "exclude": [member.value for member in SESSION_FIELDS]},
    ],
)
def test_empty_result_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SnapshotError, match="no snapshot fields"):
        resolve_snapshot_fields(**kwargs)


# --- Snapshot serialization --------------------------------------------------------


def test_defaults() -> None:
    snapshot = Snapshot()
    assert snapshot.schema_version == "1.0"
    assert snapshot.scope == "agent"
    assert snapshot.data == {}
    assert snapshot.app_data == {}
    created = datetime.fromisoformat(snapshot.created_at)
    assert created.utcoffset() == timedelta(0)
    snapshot.validate()


def test_to_dict_is_json_compatible_and_encodes_bytes() -> None:
    snapshot = _full_snapshot()
    as_dict = snapshot.to_dict()
    assert set(as_dict) == {"schema_version", "scope", "created_at", "data", "app_data"}
    json.dumps(as_dict)  # would raise on raw bytes
    image = as_dict["data"]["messages"][0]["content"][1]["image"]
    assert image["source"]["bytes"]["__bytes_encoded__"] is True


def test_to_dict_does_not_share_or_mutate() -> None:
    snapshot = _full_snapshot()
    before = copy.deepcopy(snapshot)
    as_dict = snapshot.to_dict()
    as_dict["data"]["state"]["counter"] = 99
    as_dict["app_data"]["tags"].append("y")
    assert snapshot == before


def test_dict_round_trip_restores_bytes() -> None:
    snapshot = _full_snapshot()
    restored = Snapshot.from_dict(json.loads(json.dumps(snapshot.to_dict())))
    assert restored == snapshot
    image = restored.data["messages"][0]["content"][1]["image"]
    assert image["source"]["bytes"] == b"\x89PNG\r\n\x00\xff"
    restored.validate()


def test_json_round_trip() -> None:
    snapshot = _full_snapshot()
    text = snapshot.to_json()
    assert isinstance(text, str)
    restored = Snapshot.from_json(text)
    assert restored == snapshot
    assert restored.created_at == snapshot.created_at


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(
    state=st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=6),
    payload=st.binary(max_size=64),
    app_data=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
def test_round_trip_property(
    state: dict[str, Any], payload: bytes, app_data: dict[str, Any]
) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"image": {"format": "png", "source": {"bytes": payload}}}],
        }
    ]
    snapshot = Snapshot(data={"messages": messages, "state": state}, app_data=app_data)
    snapshot.validate()
    restored = Snapshot.from_json(snapshot.to_json())
    assert restored == snapshot
    assert restored.data["messages"][0]["content"][0]["image"]["source"]["bytes"] == payload


@pytest.mark.parametrize("data", [None, [], "snapshot", 1])
def test_from_dict_refuses_non_dict(data: Any) -> None:
    with pytest.raises(SnapshotError, match="must be a dict"):
        Snapshot.from_dict(data)


@pytest.mark.parametrize("key", ["schema_version", "scope", "created_at", "data", "app_data"])
def test_from_dict_names_missing_key(key: str) -> None:
    as_dict = _full_snapshot().to_dict()
    del as_dict[key]
    with pytest.raises(SnapshotError, match=f"missing key.*{key}"):
        Snapshot.from_dict(as_dict)


@pytest.mark.parametrize("key", ["data", "app_data"])
def test_from_dict_refuses_non_dict_payload(key: str) -> None:
    as_dict = {**_full_snapshot().to_dict(), key: ["not", "a", "dict"]}
    with pytest.raises(SnapshotError, match=f"{key} must be a dict"):
        Snapshot.from_dict(as_dict)


def test_from_dict_refuses_bad_base64() -> None:
    as_dict = _full_snapshot().to_dict()
    as_dict["data"]["messages"][0]["content"][1]["image"]["source"]["bytes"]["data"] = "***"
    with pytest.raises(SnapshotError, match="bytes"):
        Snapshot.from_dict(as_dict)


def test_from_json_refuses_bad_json() -> None:
    with pytest.raises(SnapshotError, match="not valid JSON"):
        Snapshot.from_json("{not json")


def test_to_json_refuses_unserializable_app_data() -> None:
    snapshot = Snapshot(data={"state": {}}, app_data={"when": object()})
    with pytest.raises(SnapshotError, match="JSON-serializable"):
        snapshot.to_json()


# --- validate ----------------------------------------------------------------------


def test_full_snapshot_is_valid() -> None:
    _full_snapshot().validate()


def test_system_prompt_may_be_none() -> None:
    Snapshot(data={"system_prompt": None}).validate()


def _with(**changes: Any) -> Snapshot:
    snapshot = _full_snapshot()
    for name, value in changes.items():
        setattr(snapshot, name, value)
    return snapshot


def _with_data(key: str, value: Any) -> Snapshot:
    snapshot = _full_snapshot()
    snapshot.data[key] = value
    return snapshot


@pytest.mark.parametrize(
    ("snapshot", "match"),
    [
        (_with(schema_version="2.0"), r"schema_version mismatch: expected '1\.0', found '2\.0'"),
        (_with(scope="session"), r"scope must be 'agent', found 'session'"),
        (_with(created_at="yesterday"), "created_at"),
        (_with(created_at=1234), "created_at"),
        (_with_data("history", []), r"unknown field 'history'.*messages"),
        (_with_data("messages", {"role": "user"}), "messages must be a list"),
        (_with_data("messages", ["hi"]), r"messages\[0\] must be a dict"),
        (
            _with_data("messages", [{"role": "system", "content": []}]),
            r"messages\[0\] role must be 'user' or 'assistant'",
        ),
        (_with_data("messages", [{"content": []}]), r"messages\[0\] role"),
        (
            _with_data("messages", [{"role": "user", "content": "hi"}]),
            r"messages\[0\] content must be a list",
        ),
        (
            _with_data("messages", [{"role": "user", "content": ["hi"]}]),
            r"messages\[0\] content\[0\] must be a dict",
        ),
        (_with_data("state", [1]), "field state must be a dict"),
        (_with_data("conversation_manager_state", None), "conversation_manager_state must be"),
        (_with_data("interrupt_state", "x"), "interrupt_state must be a dict"),
        (_with_data("model_state", 3), "model_state must be a dict"),
        (_with_data("system_prompt", ["x"]), "system_prompt must be a string or None"),
        (_with_data("state", {"f": object()}), "field state is not JSON-serializable"),
        (_with_data("state", {"f": float("nan")}), "field state is not JSON-serializable"),
        (_with(app_data=[1]), "app_data must be a dict"),
        (_with(app_data={"s": {1, 2}}), "app_data is not JSON-serializable"),
    ],
)
def test_validate_names_the_problem(snapshot: Snapshot, match: str) -> None:
    with pytest.raises(SnapshotError, match=match):
        snapshot.validate()


def test_from_dict_does_not_validate_version_but_validate_does() -> None:
    as_dict = {**_full_snapshot().to_dict(), "schema_version": "9.9"}
    loaded = Snapshot.from_dict(as_dict)
    assert loaded.schema_version == "9.9"
    with pytest.raises(SnapshotError, match=r"found '9\.9'"):
        loaded.validate()


def test_marker_shaped_content_round_trips_unchanged() -> None:
    shaped = {
        "bytes_like": {"__bytes_encoded__": True, "data": "aGk="},
        "ref": {"__attachment__": "ab" * 32, "size": 3},
        "escape_like": {"__perdure_dict__": [["a", 1]]},
    }
    message = {"role": "user", "content": [{"json": shaped}]}
    snapshot = Snapshot(data={"messages": [message], "state": {"shaped": shaped}})
    restored = Snapshot.from_json(snapshot.to_json())
    assert restored.data == snapshot.data
    restored.validate()


def test_nesting_too_deep_is_a_snapshot_error_not_a_recursion_error() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]
    snapshot = Snapshot(data={"messages": [{"role": "user", "content": [{"json": deep}]}]})
    with pytest.raises(SnapshotError):
        snapshot.validate()
    with pytest.raises(SnapshotError):
        snapshot.to_json()
    with pytest.raises(SnapshotError):
        Snapshot.from_json('{"data": ' + "[" * 5000 + "]" * 5000 + "}")


def test_validate_accepts_bytes_anywhere_in_a_field_but_not_in_app_data() -> None:
    image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}
    snapshot = Snapshot(
        data={
            "messages": [{"role": "user", "content": [image]}],
            "state": {"raw": bytearray(b"ab"), "view": memoryview(b"cd"), "pair": (b"e", 1)},
        }
    )
    snapshot.validate()  # stored as base64 markers: loadable
    with pytest.raises(SnapshotError, match="app_data is not JSON-serializable"):
        Snapshot(data={"state": {}}, app_data={"raw": b"x"}).validate()


def test_validate_names_the_one_field_that_is_not_json_among_good_ones() -> None:
    snapshot = _full_snapshot()
    snapshot.data["model_state"] = {"when": datetime(2026, 1, 1)}
    with pytest.raises(SnapshotError, match="field model_state is not JSON-serializable") as info:
        snapshot.validate()
    assert "datetime" in str(info.value)


def test_a_field_at_the_depth_limit_only_as_part_of_the_whole_is_still_a_snapshot_error() -> None:
    # Checked alone each field may pass, while all of them at once is one level deeper:
    # whichever way it fails, it is a SnapshotError, never a RecursionError.
    limit = sys.getrecursionlimit()
    for depth in range(limit - 60, limit + 5, 5):
        deep: Any = {}
        for _ in range(depth):
            deep = {"d": deep}
        snapshot = Snapshot(data={"state": deep})
        with contextlib.suppress(SnapshotError):
            snapshot.validate()
