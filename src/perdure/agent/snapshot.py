"""Snapshots: a versioned, JSON-compatible still of chosen parts of an agent (seed 000 §6.3).

Unlike a :class:`~perdure.agent.checkpoint.Checkpoint` (a bookmark with no state), a
:class:`Snapshot` carries the state itself: deep copies of the fields the caller chose.
Fields are chosen with :func:`resolve_snapshot_fields` — preset, then ``include``, then
``exclude``::

    preset="session" ─▶ {messages, state, conversation_manager_state,
                         interrupt_state, model_state}
       ∪ include      (fields named in addition)
       − exclude      (fields named to leave out)
       empty? ─▶ SnapshotError

This module is pure: it knows nothing about the agent. ``Agent.take_snapshot()`` fills
:attr:`Snapshot.data`; ``Agent.load_snapshot()`` calls :meth:`Snapshot.validate` first
and restores only the fields present.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from perdure.errors import SnapshotError
from perdure.types import decode_bytes_values, encode_bytes_values

__all__ = [
    "SNAPSHOT_PRESETS",
    "SNAPSHOT_SCHEMA_VERSION",
    "SNAPSHOT_SCOPE",
    "Snapshot",
    "SnapshotField",
    "resolve_snapshot_fields",
]

SNAPSHOT_SCHEMA_VERSION = "1.0"
"""The only schema version :meth:`Snapshot.validate` accepts."""

SNAPSHOT_SCOPE = "agent"
"""The only scope :meth:`Snapshot.validate` accepts."""


class SnapshotField(StrEnum):
    """A part of an agent a snapshot can hold; the value is the key in :attr:`Snapshot.data`."""

    messages = "messages"
    state = "state"
    conversation_manager_state = "conversation_manager_state"
    interrupt_state = "interrupt_state"
    system_prompt = "system_prompt"
    model_state = "model_state"


SNAPSHOT_PRESETS: Mapping[str, frozenset[SnapshotField]] = MappingProxyType(
    {"session": frozenset(SnapshotField) - {SnapshotField.system_prompt}}
)
"""Named field sets. ``"session"`` is every field but ``system_prompt``."""

_FIELD_NAMES = ", ".join(member.value for member in SnapshotField)
_DICT_FIELDS = frozenset(
    {
        SnapshotField.state,
        SnapshotField.conversation_manager_state,
        SnapshotField.interrupt_state,
        SnapshotField.model_state,
    }
)
_KEYS = ("schema_version", "scope", "created_at", "data", "app_data")
_BY_VALUE: Mapping[str, SnapshotField] = MappingProxyType({f.value: f for f in SnapshotField})


def _bytes_are_json(value: object) -> str:
    """``bytes`` pass a check (stored, they become base64 markers); nothing else unknown does."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ""
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# Made once: json.dumps with any option builds a new encoder at every call, and a
# snapshot is checked at every save. Neither keeps state between calls.
_STRICT = json.JSONEncoder(allow_nan=False)
_STRICT_WITH_BYTES = json.JSONEncoder(allow_nan=False, default=_bytes_are_json)


def resolve_snapshot_fields(
    preset: str | None = None,
    include: Iterable[str | SnapshotField] | str | None = None,
    exclude: Iterable[str | SnapshotField] | str | None = None,
) -> frozenset[SnapshotField]:
    """Return the fields of ``preset`` ∪ ``include`` − ``exclude``.

    ``include`` and ``exclude`` hold field names or :class:`SnapshotField` members; a
    single name may be passed bare (``include="system_prompt"``).

    Raises:
        SnapshotError: ``preset`` is not a known preset, a name in ``include`` or
            ``exclude`` is not a field (the message lists the valid names), or the
            result is empty.
    """
    fields: set[SnapshotField] = set()
    if preset is not None:
        try:
            fields |= SNAPSHOT_PRESETS[preset]
        except (KeyError, TypeError):
            raise SnapshotError(
                f"unknown snapshot preset {preset!r}; valid presets: "
                f"{', '.join(sorted(SNAPSHOT_PRESETS))}"
            ) from None
    fields |= _parse_fields(include, "include")
    fields -= _parse_fields(exclude, "exclude")
    if not fields:
        raise SnapshotError(
            "no snapshot fields selected: give a preset or include at least one field "
            f"(fields: {_FIELD_NAMES})"
        )
    return frozenset(fields)


def _parse_fields(
    names: Iterable[str | SnapshotField] | str | None, argument: str
) -> set[SnapshotField]:
    if names is None:
        return set()
    if isinstance(names, str):
        names = [names]
    result: set[SnapshotField] = set()
    for name in names:
        try:
            result.add(SnapshotField(name))
        except ValueError:
            raise SnapshotError(
                f"unknown snapshot field {name!r} in {argument}; valid fields: {_FIELD_NAMES}"
            ) from None
    return result


def _utc_now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(kw_only=True)
class Snapshot:
    """A still of an agent: the chosen fields in :attr:`data`, plus the caller's ``app_data``.

    Attributes:
        schema_version: Always :data:`SNAPSHOT_SCHEMA_VERSION` when written by perdure.
        scope: Always ``"agent"``.
        created_at: When the snapshot was taken, an ISO-8601 UTC timestamp.
        data: Keys are :class:`SnapshotField` values; only the chosen fields are present.
            Messages may contain ``bytes`` (images, documents).
        app_data: Anything JSON-serializable the application wants to keep alongside.
    """

    schema_version: str = SNAPSHOT_SCHEMA_VERSION
    scope: str = SNAPSHOT_SCOPE
    created_at: str = field(default_factory=_utc_now_iso)
    data: dict[str, Any] = field(default_factory=dict)
    app_data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible deep copy; ``bytes`` become base64 marker dicts."""
        return {
            "schema_version": self.schema_version,
            "scope": self.scope,
            "created_at": self.created_at,
            "data": encode_bytes_values(self.data),
            "app_data": copy.deepcopy(self.app_data),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Snapshot:
        """Rebuild a snapshot from :meth:`to_dict` output, decoding ``bytes`` again.

        Only the outer structure is checked here; call :meth:`validate` (as
        ``Agent.load_snapshot`` does) to check the version, scope and fields.

        Raises:
            SnapshotError: ``data`` is not a dict, lacks a key, ``data``/``app_data`` is
                not a dict, or an encoded ``bytes`` value is not valid base64.
        """
        if not isinstance(data, dict):
            raise SnapshotError(f"snapshot must be a dict, got {type(data).__name__}")
        missing = [key for key in _KEYS if key not in data]
        if missing:
            raise SnapshotError(f"snapshot is missing key(s): {', '.join(missing)}")
        for key in ("data", "app_data"):
            if not isinstance(data[key], dict):
                raise SnapshotError(
                    f"snapshot {key} must be a dict, got {type(data[key]).__name__}"
                )
        try:
            decoded = decode_bytes_values(data["data"])
        except (ValueError, RecursionError) as exc:
            raise SnapshotError(f"snapshot data holds a malformed bytes value: {exc}") from None
        return cls(
            schema_version=data["schema_version"],
            scope=data["scope"],
            created_at=data["created_at"],
            data=decoded,
            app_data=copy.deepcopy(data["app_data"]),
        )

    def to_json(self) -> str:
        """Serialize :meth:`to_dict` to a JSON string.

        Raises:
            SnapshotError: some value is not JSON-serializable.
        """
        try:
            return json.dumps(self.to_dict(), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise SnapshotError(f"snapshot is not JSON-serializable: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Snapshot:
        """Parse :meth:`to_json` output (see :meth:`from_dict`).

        Raises:
            SnapshotError: ``text`` is not valid JSON, or :meth:`from_dict` refuses it.
        """
        try:
            parsed = json.loads(text)
        except (TypeError, ValueError, RecursionError) as exc:
            raise SnapshotError(f"snapshot is not valid JSON: {exc}") from None
        return cls.from_dict(parsed)

    def validate(self) -> None:
        """Check that this snapshot can be loaded into an agent; return ``None`` if so.

        Raises:
            SnapshotError: the schema version is not ``"1.0"``; the scope is not
                ``"agent"``; ``created_at`` is not an ISO-8601 string; a key of
                :attr:`data` is not a :class:`SnapshotField` value; a field has the
                wrong shape (``messages``: a list of dicts with role ``user`` or
                ``assistant`` and a list ``content`` of dict blocks; the ``*_state``
                fields: dicts; ``system_prompt``: a string or ``None``) or is not
                JSON-serializable; ``app_data`` is not a JSON-serializable dict. The
                message names the offending field or key.
        """
        if self.schema_version != SNAPSHOT_SCHEMA_VERSION:
            raise SnapshotError(
                f"snapshot schema_version mismatch: expected {SNAPSHOT_SCHEMA_VERSION!r}, "
                f"found {self.schema_version!r}"
            )
        if self.scope != SNAPSHOT_SCOPE:
            raise SnapshotError(f"snapshot scope must be {SNAPSHOT_SCOPE!r}, found {self.scope!r}")
        _check_created_at(self.created_at)
        if not isinstance(self.data, dict):
            raise SnapshotError(f"snapshot data must be a dict, got {type(self.data).__name__}")
        for key, value in self.data.items():
            name = _BY_VALUE.get(key) if isinstance(key, str) else None
            if name is None:
                raise SnapshotError(
                    f"snapshot data has unknown field {key!r}; valid fields: {_FIELD_NAMES}"
                )
            _check_shape(name, value)
        try:
            _STRICT_WITH_BYTES.encode(self.data)  # all fields at once: the usual case
        except (TypeError, ValueError, RecursionError) as exc:
            for key, value in self.data.items():  # name the field that is not JSON
                _check_json(f"field {_BY_VALUE[key]}", value, with_bytes=True)
            raise SnapshotError(f"snapshot data is not JSON-serializable: {exc}") from None
        if not isinstance(self.app_data, dict):
            raise SnapshotError(
                f"snapshot app_data must be a dict, got {type(self.app_data).__name__}"
            )
        _check_json("app_data", self.app_data)


def _check_created_at(created_at: object) -> None:
    if not isinstance(created_at, str):
        raise SnapshotError(
            f"snapshot created_at must be an ISO-8601 string, got {type(created_at).__name__}"
        )
    try:
        datetime.fromisoformat(created_at)
    except ValueError:
        raise SnapshotError(
            f"snapshot created_at is not an ISO-8601 timestamp: {created_at!r}"
        ) from None


def _check_shape(name: SnapshotField, value: Any) -> None:
    if name is SnapshotField.messages:
        _check_messages(value)
    elif name is SnapshotField.system_prompt:
        if value is not None and not isinstance(value, str):
            raise SnapshotError(
                f"snapshot field system_prompt must be a string or None, got {type(value).__name__}"
            )
    elif name in _DICT_FIELDS and not isinstance(value, dict):
        raise SnapshotError(f"snapshot field {name} must be a dict, got {type(value).__name__}")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise SnapshotError(
            f"snapshot field messages must be a list, got {type(messages).__name__}"
        )
    for index, message in enumerate(messages):
        where = f"snapshot field messages[{index}]"
        if not isinstance(message, dict):
            raise SnapshotError(f"{where} must be a dict, got {type(message).__name__}")
        if message.get("role") not in ("user", "assistant"):
            raise SnapshotError(
                f"{where} role must be 'user' or 'assistant', got {message.get('role')!r}"
            )
        content = message.get("content")
        if not isinstance(content, list):
            raise SnapshotError(f"{where} content must be a list, got {type(content).__name__}")
        for block_index, block in enumerate(content):
            if not isinstance(block, dict):
                raise SnapshotError(
                    f"{where} content[{block_index}] must be a dict, got {type(block).__name__}"
                )


def _check_json(what: str, value: Any, *, with_bytes: bool = False) -> None:
    try:
        (_STRICT_WITH_BYTES if with_bytes else _STRICT).encode(value)
    except (TypeError, ValueError, RecursionError) as exc:  # too deep: never a RecursionError
        raise SnapshotError(f"snapshot {what} is not JSON-serializable: {exc}") from None
