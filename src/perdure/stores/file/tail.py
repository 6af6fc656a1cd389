"""The end of a session's active journal: what an append needs to know (SPEC §7.1).

A :class:`Tail` is what the file store caches per session between appends (valid
while the journal's inode and size match): the hash and sequence number the next
record chains on from, the message count, and the last message as written, so a
turn's appends neither read the journal nor re-encode what it holds. The rest
encodes an append's lines and finds a journal's last line from its end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perdure.stores.file import journal
from perdure.stores.file.journal import End
from perdure.stores.file.layout import open_regular

TAIL_READ = 8 * 1024  # bytes read from a journal's end to find its last line


@dataclass
class Tail:
    """Cached end of a session's active journal (valid while inode and size match)."""

    ino: int
    size: int
    hash: str
    next_seq: int
    count: int
    records: int
    """Records in the active journal."""
    last: tuple[Any, ...] = ()
    """The last message as this store wrote it (and redacted it), stored form; () unknown."""

    def after(
        self,
        ino: int,
        written: int,
        last_hash: str,
        next_seq: int,
        bodies: Sequence[dict[str, Any]],
    ) -> Tail:
        """The tail once ``bodies`` (``written`` bytes ending at ``last_hash``) are appended.

        It keeps the last message in its stored form, and its redaction, for the
        next commit's :func:`~perdure.session.rules.check_extends`.
        """
        count = bodies[-1]["c"]
        last = self.last if count == self.count else ()
        for body in bodies:
            if body["t"] == "m" and body["c"] == count:
                last = (body["m"],)
            elif body["t"] == "r" and body["i"] == count - 1 and last:
                last = (*last, body["m"])
        return Tail(
            ino, self.size + written, last_hash, next_seq, count, self.records + len(bodies), last
        )


def end_of(tail: Tail) -> End:
    """Where ``tail`` ends the journal, as a head file records it."""
    return (tail.next_seq - 1, tail.hash, tail.count)


Encoded = tuple[bytes, str, int]  # journal lines, last hash, next sequence number


def encode_records(tail: Tail, bodies: Sequence[dict[str, Any]]) -> Encoded:
    """The journal lines of ``bodies``, chained on from ``tail``."""
    chunks: list[bytes] = []
    prev, seq = tail.hash, tail.next_seq
    for body in bodies:
        line, prev = journal.encode_record(prev, {"n": seq, **body})
        chunks.append(line)
        seq += 1
    return b"".join(chunks), prev, seq


def read_tail(path: Path) -> bytes:
    """The end of ``path``, long enough to hold its last complete line."""
    with open_regular(path) as handle:
        size = handle.seek(0, os.SEEK_END)
        chunk = TAIL_READ
        while True:
            handle.seek(max(0, size - chunk))
            data = handle.read()
            if chunk >= size or data.count(b"\n") >= 2:
                return data
            chunk *= 4


def last_line(data: bytes, prev_hash: str) -> bytes | None:
    """The last complete record line in ``data`` (a file's end, as :func:`read_tail`
    reads it), or ``None`` when there is none; ``prev_hash`` is what the file's first
    record chains to.

    A last record that lost its newline counts (see :func:`journal.complete_tail`),
    so the count a listing shows is the count a full read finds.
    """
    cut = data.rfind(b"\n")
    before = data[journal.last_line_start(data[: cut + 1]) : cut] if cut >= 0 else None
    fragment = data[cut + 1 :]
    if fragment:
        prev = prev_hash if before is None else journal.peek_hash(before)
        complete = journal.complete_tail(fragment, prev) if prev is not None else None
        if complete is not None:
            return complete[0]
    return before
