"""The journal format's pure functions: encoding, verification and decoding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.stores.file.journal import (
    GENESIS,
    JournalDamage,
    Record,
    chain_hash,
    encode_record,
    peek_hash,
    scan,
)


def lines_of(bodies: list[dict[str, Any]], prev: str = GENESIS) -> tuple[bytes, str]:
    out = []
    for body in bodies:
        line, prev = encode_record(prev, body)
        out.append(line)
    return b"".join(out), prev


def message_body(n: int, text: str = "hi") -> dict[str, Any]:
    return {"n": n, "c": n + 1, "t": "m", "m": {"role": "user", "content": [{"text": text}]}}


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(st.lists(texts, min_size=1, max_size=20), st.sampled_from([True, False]))
def test_records_round_trip_with_offsets_lengths_and_hashes(texts: list[str], verify: bool) -> None:
    data, last = lines_of([message_body(i, t) for i, t in enumerate(texts)])
    scanned = scan(data, verify=verify)
    assert scanned.last_hash == last
    assert scanned.end == len(data)
    assert not scanned.torn
    assert [r.body["m"]["content"][0]["text"] for r in scanned.records] == texts
    lines = data.splitlines(keepends=True)
    assert [r.offset for r in scanned.records] == [
        sum(map(len, lines[:i])) for i in range(len(lines))
    ]
    assert [r.length for r in scanned.records] == [len(line) for line in lines]
    assert [r.seq for r in scanned.records] == list(range(len(texts)))
    assert all(type(r) is Record and r.type == "m" for r in scanned.records)
    # ``encoded`` is a hint that errs towards decoding: a text may look like a marker.
    assert all(r.encoded for r, t in zip(scanned.records, texts, strict=True) if t.startswith("__"))
    assert not any(r.encoded for r, t in zip(scanned.records, texts, strict=True) if "_" not in t)
    assert scanned.records[-1].hash == last


def test_base_offset_and_first_seq_apply_to_every_record() -> None:
    bodies = [message_body(n) for n in (7, 8, 9)]
    data, _ = lines_of(bodies)
    scanned = scan(data, first_seq=7, base_offset=1000, verify=False)
    starts = [0, data.index(b"\n") + 1, data.index(b"\n", data.index(b"\n") + 1) + 1]
    assert [r.offset for r in scanned.records] == [1000 + start for start in starts]
    assert [r.seq for r in scanned.records] == [7, 8, 9]


def test_only_lines_with_encoded_values_are_flagged() -> None:
    encoded = message_body(1)
    encoded["m"]["content"] = [{"image": {"source": {"bytes": {"__bytes__": "AAEC"}}}}]
    data, _ = lines_of([message_body(0), encoded, message_body(2)])
    assert [r.encoded for r in scan(data).records] == [False, True, False]


def test_a_valid_last_line_without_its_newline_is_kept_and_a_torn_one_is_not() -> None:
    data, last = lines_of([message_body(0), message_body(1)])
    kept = scan(data[:-1])
    assert len(kept.records) == 2
    assert not kept.torn
    assert kept.last_hash == last
    assert kept.end == len(data) - 1
    torn = scan(data[:-5])
    assert len(torn.records) == 1
    assert torn.torn
    assert torn.end == data.index(b"\n") + 1


@pytest.mark.parametrize("verify", [True, False])
def test_a_record_out_of_sequence_is_named_with_its_offset(verify: bool) -> None:
    data, _ = lines_of([message_body(0), message_body(1), message_body(5)])
    with pytest.raises(JournalDamage) as info:
        scan(data, verify=verify)
    assert info.value.kind == "bad_sequence"
    assert info.value.seq == 5
    assert info.value.offset == data.index(b"\n", data.index(b"\n") + 1) + 1


@pytest.mark.parametrize(
    "body",
    [
        {"c": 1, "t": "m"},  # no sequence number
        {"n": 1, "c": "1", "t": "m"},  # count not an int
        {"n": 1, "c": 1, "t": "x"},  # unknown type
        {"n": 1.0, "c": 1, "t": "m"},  # equal to 1, but not an int
        {"n": True, "c": 1, "t": "m"},
        {"n": 1, "c": 1, "t": ["m"]},  # unhashable
        {"h": 1, "n": 1, "c": 1, "t": "m"},  # a second "h" key overrides the first
    ],
)
@pytest.mark.parametrize("verify", [True, False])
def test_a_record_with_bad_fields_is_a_bad_payload(body: dict[str, Any], verify: bool) -> None:
    first, prev = lines_of([message_body(0)])
    second, _ = lines_of([body], prev)
    with pytest.raises(JournalDamage) as info:
        scan(first + second, verify=verify)
    assert info.value.kind == "bad_payload"
    assert info.value.offset == len(first)


def test_invalid_json_under_a_valid_hash_is_named_by_line() -> None:
    first, prev = lines_of([message_body(0)])
    # A writer bug, not a flipped byte: the hash covers these bytes.
    body = b'{"n":1,"c":1,"t":"m","m":'
    second = b'{"h":"' + chain_hash(prev, body).encode() + b'",' + body[1:] + b"\n"
    with pytest.raises(JournalDamage) as info:
        scan(first + second)
    assert info.value.kind == "bad_payload"
    assert info.value.offset == len(first)
    assert "invalid JSON" in info.value.detail


def test_two_objects_on_one_line_are_not_two_records() -> None:
    body = b'{"n":0,"c":0,"t":"s","s":{}},{"n":1,"c":0,"t":"s","s":{}}'
    line = b'{"h":"' + chain_hash(GENESIS, body).encode() + b'",' + body[1:] + b"\n"
    with pytest.raises(JournalDamage) as info:
        scan(line)
    assert info.value.kind == "bad_payload"


def test_deleted_lines_are_named_missing_records_not_a_bad_hash() -> None:
    data, _ = lines_of([message_body(n, f"t{n}") for n in range(6)])
    lines = data.splitlines(keepends=True)
    for gone in ([2], [2, 3], [0]):
        kept = [line for i, line in enumerate(lines) if i not in gone]
        with pytest.raises(JournalDamage) as info:
            scan(b"".join(kept))
        first = gone[0]
        assert info.value.kind == "missing_record"
        assert info.value.offset == sum(len(line) for line in lines[:first])
        assert info.value.seq == first + len(gone)  # the intact record after the gap
        assert f"{len(gone)} record" in info.value.detail


def test_a_record_whose_sequence_number_was_altered_is_no_gap() -> None:
    data, _ = lines_of([message_body(n) for n in range(4)])
    lines = data.splitlines(keepends=True)
    # "n":2 -> "n":3 in the middle: its successor (record 3) does not continue it
    lines[2] = lines[2].replace(b'"n":2', b'"n":3')
    with pytest.raises(JournalDamage) as info:
        scan(b"".join(lines))
    assert info.value.kind == "bad_hash"
    # the last line has nothing after it to vouch: the kind stays what is proven
    lines = data.splitlines(keepends=True)
    with pytest.raises(JournalDamage) as info:
        scan(b"".join([*lines[:2], lines[3]]))
    assert info.value.kind == "bad_hash"
    assert "record 3 where 2 was expected" in info.value.detail


@given(st.integers(min_value=0, max_value=255).filter(lambda b: b != 0x0A))
def test_a_last_record_whose_newline_became_another_byte_is_complete(byte: int) -> None:
    data, last = lines_of([message_body(0), message_body(1)])
    scanned = scan(data[:-1] + bytes([byte]))
    assert not scanned.torn
    assert [r.seq for r in scanned.records] == [0, 1]
    assert scanned.last_hash == last
    assert scanned.end == len(data) - 1  # the writer replaces the one byte after it


def test_no_prefix_of_a_record_is_taken_for_a_complete_one() -> None:
    data, _ = lines_of([message_body(0), message_body(1)])
    first = data.index(b"\n") + 1
    for cut in range(first + 1, len(data) - 1):
        scanned = scan(data[:cut])
        assert scanned.torn
        assert [r.seq for r in scanned.records] == [0]


def test_a_hash_with_damaged_bytes_is_no_claim() -> None:
    data, last = lines_of([message_body(0)])
    line = data.rstrip(b"\n")
    assert peek_hash(line) == last
    at = line.index(last.encode())
    for damaged in (b"\xe1", b"G", b"\x00"):
        assert peek_hash(line[:at] + damaged + line[at + 1 :]) is None
