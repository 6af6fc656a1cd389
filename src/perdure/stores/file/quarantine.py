"""Quarantine recovery's rule: which journal lines are provably bad (SPEC §7.1).

Pure: :func:`triage` sorts a damaged session's lines into records to keep, lines
to move out and gaps; the store moves the bytes and reports a
:class:`SessionRecoveryReport`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from perdure.session.rules import chain_hash
from perdure.stores.file import journal
from perdure.stores.file.journal import GENESIS


@dataclass(frozen=True)
class SessionRecoveryReport:
    """What quarantine recovery found in a session: counts and positions, no content.

    Line numbers count from 1 across the session's files in order (sealed segments
    first, then the active journal), as they were before the repair.
    """

    session_id: str
    quarantined: int
    positions: tuple[int, ...]
    """Line numbers of the moved records."""
    kinds: tuple[str, ...]
    """Why each was moved: ``bad_line`` (no record), ``bad_hash`` (its bytes were
    altered) or ``unverifiable`` (it follows missing records and nothing after it
    vouches for it)."""
    quarantine_path: str | None
    """The file the records were moved to; ``None`` when none was moved."""
    gaps: tuple[tuple[int, int], ...] = ()
    """``(line, count)``: ``count`` records were missing from the files just before
    that line (lines deleted by hand, say), as the line's sequence number and the
    record after it prove (at the end of a file, as its number alone says; that line
    is then moved as ``unverifiable``). Nothing can bring them back; the records
    around the gap are kept and chained anew."""
    rebuilt: tuple[str, ...] = ()
    """Files written again from the records on disk, which vouch for them
    (``manifest.json``, when it was lost and the sealed segments verify); no record
    moves for that."""


def triage(
    lines: list[bytes],
) -> tuple[list[dict[str, Any]], list[tuple[int, str]], list[tuple[int, int]]]:
    """Sort journal lines into good bodies, provably bad lines and gaps (SPEC §7.1).

    Returns the bodies to keep, ``(line, kind)`` for each line to move, and
    ``(line, count)`` for each place where ``count`` records are missing; line
    numbers count from 1.

    A line is good when it hashes to its claimed hash from the previous good hash.
    When it does not, the lines around it decide, assuming one fault at a time:

    - the next line chains to the hash the line's bytes actually give: only its
      stored hash was altered and the body is authentic (kept);
    - its sequence number skips ahead and the next line chains to its stored hash
      with the following number: the records in between are missing, and the line
      is as written (kept, the gap reported; see
      :func:`~perdure.stores.file.journal.records_missing_before`). At the end of the
      file nothing vouches for it: moved as ``unverifiable``, the gap reported;
    - the line before it was no record at all (a garbled line) and the next line
      chains to its stored hash with the following number: the garbled line was its
      predecessor, so it is as written (kept; at the end of the file, moved as
      ``unverifiable``);
    - otherwise its body was altered (``bad_hash``), or it is no record
      (``bad_line``): moved.
    """
    good: list[dict[str, Any]] = []
    bad: list[tuple[int, str]] = []
    missing: list[tuple[int, int]] = []
    prev = GENESIS
    expected = 0  # the sequence number the next record should carry
    after_garbage = False  # the previous line was no record
    for number, line in enumerate(lines, start=1):
        claimed = journal.peek_hash(line)
        body_json = b"{" + line[journal.BODY_AT :] if claimed is not None else b""
        actual = chain_hash(prev, body_json) if claimed is not None else None
        try:
            body = json.loads(line) if claimed is not None else None
        except ValueError:
            body = None
        seq = body.get("n") if isinstance(body, dict) else None
        if type(seq) is not int:
            seq = None
        nxt = lines[number] if number < len(lines) else None
        if claimed is None or not isinstance(body, dict):
            bad.append((number, "bad_line" if claimed is None else "bad_hash"))
            if claimed is not None:
                prev = claimed
            expected += 1
            after_garbage = claimed is None
            continue
        assert actual is not None
        nxt_claim = journal.peek_hash(nxt) if nxt is not None else None
        if actual == claimed or (
            nxt is not None
            and nxt_claim is not None
            and chain_hash(actual, b"{" + nxt[journal.BODY_AT :]) == nxt_claim
        ):
            good.append(body)  # intact, or only its stored hash was damaged
            prev = actual
            expected = (seq if seq is not None else expected) + 1
        elif nxt is not None and (gap := journal.records_missing_before(line, expected, nxt)):
            missing.append((number, gap))
            good.append(body)
            prev = claimed
            expected += gap + 1
        elif nxt is None and seq is not None and seq > expected:
            # The last line says records are missing before it, but nothing after it
            # vouches for its bytes: report the gap, keep the line aside.
            missing.append((number, seq - expected))
            bad.append((number, "unverifiable"))
            prev = claimed
            expected = seq + 1
        elif (
            after_garbage
            and nxt is not None
            and journal.records_missing_before(line, expected - 1, nxt) == 1
        ):
            # Its successor vouches for it as for a record after a one-record gap,
            # and the garbled line before it fills that gap.
            good.append(body)
            prev = claimed
            expected += 1
        else:
            # After a garbled line, a last line cannot be told from an altered one.
            unverifiable = after_garbage and nxt is None and seq == expected
            bad.append((number, "unverifiable" if unverifiable else "bad_hash"))
            prev = claimed
            expected += 1
        after_garbage = False
    return good, bad, missing
