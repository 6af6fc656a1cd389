"""The ``snapshot_latest`` log (format 2): its records, and damage to them (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.errors import SessionCorruptedError, SnapshotError
from perdure.snapshots.format import Manifest, Part, encode_json, encode_message, manifest_blob
from perdure.snapshots.log import (
    LOG_BYTES,
    LogHead,
    LogState,
    append_record,
    end_of,
    new_log,
    parse_latest,
    replay,
)

META = encode_json({"schema_version": "1.0", "scope": "agent", "app_data": {}}, "metadata")
SHA = "ab" * 32


def msg(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"m{i} é\n"}]}


def fields(version: int) -> bytes:
    return encode_json({"state": {"v": version}, "model_state": {}}, "fields")


@dataclass
class Written:
    """A log written record by record, with the state each record left."""

    blob: bytes
    ends: list[int]  # the log's size after each record
    states: list[LogState]
    messages: list[list[Any]]  # the inline messages of each state
    head: LogHead


def state(
    inline: tuple[bytes, ...],
    *,
    at: str = "2025-01-01T00:00:00+00:00",
    version: int = 0,
    skip: int = 0,
    parts: tuple[Part, ...] = (),
    meta: bytes = META,
) -> LogState:
    sealed = sum(count for _, count, _ in parts)
    return LogState(
        at=at,
        meta=meta,
        fields=fields(version),
        count=sealed - skip + len(inline),
        skip=skip,
        parts=parts,
        inline=inline,
    )


def write(states: list[LogState]) -> Written:
    blob, head = new_log(states[0])
    ends = [len(blob)]
    for new in states[1:]:
        line, head = append_record(head, new)
        blob += line
        ends.append(len(blob))
    decoded = [[json.loads(m) for m in s.inline] for s in states]
    return Written(blob, ends, states, decoded, head)


def check(manifest: Manifest, written: LogState, messages: list[Any]) -> None:
    assert manifest.inline == messages
    assert manifest.count == written.count
    assert manifest.skip == written.skip
    assert manifest.parts == list(written.parts)
    assert manifest.meta["created_at"] == written.at
    assert manifest.fields == json.loads(written.fields)
    assert manifest.chain_ref is None
    assert manifest.index_ref is None


def growing() -> Written:
    """Four saves: 2 messages, +1, +1 with new fields, then a seal (3 dropped, parts)."""
    m = [encode_message(msg(i), i) for i in range(6)]
    s1 = state((m[0], m[1]))
    s2 = state((*s1.inline, m[2]), at="2025-01-01T00:00:01+00:00")
    s3 = state((*s2.inline, m[3]), at="2025-01-01T00:00:02+00:00", version=1)
    s4 = state((m[3], m[4], m[5]), version=1, parts=((0, 3, SHA),))
    return write([s1, s2, s3, s4])


# ----------------------------------------------------------------- writing


def test_a_new_log_is_the_header_and_one_full_record() -> None:
    first = state((encode_message(msg(0), 0),))
    blob, head = new_log(first)
    header, record, rest = blob.split(b"\n")
    assert header == b"perdure-snapshot/2"
    assert rest == b""
    body = json.loads(record)
    assert set(body) == {"at", "m", "f", "n", "a", "h"}
    assert (head.size, head.base, head.count) == (len(blob), len(blob), 1)
    assert blob.endswith(head.tail)
    assert len(head.tail) == 41
    replayed = replay(blob, "k")
    check(replayed.manifest, first, [msg(0)])
    assert replayed.head is not None
    assert (replayed.head.size, replayed.head.hash) == (head.size, head.hash)
    assert replayed.torn == 0


def test_a_record_holds_only_what_changed() -> None:
    written = growing()
    lines = written.blob.split(b"\n")[1:-1]
    assert [sorted(json.loads(line)) for line in lines] == [
        ["a", "at", "f", "h", "m", "n"],
        ["a", "at", "h", "n"],  # one message more
        ["a", "at", "f", "h", "n"],  # and the fields changed
        ["a", "at", "d", "h", "n", "p"],  # three sealed away, two added
    ]
    assert json.loads(lines[1])["a"] == [msg(2)]
    assert json.loads(lines[3])["d"] == 3


def test_every_record_boundary_replays_to_the_state_written_there() -> None:
    written = growing()
    for end, saved, messages in zip(written.ends, written.states, written.messages, strict=True):
        replayed = replay(written.blob[:end], "k")
        check(replayed.manifest, saved, messages)
        assert replayed.head is not None
        assert replayed.end.tail == written.blob[end - 41 : end]


def test_an_edit_of_the_last_messages_cuts_them_and_adds_the_new_ones() -> None:
    m = [encode_message(msg(i), i) for i in range(4)]
    first = state((m[0], m[1], m[2]))
    edited = encode_message({"role": "user", "content": [{"text": "[redacted]"}]}, 2)
    second = state((m[0], m[1], edited, m[3]))
    written = write([first, second])
    record = json.loads(written.blob.split(b"\n")[2])
    assert record["c"] == 1
    assert record["a"] == [json.loads(edited), msg(3)]
    check(replay(written.blob, "k").manifest, second, [*written.messages[1]])


def test_messages_are_found_by_their_encoding_not_their_object() -> None:
    m = [encode_message(msg(i), i) for i in range(3)]
    first = state((m[0], m[1]))
    copies = tuple(bytearray(b).decode().encode() for b in m)  # equal, but other objects
    assert copies[0] is not m[0]
    again = state(copies)  # the same two messages, and a third
    record = json.loads(write([first, again]).blob.split(b"\n")[2])
    assert "d" not in record
    assert "c" not in record
    assert record["a"] == [msg(2)]
    # A message that repeats an earlier one still makes a correct patch.
    twice = state((m[0], m[1], m[0]))
    later = state((m[0], m[2]))  # the first two sealed away, say, then one added
    written = write([twice, later])
    check(replay(written.blob, "k").manifest, later, [msg(0), msg(2)])


def test_bytes_values_and_metadata_round_trip() -> None:
    image = {
        "role": "user",
        "content": [{"image": {"format": "png", "source": {"bytes": b"\x00"}}}],
    }
    meta = encode_json(
        {"schema_version": "1.0", "scope": "agent", "app_data": {"raw": b"\x01"}}, "metadata"
    )
    first = LogState(
        at="2025-01-01T00:00:00+00:00",
        meta=meta,
        fields=encode_json({"state": {"blob": b"\x02"}}, "fields"),
        count=1,
        skip=0,
        parts=(),
        inline=(encode_message(image, 0),),
    )
    manifest = replay(new_log(first)[0], "k").manifest
    assert manifest.inline == [image]
    assert manifest.fields == {"state": {"blob": b"\x02"}}
    assert manifest.meta["app_data"] == {"raw": b"\x01"}


def test_the_log_is_started_afresh_past_its_size_limit() -> None:
    m = encode_message(msg(0), 0)
    blob, head = new_log(state((m,)))
    assert not head.due()
    inline: tuple[bytes, ...] = (m,)
    while not head.due():
        inline = (*inline, encode_message(msg(len(inline)), len(inline)))
        line, head = append_record(head, state(inline))
        blob += line
    assert LOG_BYTES <= len(blob) < LOG_BYTES + 200
    big = state((encode_message({"role": "user", "content": [{"text": "x" * LOG_BYTES}]}, 0),))
    _, head = new_log(big)
    assert not head.due()  # a log is never due before it doubled its first record


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # messages dropped from the front
            st.integers(0, 2),  # cut from the back
            st.integers(0, 4),  # added
            st.booleans(),  # the fields change
            st.booleans(),  # the sealed parts change
        ),
        min_size=1,
        max_size=12,
    )
)
def test_any_sequence_of_saves_replays_to_each_state(steps: list[Any]) -> None:
    made = 0

    def fresh(count: int) -> tuple[bytes, ...]:
        nonlocal made
        out = tuple(encode_message(msg(made + i), made + i) for i in range(count))
        made += count
        return out

    states = [state(fresh(2))]
    version, sealed = 0, 0
    for drop, cut, add, change_fields, change_parts in steps:
        old = states[-1].inline
        drop = min(drop, len(old))
        cut = min(cut, len(old) - drop)
        version += change_fields
        sealed += change_parts
        parts = ((0, sealed, SHA),) if sealed else ()
        inline = (*old[drop : len(old) - cut], *fresh(add))
        states.append(state(inline, version=version, parts=parts, skip=sealed // 2))
    written = write(states)
    for end, saved, messages in zip(written.ends, written.states, written.messages, strict=True):
        check(replay(written.blob[:end], "k").manifest, saved, messages)


# ------------------------------------------------------------------ damage


def outcome(blob: bytes) -> tuple[int, bool] | None:
    """(count, torn) when ``blob`` reads as a log; None when it is refused as damaged."""
    try:
        manifest, replayed = parse_latest(blob, "k")
    except (SessionCorruptedError, SnapshotError):
        return None
    assert replayed is not None
    return manifest.count, replayed.torn > 0


def test_every_flipped_bit_is_refused_or_changes_nothing() -> None:
    written = growing()
    blob = written.blob
    full = replay(blob, "k").manifest
    for position in range(len(blob)):
        for bit in (0x01, 0x20, 0x80):
            damaged = bytearray(blob)
            damaged[position] ^= bit
            try:
                manifest, _ = parse_latest(bytes(damaged), "k")
            except (SessionCorruptedError, SnapshotError):
                continue
            # Only the last newline may change and leave the record whole.
            assert position == len(blob) - 1, (position, bit)
            assert manifest == full


def test_a_log_cut_anywhere_reads_as_a_saved_state_or_is_refused() -> None:
    written = growing()
    blob = written.blob
    for cut in range(len(blob)):
        got = outcome(blob[:cut])
        if cut < written.ends[0] - 1:  # not even the first record: nothing to restore
            assert got is None, cut
            continue
        # The last complete record's state; a record cut short of only its newline
        # is complete.
        done = max(i for i, end in enumerate(written.ends) if end - 1 <= cut)
        assert got is not None
        assert got[0] == written.states[done].count, cut
        assert got[1] == (cut not in (end - 1 for end in written.ends) and cut not in written.ends)


def test_a_torn_end_is_readable_but_not_appendable() -> None:
    written = growing()
    torn = written.blob[: written.ends[2] + 7]
    replayed = replay(torn, "k")
    assert replayed.torn == 7
    assert replayed.head is None
    assert replayed.manifest.count == written.states[2].count
    assert replayed.end.size == len(torn)
    assert replayed.end.tail == torn  # the whole blob: no record end to name it


def test_a_record_that_does_not_add_up_is_corruption() -> None:
    m = encode_message(msg(0), 0)
    bad = LogState(
        at="2025-01-01T00:00:00+00:00",
        meta=META,
        fields=fields(0),
        count=5,  # holds one message
        skip=0,
        parts=(),
        inline=(m,),
    )
    with pytest.raises(SessionCorruptedError, match="counts 5 messages"):
        replay(new_log(bad)[0], "k")


def test_a_log_without_a_complete_record_or_header_is_corruption() -> None:
    blob = growing().blob
    for damaged in (b"perdure-snapshot/2\n", blob[:30], b"perdure-snapshot/2 \n" + blob[19:]):
        with pytest.raises(SessionCorruptedError):
            parse_latest(damaged, "k")
    with pytest.raises(SnapshotError, match="perdure-snapshot/3"):
        parse_latest(blob.replace(b"snapshot/2", b"snapshot/3", 1), "k")


def test_a_format_one_manifest_still_parses() -> None:
    manifest = manifest_blob(
        {"schema_version": "1.0", "scope": "agent", "created_at": "x", "app_data": {}},
        fields_json=fields(0),
        count=1,
        skip=0,
        parts=[],
        chain_ref=None,
        inline=[encode_message(msg(0), 0)],
    )
    parsed, replayed = parse_latest(manifest, "k")
    assert replayed is None
    assert parsed.inline == [msg(0)]
    end = end_of(manifest)
    assert (end.size, end.tail, end.head) == (len(manifest), manifest, None)
