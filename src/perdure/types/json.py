"""JSON helpers: values inside messages and state survive a round trip through JSON (SPEC §2).

The stored form of a value, one rule for every store, export, checkpoint, snapshot
and outbox:

- ``bytes`` become ``{"__bytes_encoded__": true, "data": "<base64>"}`` (or, in the
  file store and exports, an attachment reference ``{"__attachment__": "<sha256>",
  "size": n}``);
- a dict of the caller's that holds one of perdure's marker keys
  (:data:`RESERVED_KEYS`) is escaped as ``{"__perdure_dict__": [[key, value], …]}``,
  so content shaped like a marker — a tool input ``{"__attachment__": …}``, a state
  value ``{"__bytes_encoded__": true, …}`` — is never read back as one. The escape
  key is reserved too, so an escaped-looking dict is escaped again;
- tuples become lists, as JSON would.

Data written before escaping existed reads the same: it holds no escape key, and the
marker dicts in it were written by perdure.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

BYTES_MARKER = "__bytes_encoded__"
ATTACHMENT_MARKER = "__attachment__"
ESCAPE_MARKER = "__perdure_dict__"
RESERVED_KEYS = frozenset({BYTES_MARKER, ATTACHMENT_MARKER, ESCAPE_MARKER})
"""Keys that mark perdure's own encodings; a user dict holding one is escaped."""

MAX_NESTING = 200
"""Most containers (dicts and lists) a stored value may nest, itself included (SPEC §7.1)."""

OnBytes = Callable[[bytes], Any]
LoadAttachment = Callable[[str, int], bytes]


def bytes_marker(data: bytes) -> dict[str, Any]:
    """The stored form of ``data``: ``{"__bytes_encoded__": True, "data": "<base64>"}``."""
    return {BYTES_MARKER: True, "data": base64.b64encode(data).decode("ascii")}


def encode_bytes_values(obj: Any, on_bytes: OnBytes = bytes_marker) -> Any:
    """Return a JSON-ready copy of ``obj`` in the stored form (see the module docstring).

    Every ``bytes`` value becomes ``on_bytes(value)`` (by default the base64 marker);
    dicts holding a :data:`RESERVED_KEYS` key are escaped; tuples come back as lists.
    :func:`decode_bytes_values` is the inverse.
    """
    # Tuples of types, not ``bytes | bytearray``: a union is built anew on every
    # call, and this runs for every value of every stored message.
    if isinstance(obj, dict):
        if BYTES_MARKER in obj or ATTACHMENT_MARKER in obj or ESCAPE_MARKER in obj:
            return {
                ESCAPE_MARKER: [
                    [key, encode_bytes_values(value, on_bytes)] for key, value in obj.items()
                ]
            }
        return {key: encode_bytes_values(value, on_bytes) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_bytes_values(value, on_bytes) for value in obj]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return on_bytes(bytes(obj))
    return obj


def decode_bytes_values(obj: Any, load_attachment: LoadAttachment | None = None) -> Any:
    """Inverse of :func:`encode_bytes_values`: markers become ``bytes``, escapes dicts.

    With ``load_attachment``, attachment references become
    ``load_attachment(sha256, size)``; without, they are left as they are. Decode a
    value once: decoding twice would read an unescaped dict as a marker.

    Raises:
        ValueError: a marker dict whose ``data`` is not valid base64, or a malformed
            escape.
    """
    if isinstance(obj, dict):
        size = len(obj)
        if size == 1 and ESCAPE_MARKER in obj:
            pairs = obj[ESCAPE_MARKER]
            if not isinstance(pairs, list):
                raise ValueError(f"{ESCAPE_MARKER} value is not a list of [key, value] pairs")
            out: dict[Any, Any] = {}
            for pair in pairs:
                if (
                    not isinstance(pair, list)
                    or len(pair) != 2
                    or isinstance(pair[0], (list, dict))
                ):
                    raise ValueError(f"{ESCAPE_MARKER} holds a malformed pair: {pair!r:.80}")
                out[pair[0]] = decode_bytes_values(pair[1], load_attachment)
            return out
        if size == 2:
            if obj.get(BYTES_MARKER) is True and "data" in obj:
                data = obj["data"]
                if not isinstance(data, str):
                    raise ValueError(f"{BYTES_MARKER} value has non-string data: {type(data)!r}")
                try:
                    return base64.b64decode(data.encode("ascii"), validate=True)
                except (ValueError, UnicodeEncodeError) as exc:
                    raise ValueError(f"{BYTES_MARKER} value is not valid base64: {exc}") from exc
            if (
                load_attachment is not None
                and "size" in obj
                and isinstance(obj.get(ATTACHMENT_MARKER), str)
            ):
                return load_attachment(obj[ATTACHMENT_MARKER], int(obj["size"]))
        return {key: decode_bytes_values(value, load_attachment) for key, value in obj.items()}
    if isinstance(obj, list):
        return [decode_bytes_values(value, load_attachment) for value in obj]
    return obj


_BYTES_MARKER_UTF8 = BYTES_MARKER.encode("ascii")
_ESCAPE_MARKER_UTF8 = ESCAPE_MARKER.encode("ascii")


def may_hold_encoded(text: str | bytes) -> bool:
    """False when stored JSON ``text`` surely holds no ``bytes`` marker or escape.

    (Attachment references are only read by the file store and exports, which
    decode whenever their text holds ``"__``.) A search of the text spares the walk
    of :func:`decode_bytes_values` for the many values that hold neither.
    """
    if isinstance(text, str):
        return BYTES_MARKER in text or ESCAPE_MARKER in text
    return _BYTES_MARKER_UTF8 in text or _ESCAPE_MARKER_UTF8 in text


# ------------------------------------------------------------------ storable values

_LEAVES = frozenset({str, int, bool, type(None), bytes})


class _Unstorable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str | int] = []  # innermost first


def validate_storable(value: Any, where: str, *, max_depth: int = MAX_NESTING) -> None:
    """Check that ``value`` can be stored and read back equal (SPEC §7.1).

    Refused: NaN and ±infinity (JSON has neither), nesting deeper than ``max_depth``
    containers, dict keys that are not ``str`` (JSON would turn ``1`` into ``"1"``),
    and objects JSON does not know. Allowed: ``None``, ``bool``, ``int``, finite
    ``float``, ``str`` (lone surrogates too: every format escapes them), ``bytes``,
    lists, tuples (stored as lists) and dicts with ``str`` keys. The walk is bounded
    by ``max_depth``, so no value raises ``RecursionError`` here.

    Raises:
        ValueError: naming the path of the first bad value, e.g.
            ``messages[3].content[0].toolUse.input.x: NaN cannot be stored …``.
    """
    try:
        _check(value, 1, max_depth)
    except _Unstorable as exc:
        path = "".join(
            f"[{part}]" if isinstance(part, int) else _key_path(part) for part in reversed(exc.path)
        )
        raise ValueError(f"{where}{path}: {exc.reason}") from None


def _key_path(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{key!r}]"


def _check(obj: Any, depth: int, max_depth: int) -> None:
    # ``depth`` counts the containers from the root to ``obj``, ``obj`` included.
    if isinstance(obj, dict):
        if depth > max_depth:
            raise _Unstorable(f"nesting deeper than {max_depth} cannot be stored")
        for key, item in obj.items():
            if not isinstance(key, str):
                raise _Unstorable(
                    f"dict key {key!r} is a {type(key).__name__}; keys must be str "
                    "(JSON would turn it into a string)"
                )
            if type(item) in _LEAVES:
                continue
            try:
                _check(item, depth + 1, max_depth)
            except _Unstorable as exc:
                exc.path.append(key)
                raise
    elif isinstance(obj, (list, tuple)):
        if depth > max_depth:
            raise _Unstorable(f"nesting deeper than {max_depth} cannot be stored")
        for index, item in enumerate(obj):
            if type(item) in _LEAVES:
                continue
            try:
                _check(item, depth + 1, max_depth)
            except _Unstorable as exc:
                exc.path.append(index)
                raise
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            raise _Unstorable(f"{obj!r} cannot be stored (JSON has no NaN or infinity)")
    elif obj is not None and not isinstance(obj, (str, int, bytes, bytearray, memoryview)):
        raise _Unstorable(f"{type(obj).__name__} is not JSON-serializable")


def encodes_as_utf8(text: str) -> bool:
    """False when ``text`` holds a lone surrogate, which UTF-8 cannot carry."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Made once: json.dumps given any option builds a new JSONEncoder at every call (a
# third of the cost of encoding a short message). encode() keeps no state between
# calls, so one encoder serves every thread.
_ENCODERS = {
    (ascii_only, sort_keys): json.JSONEncoder(
        ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False, sort_keys=sort_keys
    )
    for ascii_only in (False, True)
    for sort_keys in (False, True)
}
_COMPACT = _ENCODERS[False, False]


def compact_json(value: Any, *, sort_keys: bool = False, ascii_only: bool = False) -> str:
    """Compact JSON text of ``value`` (NaN and infinity refused).

    What ``json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"),
    allow_nan=False, sort_keys=sort_keys)`` returns, without building an encoder.

    Raises:
        TypeError: a value JSON does not know.
        ValueError: NaN or infinity, or a cycle.
    """
    if not (sort_keys or ascii_only):
        return _COMPACT.encode(value)
    return _ENCODERS[ascii_only, sort_keys].encode(value)


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
    text = compact_json(value, sort_keys=sort_keys)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return compact_json(value, sort_keys=sort_keys, ascii_only=True).encode("ascii")
