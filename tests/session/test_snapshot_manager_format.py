"""Snapshot blob formats and the chunk layout (pure; no storage)."""

from __future__ import annotations

import copy
import json
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.errors import SessionCorruptedError, SnapshotError
from perdure.snapshots.format import (
    encode_json,
    encode_message,
    fields_chunk,
    index_chunk,
    manifest_blob,
    messages_chunk,
    node_chunk,
    parse_chunk,
    parse_manifest,
    sha256_hex,
    tail_chunk,
)
from perdure.snapshots.layout import (
    CHAIN_DEPTH,
    FANOUT,
    SEAL_BYTES,
    Layout,
    build_tree,
    copy_message,
    plan_save,
)
from perdure.types import encode_bytes_values

META = {"schema_version": "1.0", "scope": "agent", "created_at": "2025-01-01T00:00:00+00:00"}


def msg(i: int, size: int = 40) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"{i} " * size}]}


# ------------------------------------------------------------------- chunks


def test_a_small_chunk_is_plain_json_and_a_large_one_is_compressed() -> None:
    small = messages_chunk([encode_message(msg(1, 2), 0)])
    assert small.startswith(b"perdure-chunk/1\n{")
    large = messages_chunk([encode_message(msg(i), i) for i in range(20)])
    assert large.startswith(b"perdure-chunk/1 zlib\n")
    body = zlib.decompress(large.split(b"\n", 1)[1])
    assert body.startswith(b'{"kind":"messages"')
    assert parse_chunk(large, sha256_hex(large), "k")["messages"] == [msg(i) for i in range(20)]


def test_chunks_are_deterministic() -> None:
    fragments = [encode_message(msg(i), i) for i in range(10)]
    assert messages_chunk(fragments) == messages_chunk(list(fragments))
    assert node_chunk(1, [(3, "a" * 64)]) == node_chunk(1, [(3, "a" * 64)])


def test_bytes_values_round_trip_through_chunks_and_manifests() -> None:
    image = {
        "role": "user",
        "content": [{"image": {"format": "png", "source": {"bytes": b"\x89PNG\x00\xff"}}}],
    }
    blob = tail_chunk(None, [encode_message(image, 0)])
    assert parse_chunk(blob, sha256_hex(blob), "k")["messages"] == [image]
    manifest = manifest_blob(
        {**META, "app_data": {"raw": b"\x01"}},
        fields_json=encode_json({"state": {"blob": b"\x02"}}, "fields"),
        count=1,
        skip=0,
        parts=[],
        chain_ref=None,
        inline=[encode_message(image, 0)],
    )
    parsed = parse_manifest(manifest, "k")
    assert parsed.inline == [image]
    assert parsed.fields == {"state": {"blob": b"\x02"}}
    assert parsed.meta["app_data"] == {"raw": b"\x01"}


def test_every_chunk_kind_parses() -> None:
    sha = "b" * 64
    for blob, kind in [
        (node_chunk(2, [(10, sha)]), "node"),
        (index_chunk([(1, 10, sha), (0, 2, sha)]), "index"),
        (tail_chunk(sha, [encode_message(msg(0), 0)]), "tail"),
        (fields_chunk(encode_json({"state": {}}, "fields")), "fields"),
    ]:
        assert parse_chunk(blob, sha256_hex(blob), "k")["kind"] == kind


def test_a_chunk_whose_hash_does_not_match_is_corrupted() -> None:
    blob = messages_chunk([encode_message(msg(0), 0)])
    with pytest.raises(SessionCorruptedError, match="sha256") as info:
        parse_chunk(blob, "0" * 64, "chunks/x")
    assert info.value.code == "session_store_corrupted"
    with pytest.raises(SessionCorruptedError, match="missing"):
        parse_chunk(None, "0" * 64, "chunks/x")


@pytest.mark.parametrize(
    ("blob", "error"),
    [
        (b"perdure-chunk/2\n{}", SnapshotError),
        (b"something else\n{}", SessionCorruptedError),
        (b"perdure-chunk/1 zlib\nnot zlib", SessionCorruptedError),
        (b"perdure-chunk/1\n{not json", SessionCorruptedError),
        (b"perdure-chunk/1\n[]", SessionCorruptedError),
        (b'perdure-chunk/1\n{"kind":"weird"}', SessionCorruptedError),
        (b'perdure-chunk/1\n{"kind":"messages","messages":[1]}', SessionCorruptedError),
        (b'perdure-chunk/1\n{"kind":"node","level":0,"parts":[[1,"x"]]}', SessionCorruptedError),
        (b'perdure-chunk/1\n{"kind":"index","parts":[[0,1,"xyz"]]}', SessionCorruptedError),
        (b'perdure-chunk/1\n{"kind":"tail","prev":"q","messages":[]}', SessionCorruptedError),
    ],
)
def test_bad_chunks_are_refused(blob: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_chunk(blob, sha256_hex(blob), "chunks/x")


def test_json_errors_name_what_failed() -> None:
    with pytest.raises(SnapshotError, match=r"messages\[3\]"):
        encode_message({"role": "user", "content": [{"text": {1, 2}}]}, 3)
    with pytest.raises(SnapshotError, match="fields"):
        encode_json({"x": float("nan")}, "fields")
    # A lone surrogate is escaped rather than refused, and round-trips.
    odd = {"role": "user", "content": [{"text": "a\udc80b"}]}
    blob = messages_chunk([encode_message(odd, 0)])
    assert parse_chunk(blob, sha256_hex(blob), "k")["messages"] == [odd]


# ---------------------------------------------------------------- manifests


def _manifest(**overrides: Any) -> bytes:
    options: dict[str, Any] = {
        "fields_json": b'{"state":{}}',
        "count": 1,
        "skip": 0,
        "parts": [(0, 3, "c" * 64)],
        "chain_ref": None,
        "inline": [encode_message(msg(0), 0)],
    }
    options.update(overrides)
    return manifest_blob({**META, "app_data": {}}, **options)


def test_manifest_round_trip_both_shapes() -> None:
    parsed = parse_manifest(_manifest(), "latest")
    assert (parsed.count, parsed.skip, parsed.parts, parsed.inline) == (
        1,
        0,
        [(0, 3, "c" * 64)],
        [msg(0)],
    )
    assert parsed.fields == {"state": {}}
    other = parse_manifest(
        _manifest(
            fields_json=None,
            fields_ref="d" * 64,
            parts=None,
            index_ref="e" * 64,
            chain_ref="f" * 64,
            inline=[],
        ),
        "snapshots/x",
    )
    assert (other.fields, other.fields_ref, other.parts, other.index_ref, other.chain_ref) == (
        None,
        "d" * 64,
        None,
        "e" * 64,
        "f" * 64,
    )


def test_a_manifest_starts_with_its_format_and_checksum() -> None:
    header = _manifest().split(b"\n", 1)[0]
    assert header.startswith(b"perdure-snapshot/1 crc32=")


def test_a_flipped_byte_in_a_manifest_is_detected() -> None:
    blob = bytearray(_manifest())
    blob[-20] ^= 0x01
    with pytest.raises(SessionCorruptedError, match="checksum"):
        parse_manifest(bytes(blob), "latest")


@pytest.mark.parametrize(
    ("blob", "error", "match"),
    [
        (b"perdure-snapshot/2 crc32=00000000\n{}", SnapshotError, "perdure-snapshot/2"),
        (b"garbage", SessionCorruptedError, "header"),
        (b"", SessionCorruptedError, "header"),
    ],
)
def test_bad_manifests(blob: bytes, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse_manifest(blob, "latest")


def test_a_manifest_with_a_bad_shape_is_corrupted() -> None:
    body = b'{"snapshot":{},"messages":{}}'
    blob = f"perdure-snapshot/1 crc32={zlib.crc32(body):08x}\n".encode() + body
    with pytest.raises(SessionCorruptedError, match="lacks"):
        parse_manifest(blob, "latest")


# --------------------------------------------------------------------- tree


@given(st.integers(min_value=0, max_value=2000))
def test_tree_covers_every_chunk_in_order(n: int) -> None:
    level0 = [(i % 5 + 1, f"{i:064x}") for i in range(n)]
    top, nodes = build_tree(level0)
    assert sum(count for _, count, _ in top) == sum(count for count, _ in level0)
    levels = [level for level, _, _ in top]
    assert levels == sorted(levels, reverse=True)
    for level in set(levels):
        assert levels.count(level) < FANOUT
    # Expanding the top gives back the level-0 list.
    parsed = {sha: parse_chunk(blob, sha, sha) for sha, blob in nodes.items()}
    flat: list[tuple[int, str]] = []

    def expand(level: int, count: int, sha: str) -> None:
        if level == 0:
            flat.append((count, sha))
            return
        for child_count, child in parsed[sha]["parts"]:
            expand(level - 1, child_count, child)

    for part in top:
        expand(*part)
    assert flat == level0
    assert build_tree(level0) == (top, nodes)


# ------------------------------------------------------------------- layout


def test_an_append_only_history_writes_each_message_into_one_sealed_chunk() -> None:
    messages: list[Any] = []
    layout: Layout | None = None
    written: dict[str, bytes] = {}
    for i in range(600):
        messages.append(msg(i, 200))
        plan = plan_save(layout, list(messages), snapshot=False)
        assert set(plan.chunks) - set(written) <= set(plan.chunks)
        new = {sha: blob for sha, blob in plan.chunks.items() if sha not in written}
        sealed = [b for b in new.values() if b"messages" in zlib.decompress(b.split(b"\n", 1)[1])]
        assert len(sealed) <= 1
        written.update(new)
        layout = plan.layout
        assert plan.count == i + 1
    assert layout is not None
    assert len(layout.parts) > 3
    sealed = [m for part in layout.parts for m in part.messages]
    tail = [entry.obj for entry in layout.tail]
    assert sealed + tail == messages
    assert sum(len(e.encoded) for e in layout.tail) < SEAL_BYTES + 2000


def test_an_in_place_edit_of_a_tail_message_is_seen() -> None:
    messages = [msg(i) for i in range(5)]
    plan = plan_save(None, list(messages), snapshot=False)
    messages[-1]["content"][0]["text"] = "redacted"
    again = plan_save(plan.layout, list(messages), snapshot=False)
    assert b"redacted" in again.inline[-1]


def test_owned_messages_are_their_own_copies_and_replacements_are_still_seen() -> None:
    # An orchestrator's records (owned: made by the manager, never edited in place)
    # are not deep-copied to compare with later; an agent's messages are.
    messages = [msg(i) for i in range(5)]
    owned = plan_save(None, list(messages), snapshot=False, owned=True)
    assert all(entry.copy is entry.obj for entry in owned.layout.tail)
    copied = plan_save(None, list(messages), snapshot=False)
    assert not any(entry.copy is entry.obj for entry in copied.layout.tail)
    # What an owner does do, replace or drop a message, is written as for any history.
    replaced = [*messages[:-1], {"role": "user", "content": [{"text": "another"}]}]
    again = plan_save(owned.layout, replaced, snapshot=False, owned=True)
    assert b"another" in again.inline[-1]
    assert again.count == 5
    shorter = plan_save(again.layout, replaced[:3], snapshot=False, owned=True)
    assert shorter.count == 3
    assert [e.obj for e in shorter.layout.tail] == replaced[:3]


def test_a_replaced_sealed_message_reseals_from_there() -> None:
    messages = [msg(i, 400) for i in range(400)]
    plan = plan_save(None, list(messages), snapshot=False)
    assert len(plan.layout.parts) >= 3
    messages[5] = copy.deepcopy(messages[5])
    messages[5]["content"][0]["text"] = "changed"
    again = plan_save(plan.layout, list(messages), snapshot=False)
    assert again.layout.parts[0].sha != plan.layout.parts[0].sha
    assert plan.layout.parts[0].sha in again.dropped
    flat = [m for p in again.layout.parts for m in p.messages] + [e.obj for e in again.layout.tail]
    assert flat == messages


def test_an_equal_copy_of_a_sealed_message_keeps_the_chunk() -> None:
    messages = [msg(i, 400) for i in range(400)]
    plan = plan_save(None, list(messages), snapshot=False)
    messages[5] = copy.deepcopy(messages[5])
    again = plan_save(plan.layout, list(messages), snapshot=False)
    assert [p.sha for p in again.layout.parts] == [p.sha for p in plan.layout.parts]
    assert not again.chunks.keys() - plan.chunks.keys()


def test_a_trimmed_prefix_only_moves_skip() -> None:
    messages = [msg(i, 400) for i in range(400)]
    plan = plan_save(None, list(messages), snapshot=False)
    first = plan.layout.parts[0]
    trimmed = messages[3:]
    again = plan_save(plan.layout, trimmed, snapshot=False)
    assert again.layout.parts[0].sha == first.sha
    assert again.layout.skip == 3
    assert not again.chunks.keys() - plan.chunks.keys()
    whole = len(first.messages)
    past = plan_save(again.layout, messages[whole + 2 :], snapshot=False)
    assert past.layout.parts[0].sha == plan.layout.parts[1].sha
    assert past.layout.skip == 2
    assert first.sha in past.dropped


def test_an_unrelated_history_starts_over() -> None:
    plan = plan_save(None, [msg(i) for i in range(10)], snapshot=False)
    other = [msg(i + 100) for i in range(3)]
    again = plan_save(plan.layout, other, snapshot=False)
    assert [e.obj for e in again.layout.tail] == other


def test_snapshots_chain_deltas_and_seal_before_the_chain_gets_too_deep() -> None:
    messages: list[Any] = []
    layout: Layout | None = None
    depths = []
    for i in range(CHAIN_DEPTH * 3):
        messages.append(msg(i, 3))
        plan = plan_save(layout, list(messages), snapshot=True)
        layout = plan.layout
        depths.append(len(layout.chain))
        assert plan.inline == []
        new_tails = [b for b in plan.chunks.values() if b.startswith(b"perdure-chunk/1\n")]
        assert all(len(b) < 400 for b in new_tails)  # only the delta, not the whole tail
    assert max(depths) == CHAIN_DEPTH
    assert layout is not None
    assert layout.parts  # sealed at least once
    assert [m for p in layout.parts for m in p.messages] + [e.obj for e in layout.tail] == messages


def test_trimming_an_unsealed_history_reuses_the_encoded_tail() -> None:
    messages = [msg(i) for i in range(10)]
    plan = plan_save(None, list(messages), snapshot=False)
    assert not plan.layout.parts
    again = plan_save(plan.layout, messages[3:], snapshot=False)
    assert [id(e) for e in again.layout.tail] == [id(e) for e in plan.layout.tail[3:]]
    assert again.inline == plan.inline[3:]


def test_gc_pauses_nest_and_restore_the_previous_state() -> None:
    import gc

    from perdure.snapshots.io import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=4)
    | st.sampled_from(["__bytes_encoded__", '"__x', "é"])
)
_key = st.text(max_size=4) | st.sampled_from(["__bytes_encoded__", "__attachment__", "data"])
_value = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(_key, inner, max_size=3)
    ),
    max_leaves=12,
)


@given(_value)
def test_encoding_is_the_stored_form_whichever_path_it_takes(value: Any) -> None:
    # The walk is skipped when nothing needs it; the bytes must be those of the walk.
    walked = json.dumps(
        encode_bytes_values(value), allow_nan=False, ensure_ascii=False, separators=(",", ":")
    )
    assert encode_json(value, "v") == walked.encode("utf-8")


def test_a_tail_copy_shares_no_container_with_the_message() -> None:
    class Tagged(dict):  # type: ignore[type-arg]
        pass

    message = {
        "role": "user",
        "content": [
            {"text": "hi", "n": 1, "f": 0.5, "b": b"\x00", "none": None, "yes": True},
            {"json": {"nested": [1, [2, {"x": bytearray(b"ab")}]], "pair": (1, [2])}},
            Tagged(k=[1]),
        ],
    }
    copied = copy_message(message)
    assert copied == message
    assert copied["content"][0]["text"] is message["content"][0]["text"]  # leaves shared
    message["content"][0]["text"] = "edited"
    message["content"][1]["json"]["nested"][1][1]["x"][0] = 0x7A
    message["content"][1]["json"]["pair"][1].append(3)
    message["content"][2]["k"].append(2)
    assert copied["content"][0]["text"] == "hi"
    assert copied["content"][1]["json"]["nested"][1][1]["x"] == bytearray(b"ab")
    assert copied["content"][1]["json"]["pair"] == (1, [2])
    assert copied["content"][2] == {"k": [1]}
    assert type(copied["content"][2]) is Tagged
