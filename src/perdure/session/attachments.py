"""Large binary values in messages, stored once by sha256 beside the journal.

The journal must stay a readable, compact log; an image of 2 MB inlined as base64
in every message that carries it would not. Values of ``bytes`` at or above a
threshold are replaced in the stored message by ``{"__attachment__": "<sha256>",
"size": n}`` and written once to ``attachments/<sha256>``; reads load and verify
them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from perdure.types import encode_bytes_values

ATTACHMENT_MARKER = "__attachment__"


def extract_attachments(obj: Any, threshold: int, found: dict[str, bytes]) -> Any:
    """Return ``obj`` JSON-ready: big bytes become refs (into ``found``), small ones base64."""
    if isinstance(
        obj, (bytes, bytearray, memoryview)
    ):  # tuples: a `|` union is rebuilt on every call
        data = bytes(obj)
        if len(data) >= threshold:
            digest = hashlib.sha256(data).hexdigest()
            found[digest] = data
            return {ATTACHMENT_MARKER: digest, "size": len(data)}
        return encode_bytes_values(data)
    if isinstance(obj, dict):
        return {key: extract_attachments(value, threshold, found) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [extract_attachments(value, threshold, found) for value in obj]
    return obj


def resolve_attachments(obj: Any, load: Callable[[str, int], bytes]) -> Any:
    """Replace attachment refs in ``obj`` by ``load(digest, size)``; other values untouched."""
    if isinstance(obj, dict):
        if set(obj) == {ATTACHMENT_MARKER, "size"} and isinstance(obj[ATTACHMENT_MARKER], str):
            return load(obj[ATTACHMENT_MARKER], int(obj["size"]))
        return {key: resolve_attachments(value, load) for key, value in obj.items()}
    if isinstance(obj, list):
        return [resolve_attachments(value, load) for value in obj]
    return obj


def is_valid_digest(digest: str) -> bool:
    """True for a lowercase 64-hex-digit sha256 (so it is safe as a file name)."""
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
