"""Session id validation and generation (SPEC §7)."""

from __future__ import annotations

import uuid
from typing import Any

from perdure.types.json import encodes_as_utf8

MAX_SESSION_ID_BYTES = 200
"""The longest session id, in UTF-8 bytes (SPEC §7).

A file store names a directory and a lock file (``<id>.lock``) after the id, and most
file systems refuse names over 255 bytes; 200 leaves room for the suffixes and holds
every UUID, ULID or readable name with ease.
"""


def validate_session_id(session_id: Any, argument: str = "session_id") -> str:
    """Return ``session_id`` if it is a usable id.

    A session id is a non-empty string of at most :data:`MAX_SESSION_ID_BYTES` UTF-8
    bytes, without ``/``, ``\\`` or NUL (it names a directory in file stores), that
    UTF-8 can encode (no lone surrogate: it is a file name, a database key and a JSON
    string), and that does not start with ``.``: such names are hidden files and
    perdure's own (``.`` and ``..``, the trash, the legacy ``.deleted-…-<hex>``
    directories of deleted sessions), which no listing would ever show. The same
    rule holds in every store, so a session can move between them.

    Raises:
        TypeError: not a string.
        ValueError: empty, too long, starting with ``.``, containing a separator or
            NUL, or a lone surrogate (the message names the problem).
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
    size = len(session_id.encode("utf-8"))
    if size > MAX_SESSION_ID_BYTES:
        raise ValueError(
            f"{argument} {session_id[:40]!r}… is invalid: it is {size} UTF-8 bytes long, "
            f"more than the {MAX_SESSION_ID_BYTES} allowed"
        )
    if session_id.startswith("."):
        raise ValueError(
            f"{argument} {session_id!r} is invalid: ids starting with '.' are reserved "
            "(hidden files and perdure's own directories)"
        )
    return session_id


def new_session_id() -> str:
    """A fresh random session id (a UUID4 string)."""
    return str(uuid.uuid4())
