"""Session id validation and generation (SPEC §7)."""

from __future__ import annotations

import uuid
from typing import Any

from perdure.types.json import encodes_as_utf8


def validate_session_id(session_id: Any, argument: str = "session_id") -> str:
    """Return ``session_id`` if it is a usable id.

    A session id is a non-empty string, not ``.`` or ``..``, without ``/``, ``\\`` or
    NUL (it names a directory in file stores), that UTF-8 can encode (no lone
    surrogate: it is a file name, a database key and a JSON string).

    Raises:
        TypeError: not a string.
        ValueError: empty, ``.``/``..``, containing a separator or NUL, or a lone
            surrogate.
    """
    if not isinstance(session_id, str):
        raise TypeError(f"{argument} must be a str, got {type(session_id).__name__}")
    if not session_id or session_id in (".", ".."):
        raise ValueError(f"{argument} {session_id!r} is invalid: it must be non-empty, not . or ..")
    for bad in ("/", "\\", "\x00"):
        if bad in session_id:
            raise ValueError(f"{argument} {session_id!r} is invalid: it contains {bad!r}")
    if not encodes_as_utf8(session_id):
        raise ValueError(
            f"{argument} {session_id!r} is invalid: it holds a lone surrogate, "
            "which UTF-8 cannot encode"
        )
    return session_id


def new_session_id() -> str:
    """A fresh random session id (a UUID4 string)."""
    return str(uuid.uuid4())
