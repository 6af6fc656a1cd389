"""The journal format: one hash-chained JSON record per line (SPEC §7.1).

A line is ``{"h":"<hash>",<body>}`` where ``<body>`` is the rest of a compact JSON
object and ``hash = sha256(prev_hash + "{" + body)`` truncated to 32 hex digits; the
first record of a session chains to :data:`GENESIS`. So every line is plain JSON (a
journal can be read with ``jq``), and a reader verifies a record by hashing the
bytes it read, without re-serialising anything.

Body keys (short, to keep the journal close to the size of the messages):

- ``n``: record sequence number (0, 1, 2, …; continues across segments);
- ``c``: number of messages in the history after this record;
- ``t``: type — ``"m"`` message, ``"s"`` agent state, ``"r"`` redaction, ``"w"``
  rewrite (first record of a rewritten volume);
- ``m``: the message (bytes encoded, large binaries replaced by attachment refs);
- ``s``: the agent state; ``i``: the index a redaction replaces.

Everything here is pure: no I/O, so damage handling is unit- and property-tested.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from perdure.session.rules import HASH_LEN as HASH_LEN
from perdure.session.rules import ZERO_HASH
from perdure.session.rules import chain_hash as chain_hash
from perdure.types.json import compact_json_bytes

GENESIS = ZERO_HASH
"""The hash the first record of a session chains to."""
_PREFIX = b'{"h":"'
# One encoder for every record: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
BODY_AT = len(_PREFIX) + HASH_LEN + 2  # after '{"h":"<hash>",'

RecordType = Literal["m", "s", "r", "w"]
_TYPES = ("m", "s", "r", "w")  # a tuple: `in` must not hash what a record holds
DamageKind = Literal[
    "bad_line", "bad_hash", "broken_chain", "bad_payload", "bad_sequence", "missing_record"
]


class Record(NamedTuple):
    """One decoded journal record."""

    hash: str
    seq: int
    total: int
    type: RecordType
    body: dict[str, Any]
    offset: int = 0
    """Byte offset of the line in its file."""
    length: int = 0
    """Byte length of the line including its newline."""
    encoded: bool = False
    """The line holds encoded bytes or attachment refs that reads must decode."""


class JournalDamage(Exception):
    """A record that is not what the chain says it must be."""

    def __init__(self, kind: DamageKind, offset: int, seq: int | None, detail: str) -> None:
        super().__init__(
            f"{kind} at byte {offset}"
            + (f" (record {seq})" if seq is not None else "")
            + f": {detail}"
        )
        self.kind = kind
        self.offset = offset
        self.seq = seq
        self.detail = detail


def encode_record(prev_hash: str, body: dict[str, Any]) -> tuple[bytes, str]:
    """Encode ``body`` chained to ``prev_hash``; return the line (with newline) and its hash."""
    try:
        body_json = _ENCODER.encode(body).encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, it round-trips as such
        body_json = compact_json_bytes(body)
    digest = chain_hash(prev_hash, body_json)
    return _PREFIX + digest.encode("ascii") + b'",' + body_json[1:] + b"\n", digest


@dataclass
class Scan:
    """The result of scanning journal bytes.

    ``records`` are the verified records; ``end`` is the byte offset just past the
    last complete, verified line (its newline included when it has one); ``torn``
    is true when bytes follow ``end`` that form no complete line (an interrupted
    append: not corruption). One byte may also follow ``end`` without ``torn``: the
    last record's newline, turned into another byte; a writer puts the newline back.
    """

    records: list[Record]
    end: int
    torn: bool
    last_hash: str


def scan(
    data: bytes,
    *,
    prev_hash: str = GENESIS,
    first_seq: int = 0,
    base_offset: int = 0,
    decode: bool = True,
    verify: bool = True,
) -> Scan:
    """Verify ``data`` (whole lines of one file) against the chain and decode it.

    A final fragment without a newline is a torn append: it is reported through
    ``Scan.torn`` and left out — unless it is a complete, valid record that only
    lost its newline (or whose newline became another byte), which is kept: see
    :func:`complete_tail`. Any other damage raises :class:`JournalDamage` naming the
    kind and byte offset.

    Args:
        data: the file's bytes.
        prev_hash: the hash the first record must chain to.
        first_seq: the sequence number the first record must carry.
        base_offset: added to reported byte offsets (for reads from the middle).
        decode: parse the JSON bodies (``False`` only verifies hashes and framing).
        verify: check each complete line's hash against the chain. ``False`` only
            when the caller has vouched for these exact bytes otherwise (a sealed
            segment's file digest): the last line's stored hash is taken as is.
    """
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when data ends with a newline
    torn = False
    records: list[Record] = []
    offsets: list[int] = []
    position = 0
    prev = prev_hash
    if verify:
        for index, line in enumerate(lines):
            offsets.append(position)
            try:
                prev = _verify_line(line, prev, base_offset + position)
            except JournalDamage as damage:
                if damage.kind != "bad_hash":
                    raise
                raise _missing_or(
                    damage, line, first_seq + index, lines[index + 1 : index + 2]
                ) from None
            position += len(line) + 1
    elif lines:
        offsets = list(itertools.accumulate([len(line) + 1 for line in lines[:-1]], initial=0))
        position = len(data) - len(tail)
        prev = peek_hash(lines[-1]) or prev
    end = position
    if tail:
        complete = complete_tail(tail, prev)
        if complete is None:
            torn = True
        else:
            line, prev = complete
            lines.append(line)
            offsets.append(position)
            end = position + len(line)
    if decode and lines:
        records = _decode(data, end, lines, offsets, base_offset, first_seq)
    elif lines:
        records = []
    return Scan(records=records, end=end, torn=torn, last_hash=prev)


def complete_tail(fragment: bytes, prev: str) -> tuple[bytes, str] | None:
    """The record in a file's last bytes after its last newline, if they hold one.

    A torn append leaves a prefix of ``line + "\n"``: some bytes of a record, never
    the whole record. So a fragment that verifies as a whole record chained to
    ``prev`` is complete and only lost its newline (the file was cut one byte short);
    and a fragment that verifies once its last byte is dropped is a complete record
    whose newline became another byte — no append can leave that either. Both are
    kept (SPEC §7.1: a last line that parses and verifies is complete).

    Returns:
        The record's line (without the byte standing for its newline) and its hash,
        or ``None`` when the fragment is no complete record: a torn tail.
    """
    for line in (fragment, fragment[:-1]):
        try:
            return line, _verify_line(line, prev, 0)
        except JournalDamage:
            continue
    return None


def _verify_line(line: bytes, prev: str, offset: int) -> str:
    if line[:6] != _PREFIX or line[BODY_AT - 2 : BODY_AT] != b'",' or len(line) <= BODY_AT:
        raise JournalDamage("bad_line", offset, None, "not a journal record")
    stored = line[6 : 6 + HASH_LEN].decode("ascii", "replace")
    if chain_hash(prev, b"{" + line[BODY_AT:]) != stored:
        raise JournalDamage(
            "bad_hash", offset, None, "record hash does not match its bytes and chain"
        )
    return stored


def _decode(
    data: bytes, end: int, lines: list[bytes], offsets: list[int], base_offset: int, first_seq: int
) -> list[Record]:
    """Parse ``lines`` (which are ``data[:end]``) into records."""
    # One parse for the whole file: a JSON line never holds a raw newline, so the
    # lines become the items of one array without joining them again.
    body = data[: end - 1 if data[end - 1 : end] == b"\n" else end]
    joined = b"[" + body.replace(b"\n", b",") + b"]"
    try:
        parsed = json.loads(joined)
    except ValueError:
        parsed = None
    if parsed is None or len(parsed) != len(lines):  # find the culprit line for the report
        for line, offset in zip(lines, offsets, strict=True):
            try:
                json.loads(line)
            except ValueError as exc:
                raise JournalDamage(
                    "bad_payload", base_offset + offset, None, f"invalid JSON: {exc}"
                ) from None
        raise JournalDamage("bad_payload", base_offset, None, "invalid JSON")
    # Encoded values ({"__bytes__": …}, attachment refs) are rare: one search of the
    # whole file spares one per line when there are none.
    maybe_encoded = b'"__' in body
    records: list[Record] = []
    append = records.append
    new = tuple.__new__  # Record(...) would run its generated __new__ per record
    expected = first_seq
    for obj, line, offset in zip(parsed, lines, offsets, strict=True):
        try:
            digest, seq, count, kind = obj["h"], obj["n"], obj["c"], obj["t"]
        except (TypeError, KeyError):
            digest = seq = count = kind = None
        well_formed = (
            type(seq) is int and type(count) is int and kind in _TYPES and type(digest) is str
        )
        if seq != expected or not well_formed:
            if not well_formed:
                raise JournalDamage(
                    "bad_payload", base_offset + offset, None, "record lacks h/n/c/t"
                )
            raise JournalDamage(
                "bad_sequence", base_offset + offset, seq, f"expected record {expected}"
            )
        expected += 1
        encoded = maybe_encoded and b'"__' in line
        append(
            new(
                Record,
                (digest, seq, count, kind, obj, base_offset + offset, len(line) + 1, encoded),
            )
        )
    return records


def records_missing_before(line: bytes, expected_seq: int, following: bytes) -> int:
    """How many records are provably missing just before ``line``; 0 when none are.

    ``line`` is a complete line whose hash does not chain from the record before it,
    ``expected_seq`` the sequence number it should carry, and ``following`` the next
    complete line. Records are missing when ``line``'s own sequence number is
    greater and ``following`` agrees: it chains to ``line``'s stored hash and carries
    the next sequence number. One fault explains all of that: the records in between
    were removed, and ``line`` is as it was written (a record whose body was altered
    keeps its sequence number; one whose number was altered no longer meets its
    successor). At the end of a file nothing can vouch for the last line: callers
    only report that its number skips ahead (see :func:`sequence_of`).
    """
    claimed = peek_hash(line)
    seq = sequence_of(line) if claimed is not None else None
    claim = peek_hash(following)
    if (
        claimed is None
        or seq is None
        or seq <= expected_seq
        or claim is None
        or chain_hash(claimed, b"{" + following[BODY_AT:]) != claim
        or sequence_of(following) != seq + 1
    ):
        return 0
    return seq - expected_seq


def sequence_of(line: bytes) -> int | None:
    """The sequence number a line carries, or ``None`` when it is no record."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    seq = obj.get("n") if isinstance(obj, dict) else None
    return seq if type(seq) is int else None


def _missing_or(
    damage: JournalDamage, line: bytes, expected_seq: int, following: list[bytes]
) -> JournalDamage:
    """``missing_record`` when records are provably missing before ``line``, else ``damage``."""
    if following:
        missing = records_missing_before(line, expected_seq, following[0])
        if missing:
            return JournalDamage(
                "missing_record",
                damage.offset,
                expected_seq + missing,
                f"{missing} record{'' if missing == 1 else 's'} missing before this one "
                f"(expected record {expected_seq})",
            )
        return damage
    seq = sequence_of(line)
    if seq is not None and seq > expected_seq:
        # Nothing follows to vouch for it: it may be intact after missing records, or
        # altered. Say what the number says; the kind stays what is proven.
        return JournalDamage(
            damage.kind,
            damage.offset,
            seq,
            f"{damage.detail}; it is record {seq} where {expected_seq} was expected "
            "(records may be missing before it)",
        )
    return damage


def last_line_start(data: bytes) -> int:
    """Offset where the last complete line of ``data`` begins (``data`` ends with ``\\n``)."""
    return data.rfind(b"\n", 0, len(data) - 1) + 1


def peek_hash(line: bytes) -> str | None:
    """The hash a line claims, or ``None`` when it is not a journal line."""
    if line.startswith(_PREFIX) and len(line) >= BODY_AT:
        claimed = line[len(_PREFIX) : len(_PREFIX) + HASH_LEN]
        # Only a hash can chain to the next record: damaged bytes there are no claim.
        if claimed.translate(None, b"0123456789abcdef") == b"":
            return claimed.decode("ascii")
    return None


def peek_body(line: bytes) -> dict[str, Any]:
    """Parse one complete line (trusting the caller verified it)."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("journal line is not an object")
    return obj


# ----------------------------------------------------------------------------- the head

End = tuple[int, str, int]
"""Where a volume ends: the last record's sequence number, its hash, the message count."""

HEAD_SLOT = 256
"""Bytes per slot of a head file; a head file is two slots."""


def encode_head_slot(generation: int, ends: Sequence[End]) -> bytes:
    """One slot of a head file: which ends the journal may have, checksummed.

    A head file records where the journal ends, outside the journal, so that a journal
    cut at a line boundary or deleted is damage rather than a shorter session. It is
    two fixed slots written in turn (``generation % 2``): a write torn by a crash
    spoils only the slot it was writing, and the other one still holds the previous
    head. A slot is one JSON line padded with spaces, so ``cat head`` reads it.
    Normally it names one end; during a rewrite it names the old volume's end and
    the new one's, since a crash may leave either.
    """
    body = _ENCODER.encode({"g": generation, "e": [list(end) for end in ends]})
    check = hashlib.sha256(body.encode()).hexdigest()[:16]
    slot = f'{body[:-1]},"x":"{check}"}}'.encode()
    if len(slot) >= HEAD_SLOT:
        raise ValueError("a head names at most a few ends")
    return slot.ljust(HEAD_SLOT - 1) + b"\n"


def decode_head(data: bytes) -> tuple[int, list[End]] | None:
    """The newest valid slot of a head file's bytes: its generation and ends.

    Returns ``None`` when no slot is valid (both damaged: the caller reports it).
    """
    best: tuple[int, list[End]] | None = None
    for start in (0, HEAD_SLOT):
        slot = data[start : start + HEAD_SLOT].strip()
        try:
            obj = json.loads(slot)
            generation, raw_ends, check = obj["g"], obj["e"], obj["x"]
            body = _ENCODER.encode({"g": generation, "e": raw_ends})
            if hashlib.sha256(body.encode()).hexdigest()[:16] != check:
                continue
            ends = [(int(n), str(h), int(c)) for n, h, c in raw_ends]
        except (ValueError, TypeError, KeyError):
            continue
        if type(generation) is int and ends and (best is None or generation > best[0]):
            best = (generation, ends)
    return best


def missing_end(
    ends: Sequence[End], last_seq: int, hash_at: Callable[[int], str | None]
) -> End | None:
    """The recorded end a volume fails to reach, or ``None`` when it reaches one.

    A volume reaches an end ``(n, hash, count)`` when it holds record ``n`` with that
    hash: it may hold more (records appended since the head was written, in the
    current turn or before a crash). ``hash_at(n)`` gives the hash of record ``n``
    when the caller has it at hand, ``None`` when finding it would cost a read (the
    record's presence is then enough here; full reads check the hash).
    """
    for end in ends:
        seq, digest, _ = end
        if seq <= last_seq:
            known = hash_at(seq)
            if known is None or known == digest:
                return None
    return ends[-1]
