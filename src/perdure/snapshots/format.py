"""Blob formats of :class:`~perdure.snapshots.manager.SnapshotSessionManager` (pure).

Two kinds of blob, each a one-line text header and a UTF-8 JSON body:

**Manifest** (``…/snapshots/<ULID>``, and ``…/latest`` on a storage that cannot
append; where it can, ``latest`` is the log of :mod:`perdure.snapshots.log`, format
:data:`LOG_FORMAT`, which replays to the same content)::

    perdure-snapshot/1 crc32=1a2b3c4d
    {"snapshot": {"schema_version": "1.0", "scope": "agent", "created_at": "…",
                  "app_data": {}},
     "fields": {"state": …, "conversation_manager_state": …, …}   # or "fields_ref": "<sha>"
     "messages": {"count": 1234, "skip": 0,
                  "parts": [[level, count, "<sha>"], …]            # or "index": "<sha>"
                  "chain": "<sha>" | null,
                  "inline": [message, …]}}

The CRC-32 covers the body, to catch a damaged manifest. ``fields`` are the
:class:`~perdure.agent.Snapshot` data other than ``messages`` (preset ``"session"``).

**Chunk** (``…/chunks/<sha256 hex>``; immutable, named by the SHA-256 of the whole
blob, header included). The header is ``perdure-chunk/1`` followed by the JSON body,
or, for a body of 512 bytes or more, ``perdure-chunk/1 zlib`` followed by the body
compressed with zlib (level 1: a seal compresses 64 KiB on the saving thread, and
level 6 took four times as long for 10% less)::

    perdure-chunk/1
    {"kind": "messages", "messages": [message, …]}               # sealed run of messages
    {"kind": "node", "level": L, "parts": [[count, "<sha>"], …]}  # children one level down
    {"kind": "index", "parts": [[level, count, "<sha>"], …]}      # top of the tree
    {"kind": "tail", "prev": "<sha>" | null, "messages": [...]}   # snapshot delta chain
    {"kind": "fields", "fields": {...}}

The history a manifest describes is, in order: the messages of the tree's level-0
chunks minus the first ``skip`` (messages a conversation manager trimmed), then the
``tail`` chain from its oldest node, then ``inline``. ``count`` is the total. Values
are in the stored form of :mod:`perdure.types.json`: bytes inside messages use the
``{"__bytes_encoded__": true, "data": "<base64>"}`` marker, and a dict of the
user's shaped like a marker is escaped (so it comes back unchanged).

A reader refuses (``SessionCorruptedError``, code ``session_store_corrupted``) a blob
whose header, checksum, hash, JSON or shape is wrong, and (``SnapshotError``) a blob
of a format version it does not know. Nothing is ever read as an empty agent.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from dataclasses import dataclass
from typing import Any

from perdure.crypto import envelope_key_id, is_envelope
from perdure.errors import DecryptionError, SessionCorruptedError, SnapshotError
from perdure.types import decode_bytes_values, encode_bytes_values, is_text_only
from perdure.types.json import compact_json, may_hold_encoded

__all__ = [
    "CHUNK_FORMAT",
    "LOG_FORMAT",
    "MANIFEST_FORMAT",
    "Manifest",
    "Part",
    "check_count",
    "check_messages",
    "check_parts",
    "decode_stored",
    "encode_json",
    "encode_message",
    "fields_chunk",
    "index_chunk",
    "json_object",
    "manifest_blob",
    "messages_chunk",
    "node_chunk",
    "parse_chunk",
    "parse_manifest",
    "sha256_hex",
    "tail_chunk",
]

MANIFEST_FORMAT = "perdure-snapshot/1"
LOG_FORMAT = "perdure-snapshot/2"
"""The ``latest`` log of :mod:`perdure.snapshots.log` (on storages that append)."""
CHUNK_FORMAT = "perdure-chunk/1"
_CHUNK_HEADER = (CHUNK_FORMAT + "\n").encode("ascii")
_ZLIB_HEADER = (CHUNK_FORMAT + " zlib\n").encode("ascii")
_COMPRESS_FROM = 512
_LEVEL = 1
_HASH = re.compile(r"[0-9a-f]{64}")

Part = tuple[int, int, str]
"""A reference in the tree: ``(level, message count, sha256)``; level 0 is a messages chunk."""


def sha256_hex(blob: bytes) -> str:
    """Return the SHA-256 of ``blob`` as 64 lower-case hex digits."""
    return hashlib.sha256(blob).hexdigest()


def encode_json(value: Any, what: str, *, walk: bool = True) -> bytes:
    """Return compact UTF-8 JSON for ``value`` in the stored form (bytes as markers).

    The same value always gives the same bytes (dict order is kept), which is what
    lets equal chunks share one hash. ``walk=False`` promises that ``value`` holds
    no ``bytes`` and no dict shaped like a marker (it skips the walk).

    Raises:
        SnapshotError: ``value`` holds something JSON cannot represent (``what``
            names the part, e.g. ``"messages[3]"``).
    """
    try:
        stored = value
        try:
            text = _dumps(value)
        except TypeError:  # bytes, most likely: the walk turns them into markers
            if not walk:
                raise
            stored = encode_bytes_values(value)
            text = _dumps(stored)
        else:
            # No bytes; and without '"__' in the text no dict holds a marker key, so
            # the walk would change nothing (tuples are lists either way).
            if walk and '"__' in text:
                stored = encode_bytes_values(value)
                text = _dumps(stored)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SnapshotError(f"snapshot {what} is not JSON-serializable: {exc}") from exc
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escape it, it round-trips as such
        return compact_json(stored, ascii_only=True).encode("ascii")


def _dumps(value: Any) -> str:
    return compact_json(value)


def encode_message(message: Any, index: int) -> bytes:
    """Return the JSON of one message (see :func:`encode_json`)."""
    try:  # the agent's messages were validated; anything else takes the walk
        text_only = is_text_only(message)
    except (TypeError, KeyError):
        text_only = False
    return encode_json(message, f"messages[{index}]", walk=not text_only)


def _join(fragments: list[bytes]) -> bytes:
    return b"[" + b",".join(fragments) + b"]"


def _chunk(body: bytes) -> bytes:
    """Frame a chunk body, compressing it when that is worth it (deterministic)."""
    if len(body) >= _COMPRESS_FROM:
        return _ZLIB_HEADER + zlib.compress(body, _LEVEL)
    return _CHUNK_HEADER + body


def messages_chunk(fragments: list[bytes]) -> bytes:
    """Return a ``messages`` chunk holding the pre-encoded messages ``fragments``."""
    return _chunk(b'{"kind":"messages","messages":' + _join(fragments) + b"}")


def node_chunk(level: int, parts: list[tuple[int, str]]) -> bytes:
    """Return a tree ``node`` chunk of ``level`` (>= 1) over ``(count, sha)`` children."""
    body = {"kind": "node", "level": level, "parts": [[count, h] for count, h in parts]}
    return _chunk(encode_json(body, "node"))


def index_chunk(parts: list[Part]) -> bytes:
    """Return an ``index`` chunk: the top of the tree, as ``(level, count, sha)`` parts."""
    body = {"kind": "index", "parts": [list(part) for part in parts]}
    return _chunk(encode_json(body, "index"))


def tail_chunk(prev: str | None, fragments: list[bytes]) -> bytes:
    """Return a ``tail`` chunk: messages that follow the ``prev`` tail chunk (or none)."""
    head = b'{"kind":"tail","prev":' + (b"null" if prev is None else f'"{prev}"'.encode())
    return _chunk(head + b',"messages":' + _join(fragments) + b"}")


def fields_chunk(fields_json: bytes) -> bytes:
    """Return a ``fields`` chunk holding the pre-encoded snapshot fields."""
    return _chunk(b'{"kind":"fields","fields":' + fields_json + b"}")


def json_object(body: bytes, where: str) -> dict[str, Any]:
    """Parse a blob's JSON body, which must be an object (``SessionCorruptedError`` if not)."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise _corrupt(where, f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _corrupt(where, "the body is not an object")
    return data


def refuse_envelope(blob: bytes | None, where: str) -> None:
    """Raise :class:`~perdure.errors.DecryptionError` for an encrypted blob read as plain.

    A blob written through a cipher (``SnapshotSessionManager(cipher=...)``) and read
    without one is a missing key, not damage.
    """
    if blob is not None and is_envelope(blob):
        raise DecryptionError(
            f"snapshot blob {where!r} is encrypted (key {envelope_key_id(blob)!r}) and no "
            "cipher was given: pass cipher=",
            details={"reason": "no_cipher", "key_id": envelope_key_id(blob)},
        )


def _corrupt(where: str, why: str) -> SessionCorruptedError:
    return SessionCorruptedError(f"snapshot blob {where!r} is damaged: {why}")


def decode_stored(value: Any, where: str) -> Any:
    try:
        return decode_bytes_values(value)
    except ValueError as exc:
        raise _corrupt(where, str(exc)) from exc


def _check_hash(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _HASH.fullmatch(value):
        raise _corrupt(where, f"{value!r} is not a sha256 reference")
    return value


def check_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _corrupt(where, f"{value!r} is not a message count")
    return value


def check_messages(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise _corrupt(where, "messages must be a list of objects")
    return value


def parse_chunk(blob: bytes | None, sha: str, where: str) -> dict[str, Any]:
    """Verify and parse a chunk named ``sha``; return its JSON body (bytes decoded).

    Raises:
        SessionCorruptedError: the chunk is missing, its SHA-256 is not ``sha``, or its
            header, JSON or shape is wrong.
        SnapshotError: it is a chunk of another format version.
    """
    if blob is None:
        raise _corrupt(where, "the chunk is missing")
    refuse_envelope(blob, where)
    if sha256_hex(blob) != sha:
        raise _corrupt(where, "its sha256 does not match its name")
    header, _, body = blob.partition(b"\n")
    if header + b"\n" == _ZLIB_HEADER:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise _corrupt(where, f"its compressed body is damaged: {exc}") from exc
    elif header + b"\n" != _CHUNK_HEADER:
        if header.startswith(b"perdure-chunk/"):
            raise SnapshotError(
                f"snapshot chunk {where!r} has format {header.decode('ascii', 'replace')!r}; "
                f"this perdure reads {CHUNK_FORMAT!r}"
            )
        raise _corrupt(where, "unknown header")
    data = json_object(body, where)
    kind = data.get("kind")
    if kind in ("messages", "tail"):
        check_messages(data.get("messages"), where)
        if kind == "tail" and data.get("prev") is not None:
            _check_hash(data["prev"], where)
        if may_hold_encoded(body):
            data["messages"] = decode_stored(data["messages"], where)
    elif kind == "node":
        level = data.get("level")
        if isinstance(level, bool) or not isinstance(level, int) or level < 1:
            raise _corrupt(where, f"bad node level {level!r}")
        parts = data.get("parts")
        if not isinstance(parts, list) or not parts:
            raise _corrupt(where, "a node needs parts")
        for part in parts:
            if not isinstance(part, list) or len(part) != 2:
                raise _corrupt(where, f"bad node part {part!r}")
            check_count(part[0], where)
            _check_hash(part[1], where)
    elif kind == "index":
        data["parts"] = check_parts(data.get("parts"), where)
    elif kind == "fields":
        if not isinstance(data.get("fields"), dict):
            raise _corrupt(where, "fields must be an object")
        data["fields"] = decode_stored(data["fields"], where)
    else:
        raise _corrupt(where, f"unknown chunk kind {kind!r}")
    return data


def check_parts(parts: Any, where: str) -> list[Part]:
    if not isinstance(parts, list):
        raise _corrupt(where, "parts must be a list")
    checked: list[Part] = []
    for part in parts:
        if not isinstance(part, list) or len(part) != 3:
            raise _corrupt(where, f"bad part {part!r}")
        level = check_count(part[0], where)
        checked.append((level, check_count(part[1], where), _check_hash(part[2], where)))
    return checked


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest (see the module docstring for the fields)."""

    meta: dict[str, Any]
    fields: dict[str, Any] | None
    fields_ref: str | None
    count: int
    skip: int
    parts: list[Part] | None
    index_ref: str | None
    chain_ref: str | None
    inline: list[Any]


def manifest_blob(
    meta: dict[str, Any],
    *,
    fields_json: bytes | None = None,
    fields_ref: str | None = None,
    count: int,
    skip: int,
    parts: list[Part] | None = None,
    index_ref: str | None = None,
    chain_ref: str | None,
    inline: list[bytes],
) -> bytes:
    """Return a manifest blob; exactly one of ``fields_json``/``fields_ref`` is given."""
    fields = (
        b'"fields":' + fields_json
        if fields_json is not None
        else b'"fields_ref":' + encode_json(fields_ref, "fields_ref")
    )
    tree = (
        b'"index":' + encode_json(index_ref, "index")
        if parts is None
        else b'"parts":' + encode_json([list(part) for part in parts], "parts")
    )
    body = b"".join(
        [
            b'{"snapshot":',
            encode_json(meta, "metadata"),
            b",",
            fields,
            b',"messages":{"count":',
            str(count).encode(),
            b',"skip":',
            str(skip).encode(),
            b",",
            tree,
            b',"chain":',
            b"null" if chain_ref is None else f'"{chain_ref}"'.encode(),
            b',"inline":',
            _join(inline),
            b"}}",
        ]
    )
    header = f"{MANIFEST_FORMAT} crc32={zlib.crc32(body):08x}\n".encode("ascii")
    return header + body


_MANIFEST_HEADER = re.compile(rb"perdure-snapshot/1 crc32=([0-9a-f]{8})")


def parse_manifest(blob: bytes, where: str) -> Manifest:
    """Verify and parse a manifest blob read from key ``where``.

    Raises:
        SessionCorruptedError: the header, checksum, JSON or shape is wrong.
        SnapshotError: the manifest is of another format version.
    """
    refuse_envelope(blob, where)
    header, newline, body = blob.partition(b"\n")
    match = _MANIFEST_HEADER.fullmatch(header)
    if match is None or not newline:
        if header.startswith(b"perdure-snapshot/") and not header.startswith(
            b"perdure-snapshot/1 "
        ):
            found = header.split(b" ")[0].decode("ascii", "replace")
            raise SnapshotError(
                f"snapshot {where!r} has format {found!r}; this perdure reads "
                f"{MANIFEST_FORMAT!r} and {LOG_FORMAT!r}"
            )
        raise _corrupt(where, "unknown header")
    if f"{zlib.crc32(body):08x}".encode() != match.group(1):
        raise _corrupt(where, "its checksum does not match")
    data = json_object(body, where)
    meta = data.get("snapshot")
    messages = data.get("messages")
    if not isinstance(meta, dict) or not isinstance(messages, dict):
        raise _corrupt(where, "missing 'snapshot' or 'messages'")
    for key in ("schema_version", "scope", "created_at", "app_data"):
        if key not in meta:
            raise _corrupt(where, f"the snapshot metadata lacks {key!r}")
    fields: dict[str, Any] | None = None
    fields_ref: str | None = None
    if "fields" in data:
        if not isinstance(data["fields"], dict):
            raise _corrupt(where, "fields must be an object")
        fields = decode_stored(data["fields"], where)
    else:
        fields_ref = _check_hash(data.get("fields_ref"), where)
    parts: list[Part] | None = None
    index_ref: str | None = None
    if "parts" in messages:
        parts = check_parts(messages["parts"], where)
    elif messages.get("index") is not None:
        index_ref = _check_hash(messages["index"], where)
    else:
        parts = []
    chain = messages.get("chain")
    inline = check_messages(messages.get("inline"), where)
    if may_hold_encoded(body):
        inline = decode_stored(inline, where)
    return Manifest(
        meta={**meta, "app_data": decode_stored(meta["app_data"], where)},
        fields=fields,
        fields_ref=fields_ref,
        count=check_count(messages.get("count"), where),
        skip=check_count(messages.get("skip"), where),
        parts=parts,
        index_ref=index_ref,
        chain_ref=None if chain is None else _check_hash(chain, where),
        inline=inline,
    )
