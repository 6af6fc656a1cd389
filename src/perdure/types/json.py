"""JSON helpers: bytes inside messages survive a round trip through JSON (SPEC §2)."""

from __future__ import annotations

import base64
import json
from typing import Any

BYTES_MARKER = "__bytes_encoded__"


def encode_bytes_values(obj: Any) -> Any:
    """Return a copy of ``obj`` where every ``bytes`` value is a JSON-safe marker dict.

    ``b"..."`` becomes ``{"__bytes_encoded__": True, "data": "<base64>"}``; dicts, lists
    and tuples are walked recursively (tuples come back as lists, as JSON would).
    """
    # Tuples of types, not ``bytes | bytearray``: a union is built anew on every
    # call, and this runs for every value of every stored message.
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {BYTES_MARKER: True, "data": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, dict):
        return {key: encode_bytes_values(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_bytes_values(value) for value in obj]
    return obj


def decode_bytes_values(obj: Any) -> Any:
    """Inverse of :func:`encode_bytes_values`: marker dicts become ``bytes`` again.

    Raises:
        ValueError: a marker dict whose ``data`` is not valid base64.
    """
    if isinstance(obj, dict):
        if obj.get(BYTES_MARKER) is True and set(obj) == {BYTES_MARKER, "data"}:
            data = obj["data"]
            if not isinstance(data, str):
                raise ValueError(f"{BYTES_MARKER} value has non-string data: {type(data)!r}")
            try:
                return base64.b64decode(data.encode("ascii"), validate=True)
            except (ValueError, UnicodeEncodeError) as exc:
                raise ValueError(f"{BYTES_MARKER} value is not valid base64: {exc}") from exc
        return {key: decode_bytes_values(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [decode_bytes_values(value) for value in obj]
    return obj


def encodes_as_utf8(text: str) -> bool:
    """False when ``text`` holds a lone surrogate, which UTF-8 cannot carry."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def compact_json_bytes(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON of ``value`` as UTF-8 bytes (NaN and infinity refused).

    Text is kept as UTF-8, except when ``value`` holds a lone surrogate (a ``str``
    decoded with ``surrogateescape``, or half of a broken UTF-16 pair), which UTF-8
    cannot carry: then every non-ASCII character is ``\\u``-escaped instead, and the
    surrogate still round-trips through ``json.loads``.

    Raises:
        TypeError: a value JSON does not know.
        ValueError: NaN or infinity, or a cycle.
    """
    text = json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, sort_keys=sort_keys
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(
            value, ensure_ascii=True, separators=(",", ":"), allow_nan=False, sort_keys=sort_keys
        ).encode("ascii")
