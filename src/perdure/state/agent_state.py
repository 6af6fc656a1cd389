"""AgentState: the JSON key-value bag tools, hooks and sessions share (seed 000 §7)."""

from __future__ import annotations

import copy
import json
from typing import Any

from perdure.types.json import validate_storable


class AgentState:
    """A JSON-serializable key-value store with a version counter.

    Values are copied on the way in and out, so a caller can never change stored
    state behind the store's back. ``set`` checks at the point of writing that the
    value can be stored and read back equal, so a value that could not be persisted
    fails where it was written rather than later in a session store: NaN and
    infinity, nesting deeper than 200, dict keys that are not ``str`` (``{1: "a"}``
    would come back as ``{"1": "a"}``), ``bytes`` and other objects JSON does not know
    are refused. Tuples are stored as lists, at once: what ``get`` returns after a
    ``set`` is what it returns after the state was saved and restored. ``version``
    grows on every ``set``/``delete``; persistence compares versions to skip writes
    when nothing changed.
    """

    def __init__(self, initial: dict[str, Any] | None = None) -> None:
        if initial is None:
            initial = {}
        if not isinstance(initial, dict):
            raise TypeError(f"initial must be a dict or None, got {type(initial).__name__}")
        self._data: dict[str, Any] = {}
        self._version = 0
        for key, value in initial.items():
            self._data[key] = self._stored(key, value)

    @property
    def version(self) -> int:
        """A counter that grows on every ``set`` and ``delete``."""
        return self._version

    def get(self, key: str | None = None) -> Any:
        """Return a deep copy of ``key``'s value (``None`` if absent), or of everything."""
        if key is None:
            return copy.deepcopy(self._data)
        self._validate_key(key)
        return copy.deepcopy(self._data.get(key))

    def set(self, key: str, value: Any) -> None:
        """Store a copy of ``value`` under ``key`` (tuples become lists, as JSON has them).

        Raises:
            TypeError: ``key`` is not a string.
            ValueError: ``key`` is empty, or ``value`` cannot be stored and read back
                equal (the message names the key and the path inside the value).
        """
        self._data[key] = self._stored(key, value)
        self._version += 1

    def delete(self, key: str) -> None:
        """Remove ``key`` (absent keys are fine); the version grows either way."""
        self._validate_key(key)
        self._data.pop(key, None)
        self._version += 1

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __repr__(self) -> str:
        return f"AgentState({self._data!r}, version={self._version})"

    @staticmethod
    def _validate_key(key: object) -> None:
        if not isinstance(key, str):
            raise TypeError(f"state key must be a string, got {type(key).__name__}")
        if not key:
            raise ValueError("state key must be a non-empty string")

    @classmethod
    def _stored(cls, key: object, value: Any) -> Any:
        """A copy of ``value`` as the state holds it: what a save and restore gives back."""
        cls._validate_key(key)
        where = f"value for state key {key!r}"
        validate_storable(value, where)  # bounded: no RecursionError, names the path
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where} is not JSON-serializable: {exc}") from exc
        # A JSON round trip is the copy: tuples come back as lists, as after a restore.
        return json.loads(text)
