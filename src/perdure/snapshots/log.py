"""The ``snapshot_latest`` log (format 2): one full state, then patches (pure).

On a storage that can append (:class:`~perdure.storage.AppendStorage`), ``latest`` is a
log that grows by one short line per save, instead of a manifest (format 1, see
:mod:`perdure.snapshots.format`) rewritten whole each time::

    perdure-snapshot/2
    {"at":"…","m":{…},"f":{…},"n":800,"p":[[1,512,"<sha>"],…],"a":[message,…],"h":"<hash>"}
    {"at":"…","n":801,"a":[message],"h":"<hash>"}
    …

Each line after the header is one save: a JSON object whose keys patch the state that
the lines before it describe. The first line patches an empty state (no messages,
``skip`` 0, no parts), so it holds everything:

* ``at``: the snapshot's ``created_at`` (every record);
* ``m``: the snapshot metadata ``schema_version``, ``scope`` and ``app_data`` (when
  changed; always in the first record);
* ``f``: the snapshot fields, as a format-1 manifest holds them (when changed; always
  in the first record);
* ``n``: the message count after this record (every record; checked);
* ``s``: ``skip``, the messages trimmed from the first sealed chunk (when changed);
* ``p``: the tree top over the sealed chunks, ``[[level, count, sha], …]`` (when changed);
* ``d`` and ``c``: inline messages dropped from the front (sealed into a chunk, or
  trimmed) and cut from the back (edited), when not zero;
* ``a``: inline messages appended after that.

``h`` is the record's hash, ``sha256(prev + body)`` truncated to 32 hex digits
(:func:`~perdure.session.rules.chain_hash`): ``body`` is the line without its
``,"h":"…"`` and ``prev`` the previous record's hash (the first record chains to
``ZERO_HASH``). The last 40 bytes of a log therefore identify all of it: they are the
end a writer's next append expects (:class:`LatestEnd`), so of two writers that read
the same log only one can append to it.

Reading replays the records into a :class:`~perdure.snapshots.format.Manifest`, as if
a format-1 manifest had been read, and checks after each record that its count adds
up. A complete line (ending in a newline) whose hash or shape is wrong, a log without
its header or without one complete record, is :class:`~perdure.errors.SessionCorruptedError`.
Bytes after the last newline that form no complete record are what an append
interrupted by a crash leaves: that save was never acknowledged, so they are left out
(:attr:`Replay.torn` says how many bytes; the manager logs a warning) and the writer's
next save rewrites the log. A record that only lost its newline is complete and kept.
A log cut exactly at a line end reads as the older state it then holds: like any
append-only journal, it cannot vouch for records it no longer has.

A writer starts the log afresh (the header and one full record, replaced atomically)
when it has grown past ``max(LOG_BYTES, 2 x its first record)``, after a torn end, on
a redaction (so that redacted content does not stay at rest in older records), and
when what it would append to is not a log it knows (format 1, or never read).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perdure.errors import SessionCorruptedError
from perdure.session.rules import ZERO_HASH, chain_hash
from perdure.snapshots.format import (
    LOG_FORMAT,
    Manifest,
    Part,
    check_count,
    check_messages,
    check_parts,
    decode_stored,
    encode_json,
    json_object,
    parse_manifest,
    refuse_envelope,
)
from perdure.types.json import may_hold_encoded

__all__ = [
    "ABSENT",
    "LOG_BYTES",
    "LOG_FORMAT",
    "LatestEnd",
    "LogHead",
    "LogState",
    "Replay",
    "append_record",
    "end_of",
    "new_log",
    "parse_latest",
    "replay",
]

LOG_BYTES = 256 * 1024
"""A log is started afresh once it is this long (or twice its first record, if more)."""

_HEADER = (LOG_FORMAT + "\n").encode("ascii")
_HASH_AT = b',"h":"'
_END_LEN = len(_HASH_AT) + 32 + len(b'"}\n')  # the 41 bytes every record line ends with
_RECORD_END = re.compile(rb',"h":"[0-9a-f]{32}"\}\n\Z')


@dataclass(frozen=True)
class LogState:
    """What one save of ``latest`` holds, encoded (the writer's side of a record).

    ``meta`` is the metadata without ``created_at`` (``at``); ``inline`` the encoded
    open-tail messages, the ``bytes`` objects of the writer's layout (a patch finds
    the messages a log already holds by comparing them, mostly by identity).
    """

    at: str
    meta: bytes
    fields: bytes
    count: int
    skip: int
    parts: tuple[Part, ...]
    inline: tuple[bytes, ...]


@dataclass(frozen=True)
class LogHead:
    """The state a log holds after its last record, as its writer needs it to append.

    ``meta`` and ``fields`` are ``None`` when unknown in encoded form (after a read):
    the next record then carries them again.
    """

    size: int
    hash: str
    base: int
    meta: bytes | None
    fields: bytes | None
    count: int
    skip: int
    parts: tuple[Part, ...]
    inline: tuple[bytes, ...]

    @property
    def tail(self) -> bytes:
        """The log's last bytes, which name its last record's hash."""
        return _HASH_AT + self.hash.encode("ascii") + b'"}\n'

    def due(self) -> bool:
        """True when the log should be started afresh rather than appended to."""
        return self.size >= max(LOG_BYTES, 2 * self.base)


@dataclass(frozen=True)
class LatestEnd:
    """How ``latest`` ended when its writer last read or wrote it.

    ``size`` is ``None`` when there was no ``latest``. ``tail`` is what the next
    conditional write expects at the end (the last record's hash for a log, the whole
    blob otherwise). ``head`` is set when the blob is a log the writer can append to.
    """

    size: int | None
    tail: bytes
    head: LogHead | None = None


ABSENT = LatestEnd(None, b"")
"""The end of a ``latest`` that does not exist."""


def end_of(blob: bytes | None) -> LatestEnd:
    """The end of a blob read as is, to replace it on condition that it is unchanged."""
    if blob is None:
        return ABSENT
    if blob.startswith(_HEADER) and _RECORD_END.search(blob[-_END_LEN:]):
        return LatestEnd(len(blob), blob[-_END_LEN:])
    return LatestEnd(len(blob), blob)


def _string(text: str) -> bytes:
    if text.isascii() and '"' not in text and "\\" not in text and text.isprintable():
        return b'"' + text.encode("ascii") + b'"'  # an ISO-8601 time: nothing to escape
    return json.dumps(text).encode("ascii")


def _overlap(old: Sequence[bytes], new: Sequence[bytes]) -> tuple[int, int]:
    """``(drop, keep)`` such that ``new[:keep]`` equals ``old[drop:drop + keep]``.

    The entries are the encoded messages, so equal entries are equal bytes in the
    log: any such pair makes a correct patch, and the writer's own encodings (the
    same ``bytes`` objects) make the comparisons identity checks.
    """
    if not new or not old:
        return len(old), 0
    try:
        drop = old.index(new[0])
    except ValueError:
        return len(old), 0
    limit = min(len(new), len(old) - drop)
    if new[:limit] == old[drop : drop + limit]:
        return drop, limit
    keep = 1
    while keep < limit and new[keep] == old[drop + keep]:
        keep += 1
    return drop, keep


def _record(prev: str, pieces: list[bytes]) -> tuple[bytes, str]:
    body = b"".join(pieces) + b"}"
    digest = chain_hash(prev, body)
    return body[:-1] + _HASH_AT + digest.encode("ascii") + b'"}\n', digest


def append_record(head: LogHead, new: LogState) -> tuple[bytes, LogHead]:
    """The line that turns ``head``'s state into ``new``, and the head after it."""
    pieces = [b'{"at":', _string(new.at)]
    if new.meta != head.meta:
        pieces += [b',"m":', new.meta]
    if new.fields != head.fields:
        pieces += [b',"f":', new.fields]
    pieces += [b',"n":', str(new.count).encode()]
    if new.skip != head.skip:
        pieces += [b',"s":', str(new.skip).encode()]
    if new.parts != head.parts:
        pieces += [b',"p":', encode_json([list(part) for part in new.parts], "parts")]
    drop, keep = _overlap(head.inline, new.inline)
    cut = len(head.inline) - drop - keep
    if drop:
        pieces += [b',"d":', str(drop).encode()]
    if cut:
        pieces += [b',"c":', str(cut).encode()]
    if keep < len(new.inline):
        pieces += [b',"a":[', b",".join(new.inline[keep:]), b"]"]
    line, digest = _record(head.hash, pieces)
    return line, LogHead(
        size=head.size + len(line),
        hash=digest,
        base=head.base,
        meta=new.meta,
        fields=new.fields,
        count=new.count,
        skip=new.skip,
        parts=new.parts,
        inline=new.inline,
    )


_EMPTY = LogHead(
    size=len(_HEADER),
    hash=ZERO_HASH,
    base=0,
    meta=None,
    fields=None,
    count=0,
    skip=0,
    parts=(),
    inline=(),
)


def new_log(state: LogState) -> tuple[bytes, LogHead]:
    """A whole log holding ``state`` (the header and one full record), and its head."""
    line, head = append_record(_EMPTY, state)
    blob = _HEADER + line
    return blob, dataclasses.replace(head, base=len(blob))


@dataclass(frozen=True)
class Replay:
    """A log read back: the state it holds, and where its writer may go on from.

    ``head`` is ``None`` when the log must be started afresh before anything is
    appended (a torn or newline-less end); its ``inline`` is empty, to be filled with
    the reader's own encodings. ``torn`` counts the bytes of an interrupted append
    that were left out.
    """

    manifest: Manifest
    head: LogHead | None
    end: LatestEnd
    torn: int


def _corrupt(where: str, why: str) -> SessionCorruptedError:
    return SessionCorruptedError(f"snapshot blob {where!r} is damaged: {why}")


def _verified(line: bytes, prev: str, where: str, offset: int) -> tuple[dict[str, Any], str]:
    """Check one record line (without its newline) against the chain; return it parsed."""
    if len(line) < _END_LEN or line[-40:-34] != _HASH_AT or line[-2:] != b'"}':
        raise _corrupt(where, f"the line at byte {offset} is not a log record")
    digest = line[-34:-2].decode("ascii", "replace")
    body = line[:-40] + b"}"
    if chain_hash(prev, body) != digest:
        raise _corrupt(
            where, f"the record at byte {offset}: its hash does not match its bytes and chain"
        )
    return json_object(body, where), digest


def replay(blob: bytes, where: str) -> Replay:
    """Verify and replay a log read from key ``where``.

    Raises:
        SessionCorruptedError: a complete record is damaged, the counts do not add up,
            or the log holds no complete record (see the module docstring).
    """
    if not blob.startswith(_HEADER):
        refuse_envelope(blob, where)
        raise _corrupt(where, "unknown header")
    lines = blob[len(_HEADER) :].split(b"\n")
    fragment = lines.pop()
    records: list[tuple[dict[str, Any], str, int]] = []
    prev = ZERO_HASH
    offset = len(_HEADER)
    for line in lines:
        data, prev = _verified(line, prev, where, offset)
        records.append((data, prev, offset))
        offset += len(line) + 1
    torn = 0
    appendable = True
    if fragment:
        appendable = False
        # A whole record that lost its newline, or whose newline became another byte
        # (no append leaves either), is complete; anything else is a torn append.
        for candidate in (fragment, fragment[:-1]):
            try:
                data, digest = _verified(candidate, prev, where, offset)
            except SessionCorruptedError:
                continue
            records.append((data, digest, offset))
            prev = digest
            break
        else:
            torn = len(fragment)
    if not records:
        raise _corrupt(where, "it holds no complete record")

    meta: dict[str, Any] | None = None
    fields: dict[str, Any] | None = None
    skip = sealed = 0
    parts: list[Part] = []
    inline: list[Any] = []
    at: Any = None
    for data, _, at_byte in records:
        at = data.get("at")
        if not isinstance(at, str):
            raise _corrupt(where, f"the record at byte {at_byte} has no created_at")
        if "m" in data:
            meta = data["m"]
            if not isinstance(meta, dict) or not all(
                key in meta for key in ("schema_version", "scope", "app_data")
            ):
                raise _corrupt(where, f"the record at byte {at_byte} has bad metadata")
        if "f" in data:
            fields = data["f"]
            if not isinstance(fields, dict):
                raise _corrupt(where, f"the record at byte {at_byte}: fields must be an object")
        if meta is None or fields is None:
            raise _corrupt(where, "its first record lacks the metadata or the fields")
        count = check_count(data.get("n"), where)
        if "s" in data:
            skip = check_count(data["s"], where)
        if "p" in data:
            parts = check_parts(data["p"], where)
            sealed = sum(part[1] for part in parts)
        drop = check_count(data.get("d", 0), where)
        cut = check_count(data.get("c", 0), where)
        if drop + cut > len(inline):
            raise _corrupt(where, f"the record at byte {at_byte} removes more than it holds")
        if drop or cut:
            inline = inline[drop : len(inline) - cut]
        if "a" in data:
            inline.extend(check_messages(data["a"], where))
        if count != sealed - skip + len(inline):
            raise _corrupt(
                where,
                f"the record at byte {at_byte} counts {count} messages, "
                f"its state holds {sealed - skip + len(inline)}",
            )
    assert meta is not None
    assert fields is not None
    if may_hold_encoded(blob):
        inline = decode_stored(inline, where)
        fields = decode_stored(fields, where)
        meta = {**meta, "app_data": decode_stored(meta["app_data"], where)}
    manifest = Manifest(
        meta={
            "schema_version": meta["schema_version"],
            "scope": meta["scope"],
            "created_at": at,
            "app_data": meta["app_data"],
        },
        fields=fields,
        fields_ref=None,
        count=count,
        skip=skip,
        parts=parts,
        index_ref=None,
        chain_ref=None,
        inline=inline,
    )
    head = None
    end = end_of(blob)
    if appendable:
        head = LogHead(
            size=len(blob),
            hash=prev,
            base=records[1][2] if len(records) > 1 else len(blob),
            meta=None,
            fields=None,
            count=count,
            skip=skip,
            parts=tuple(parts),
            inline=(),
        )
    return Replay(manifest, head, end, torn)


def parse_latest(blob: bytes, where: str) -> tuple[Manifest, Replay | None]:
    """Parse a blob of either format; the :class:`Replay` too when it is a log.

    Raises:
        SessionCorruptedError: the blob is damaged.
        SnapshotError: it is of a format this perdure does not read.
    """
    if blob[: len(_HEADER) + 40].split(b"\n", 1)[0].split(b" ")[0] == _HEADER[:-1]:
        replayed = replay(blob, where)
        return replayed.manifest, replayed
    return parse_manifest(blob, where), None
