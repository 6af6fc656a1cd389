"""Large binary values in messages, stored once by sha256 beside the journal.

The journal must stay a readable, compact log; an image of 2 MB inlined as base64
in every message that carries it would not. Values of ``bytes`` at or above a
threshold are replaced in the stored message by ``{"__attachment__": "<sha256>",
"size": n}`` and written once to ``attachments/<sha256>``; reads load and verify
them. The rest of the stored form (small ``bytes``, escaped marker-shaped dicts) is
:func:`~perdure.types.encode_bytes_values`'s: one rule for every encoder.
"""

from __future__ import annotations

import hashlib
from typing import Any

from perdure.types.json import (
    ATTACHMENT_MARKER,
    LoadAttachment,
    bytes_marker,
    decode_bytes_values,
    encode_bytes_values,
)

__all__ = ["ATTACHMENT_MARKER", "decode_with_attachments", "extract_attachments", "is_valid_digest"]


def extract_attachments(obj: Any, threshold: int, found: dict[str, bytes]) -> Any:
    """Return ``obj`` in the stored form: big bytes become refs (into ``found``), small base64."""

    def on_bytes(data: bytes) -> Any:
        if len(data) >= threshold:
            digest = hashlib.sha256(data).hexdigest()
            found[digest] = data
            return {ATTACHMENT_MARKER: digest, "size": len(data)}
        return bytes_marker(data)

    return encode_bytes_values(obj, on_bytes)


def decode_with_attachments(obj: Any, load: LoadAttachment) -> Any:
    """Inverse of :func:`extract_attachments`: refs become ``load(sha256, size)``.

    Bytes markers and escapes are decoded in the same walk: decode a value once.

    Raises:
        ValueError: a malformed marker or escape (and whatever ``load`` raises).
    """
    return decode_bytes_values(obj, load)


def is_valid_digest(digest: str) -> bool:
    """True for a lowercase 64-hex-digit sha256 (so it is safe as a file name)."""
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
