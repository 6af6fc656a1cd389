"""FileSessionStore on disk: journal format, torn tails, damage, quarantine, segments,
rewrites, attachments (SPEC §7.1)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import exit_code, fork_child, tool_call
from perdure import Agent, tool
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.maintenance import verify_store
from perdure.models import ScriptedModel
from perdure.session import (
    FileSessionStore,
    Segmentation,
    Session,
    SessionRecoveryReport,
    read_history_page,
)
from perdure.stores.file import journal as journal_module
from perdure.stores.file import layout
from perdure.stores.file import store as file_store_module
from perdure.stores.file import wal as wal_module
from perdure.stores.file.journal import GENESIS, chain_hash
from perdure.stores.memory import MemorySessionStore
from perdure.types import Message


def text(role: str, value: str) -> Message:
    return {"role": role, "content": [{"text": value}]}  # type: ignore[typeddict-item]


def conversation(n: int, prefix: str = "m") -> list[Message]:
    return [text("user" if i % 2 == 0 else "assistant", f"{prefix}{i}") for i in range(n)]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def journal_of(store: FileSessionStore, sid: str) -> Path:
    return store.session_dir(sid) / "journal.jsonl"


def filled(tmp_path: Path, n: int = 6, **options: Any) -> FileSessionStore:
    store = FileSessionStore(tmp_path / "data", **options)
    run(store.create("s"))
    run(store.commit("s", conversation(n), agent_state={"state": {"k": 1}}))
    return store


def test_layout_and_jq_readable_hash_chained_lines(tmp_path: Path) -> None:
    store = filled(tmp_path)
    sdir = store.session_dir("s")
    assert sorted(p.name for p in sdir.iterdir()) == ["head", "journal.jsonl", "meta.json"]
    assert json.loads((sdir / "meta.json").read_text())["session_id"] == "s"
    prev = GENESIS
    lines = journal_of(store, "s").read_bytes().splitlines()
    for line in lines:
        record = json.loads(line)  # plain JSON, one object per line
        body = b"{" + line[line.index(b'",') + 2 :]
        assert record["h"] == chain_hash(prev, body)
        prev = record["h"]
    messages = [json.loads(line)["m"] for line in lines if json.loads(line)["t"] == "m"]
    assert messages == conversation(6)  # the message is embedded as a JSON object


def test_torn_tail_at_every_byte_of_the_last_record_opens_cleanly(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    run(store.create("s"))
    head = store.session_dir("s") / "head"
    before = head.read_bytes()  # a crash in the middle of the commit leaves this head
    run(store.commit("s", conversation(6), agent_state={"state": {"k": 1}}))
    path = journal_of(store, "s")
    data = path.read_bytes()
    last_start = data.rfind(b"\n", 0, len(data) - 1) + 1
    for cut in range(last_start, len(data)):
        path.write_bytes(data[:cut])
        head.write_bytes(before)
        fresh = FileSessionStore(tmp_path / "data")
        record = run(fresh.get("s"))
        assert record.messages == conversation(6)  # the torn record was the state record
        # the next writer truncates the torn bytes and appends cleanly
        run(fresh.commit("s", conversation(7)))
        assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(7)
        path.write_bytes(data)


@pytest.mark.parametrize("newline", [b"", b" ", b"x", b"\x00", b"}"])
def test_a_last_record_whose_newline_was_lost_or_changed_is_kept(
    tmp_path: Path, newline: bytes
) -> None:
    store = FileSessionStore(tmp_path / "data")
    run(store.create("s"))
    run(store.commit("s", conversation(6)))  # the last record is message 5, fsynced
    path = journal_of(store, "s")
    data = path.read_bytes()
    path.write_bytes(data[:-1] + newline)
    reader = FileSessionStore(tmp_path / "data")
    assert run(reader.get("s")).messages == conversation(6)
    assert [m.message_count for m in run(reader.list())] == [6]
    page = run(reader.history_page("s", 0, 50))
    assert (page.total, page.messages) == (6, conversation(6))
    assert run(reader.history_page("s", 5, 1)).messages == conversation(6)[5:]
    # The next writer puts the newline back and appends after the record: never over it.
    run(reader.commit("s", conversation(7)))
    assert path.read_bytes().startswith(data)
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(7)


def test_torn_message_record_loses_only_that_unacknowledged_message(tmp_path: Path) -> None:
    store = filled(tmp_path)
    head = store.session_dir("s") / "head"
    before = head.read_bytes()  # a crash in the middle of the commit leaves this head
    run(store.commit("s", conversation(7)))
    path = journal_of(store, "s")
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    head.write_bytes(before)
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(6)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_byte_anywhere_is_corruption(tmp_path: Path, position: float, bit: int) -> None:
    base = tmp_path / f"flip-{position}-{bit}"
    store = FileSessionStore(base)
    run(store.create("s"))
    run(store.commit("s", conversation(5), agent_state={"state": {"k": "v"}}))
    path = journal_of(store, "s")
    data = bytearray(path.read_bytes())
    index = int(position * (len(data) - 1))  # any byte but the final newline
    data[index] ^= 1 << bit
    path.write_bytes(bytes(data))
    with pytest.raises(SessionCorruptedError) as info:
        run(FileSessionStore(base).get("s"))
    assert info.value.code == "session_store_corrupted"
    assert info.value.details["kind"] in {
        "bad_line",
        "bad_hash",
        "bad_payload",
        "bad_sequence",
        "broken_chain",
    }


def test_damage_in_the_middle_is_reported_with_its_position(tmp_path: Path) -> None:
    store = filled(tmp_path)
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:3])
    lines[3] = lines[3].replace(b"m2", b"mX")
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionCorruptedError) as info:
        run(FileSessionStore(tmp_path / "data").get("s"))
    assert info.value.details["offset"] == offset
    assert info.value.details["kind"] == "bad_hash"
    assert "journal.jsonl" in str(info.value)


def test_a_removed_middle_line_breaks_the_chain(tmp_path: Path) -> None:
    store = filled(tmp_path)
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[2]
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionCorruptedError):
        run(FileSessionStore(tmp_path / "data").get("s"))


def test_quarantine_moves_bad_records_out_and_reports(tmp_path: Path) -> None:
    store = filled(tmp_path)
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"m2", b"mX")  # message m2 altered in place
    path.write_bytes(b"".join(lines))
    reports: list[SessionRecoveryReport] = []
    quarantine = tmp_path / "quarantine"
    healing = FileSessionStore(
        tmp_path / "data",
        recovery="quarantine",
        on_recovery=reports.append,
        quarantine_dir=quarantine,
    )
    record = run(healing.get("s"))
    assert [m["content"][0]["text"] for m in record.messages] == ["m0", "m1", "m3", "m4", "m5"]
    assert record.agent_state == {"state": {"k": 1}}
    assert len(reports) == 1
    report = reports[0]
    assert (report.session_id, report.quarantined, report.positions) == ("s", 1, (4,))
    moved = Path(report.quarantine_path)
    assert moved.parent == quarantine / "s"
    assert b"mX" in moved.read_bytes()
    assert "mX" not in repr(report)  # counts and positions, no content
    # the session is healthy again for strict readers
    assert len(run(FileSessionStore(tmp_path / "data").get("s")).messages) == 5


def heal(tmp_path: Path) -> tuple[list[str], SessionRecoveryReport]:
    """Read session ``s`` through a quarantine store; its texts and the one report."""
    reports: list[SessionRecoveryReport] = []
    healing = FileSessionStore(tmp_path / "data", recovery="quarantine", on_recovery=reports.append)
    record = run(healing.get("s"))
    (report,) = reports
    return [m["content"][0]["text"] for m in record.messages], report


def test_quarantine_reports_deleted_lines_as_missing_and_keeps_what_follows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = filled(tmp_path)  # line 1: the creation record, lines 2-7: m0..m5, 8: state
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[3]  # m2 (line 4)
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionCorruptedError) as info:
        run(FileSessionStore(tmp_path / "data").get("s"))
    assert info.value.details["kind"] == "missing_record"
    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    with caplog.at_level("WARNING", logger="perdure"):
        texts, report = heal(tmp_path)
    assert "healed by quarantine" not in caplog.text  # the callback got the report
    with caplog.at_level("WARNING", logger="perdure"):
        run(FileSessionStore(tmp_path / "copy", recovery="quarantine").get("s"))
    assert "1 record(s) missing at lines [4]" in caplog.text  # a trace without a callback
    assert texts == ["m0", "m1", "m3", "m4", "m5"]  # m3, intact, is kept
    assert (report.quarantined, report.positions, report.kinds) == (0, (), ())
    assert report.gaps == ((4, 1),)  # one record missing before (old) line 4
    assert report.quarantine_path is None  # nothing was moved
    healed = run(FileSessionStore(tmp_path / "data").get("s"))
    assert healed.agent_state == {"state": {"k": 1}}
    assert len(healed.messages) == 5


def test_quarantine_keeps_the_record_after_a_garbled_line(tmp_path: Path) -> None:
    store = filled(tmp_path)
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"X" + lines[3][1:]  # m2's line is no record any more
    path.write_bytes(b"".join(lines))
    texts, report = heal(tmp_path)
    assert texts == ["m0", "m1", "m3", "m4", "m5"]  # m3 is vouched for by m4
    assert (report.positions, report.kinds, report.gaps) == ((4,), ("bad_line",), ())


def test_quarantine_sets_aside_a_last_line_nothing_vouches_for(tmp_path: Path) -> None:
    store = filled(tmp_path)
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[-2]  # m5: the state record after it is the last line
    path.write_bytes(b"".join(lines))
    texts, report = heal(tmp_path)
    assert texts == ["m0", "m1", "m2", "m3", "m4"]
    # the gap is reported, and the last line is moved, not called altered
    assert (report.positions, report.kinds, report.gaps) == ((7,), ("unverifiable",), ((7, 1),))
    assert report.quarantine_path is not None
    assert b'"state"' in Path(report.quarantine_path).read_bytes()


def test_quarantine_callback_failure_fails_the_read(tmp_path: Path) -> None:
    store = filled(tmp_path)
    path = journal_of(store, "s")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"garbage": true}\n'
    path.write_bytes(b"".join(lines))

    def refuse(report: SessionRecoveryReport) -> None:
        raise RuntimeError("operator said no")

    with pytest.raises(RuntimeError, match="operator said no"):
        run(FileSessionStore(tmp_path / "data", recovery="quarantine", on_recovery=refuse).get("s"))


def test_strict_is_the_default(tmp_path: Path) -> None:
    assert FileSessionStore(tmp_path).recovery == "strict"


def test_segments_seal_and_pages_read_only_what_they_need(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=10))
    run(store.create("s"))
    history: list[Message] = []
    for i in range(45):
        history.append(text("user" if i % 2 == 0 else "assistant", f"m{i}"))
        run(store.commit("s", history))
    sdir = store.session_dir("s")
    segments = sorted((sdir / "segments").iterdir())
    assert len(segments) == 4
    manifest = json.loads((sdir / "manifest.json").read_text())
    assert [entry["file"] for entry in manifest["segments"]] == [p.name for p in segments]
    assert run(store.get("s")).messages == history
    # a tail page does not touch sealed segments: damage one, the page still reads
    first = segments[0]
    first.write_bytes(first.read_bytes().replace(b"m1", b"mX"))
    page = run(read_history_page(store, "s", offset=40, limit=5))
    assert page.messages == history[40:]
    with pytest.raises(SessionCorruptedError):
        run(read_history_page(store, "s", offset=0, limit=5))
    with pytest.raises(SessionCorruptedError):
        run(store.get("s"))


def test_rewrite_returns_to_one_active_segment(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=5))
    run(store.create("s"))
    run(store.commit("s", conversation(20)))
    assert (store.session_dir("s") / "manifest.json").exists()
    run(store.commit("s", [text("user", "summary")], rewritten=True))
    sdir = store.session_dir("s")
    assert not (sdir / "manifest.json").exists()
    assert not (sdir / "segments").exists()
    assert run(store.get("s")).messages == [text("user", "summary")]


def test_interrupted_rewrite_rolls_back_before_its_commit_point(tmp_path: Path) -> None:
    store = filled(tmp_path)
    sdir = store.session_dir("s")
    (sdir / "rewrite.jsonl.tmp").write_bytes(b"half a volume")
    fresh = FileSessionStore(tmp_path / "data")
    assert run(fresh.get("s")).messages == conversation(6)
    run(fresh.commit("s", conversation(7)))
    assert not (sdir / "rewrite.jsonl.tmp").exists()
    assert run(fresh.get("s")).messages == conversation(7)


def test_interrupted_rewrite_rolls_forward_after_its_commit_point(tmp_path: Path) -> None:
    store = filled(tmp_path, segmentation=Segmentation(max_records=3))
    run(store.commit("s", [text("user", "summary")], rewritten=True))
    sdir = store.session_dir("s")
    committed = (sdir / "journal.jsonl").read_bytes()
    # Recreate the state of a crash right after the rename to rewrite.jsonl:
    # the old volume is still there beside the committed rewrite.
    other = filled(tmp_path / "old", segmentation=Segmentation(max_records=3))
    old = other.session_dir("s")
    for name in ["journal.jsonl", "manifest.json"]:
        if (old / name).exists():
            (sdir / name).write_bytes((old / name).read_bytes())
    if (old / "segments").exists():
        (sdir / "segments").mkdir(exist_ok=True)
        for segment in (old / "segments").iterdir():
            (sdir / "segments" / segment.name).write_bytes(segment.read_bytes())
    (sdir / "rewrite.jsonl").write_bytes(committed)
    reader = FileSessionStore(tmp_path / "data")
    assert run(reader.get("s")).messages == [text("user", "summary")]  # compacted stay gone
    run(reader.commit("s", [text("user", "summary"), text("assistant", "ok")]))
    assert not (sdir / "rewrite.jsonl").exists()
    assert not (sdir / "segments").exists()
    assert run(reader.get("s")).messages == [text("user", "summary"), text("assistant", "ok")]


def test_large_binaries_are_stored_once_as_attachments(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    run(store.create("s"))
    image = os.urandom(50_000)
    block = {"image": {"format": "png", "source": {"bytes": image}}}
    history: list[Message] = [
        {"role": "user", "content": [{"text": "one"}, block]},  # type: ignore[list-item]
        text("assistant", "seen"),
        {"role": "user", "content": [{"text": "same again"}, block]},  # type: ignore[list-item]
    ]
    run(store.commit("s", history))
    attachments = list((store.session_dir("s") / "attachments").iterdir())
    assert len(attachments) == 1
    assert attachments[0].read_bytes() == image
    assert journal_of(store, "s").stat().st_size < 3000  # referenced, not inlined
    assert run(store.get("s")).messages == history
    # Flip the last byte (setting it to 0 changed nothing when it was 0 already: 1 in 256).
    attachments[0].write_bytes(image[:-1] + bytes([image[-1] ^ 0xFF]))
    with pytest.raises(SessionCorruptedError, match="attachment"):
        run(FileSessionStore(tmp_path / "data").get("s"))


def test_a_rewrite_deletes_the_attachments_only_the_old_history_named(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    run(store.create("s"))

    def with_image(label: str, image: bytes) -> Message:
        block = {"image": {"format": "png", "source": {"bytes": image}}}
        return {"role": "user", "content": [{"text": label}, block]}  # type: ignore[list-item]

    dropped, kept, shared = (os.urandom(5000) for _ in range(3))
    history = [
        with_image("dropped", dropped),
        text("assistant", "a"),
        with_image("shared", shared),
        text("assistant", "b"),
        with_image("kept", kept),
        text("assistant", "c"),
    ]
    run(store.commit("s", history))
    attachments = store.session_dir("s") / "attachments"
    foreign = attachments / "notes.txt"  # not a digest: not ours to delete
    foreign.write_text("keep me")
    assert len(list(attachments.iterdir())) == 4
    # A text that quotes a reference verbatim must not keep the file alive.
    quoted = json.dumps({"__attachment__": hashlib.sha256(dropped).hexdigest()})
    compacted = [
        text("user", f"summary {quoted}"),
        text("assistant", "ok"),
        with_image("shared again", shared),  # the same bytes as a dropped message
        *history[3:],
    ]
    run(store.commit("s", compacted, rewritten=True))
    assert sorted(p.name for p in attachments.iterdir()) == sorted(
        [hashlib.sha256(kept).hexdigest(), hashlib.sha256(shared).hexdigest(), "notes.txt"]
    )
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == compacted


@pytest.mark.parametrize("durability", ["commit", "invocation", "none"])
def test_durability_modes_store_the_same_history(tmp_path: Path, durability: Any) -> None:
    store = FileSessionStore(tmp_path / durability, durability=durability)
    run(store.create("s"))
    run(store.commit("s", conversation(4)))
    run(store.flush("s"))
    assert run(FileSessionStore(tmp_path / durability).get("s")).messages == conversation(4)


def test_bad_options_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        FileSessionStore(tmp_path, durability="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="recovery"):
        FileSessionStore(tmp_path, recovery="lenient")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="segmentation"):
        FileSessionStore(tmp_path, segmentation=10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_checkpoints"):
        FileSessionStore(tmp_path, max_checkpoints=0)


def test_unreadable_meta_is_corruption_not_absence(tmp_path: Path) -> None:
    store = filled(tmp_path)
    (store.session_dir("s") / "meta.json").write_text("{not json")
    with pytest.raises(SessionCorruptedError, match=r"meta\.json"):
        run(FileSessionStore(tmp_path / "data").get("s"))


def session_with_checkpoint(tmp_path: Path) -> tuple[FileSessionStore, dict[str, bytes]]:
    """Session "s": two turns through a real agent and a checkpoint; its files' bytes."""
    store = FileSessionStore(tmp_path / "data")
    session = Session(store, "s")
    agent = Agent(model=ScriptedModel(["one", "two"]), session_manager=session)
    agent("q1")
    agent("q2")
    run(session.checkpoint("before"))
    sdir = store.session_dir("s")
    return store, {str(p.relative_to(sdir)): p.read_bytes() for p in sdir.rglob("*.json*")}


def test_a_missing_meta_json_is_corruption_never_absence_nor_a_wipe(tmp_path: Path) -> None:
    store, files = session_with_checkpoint(tmp_path)
    history = run(store.get("s")).messages
    created = run(store.get("s")).meta.created_at
    sdir = store.session_dir("s")
    (sdir / "meta.json").unlink()
    fresh = FileSessionStore(tmp_path / "data")
    with pytest.raises(SessionCorruptedError, match=r"meta\.json is missing") as info:
        run(fresh.get("s"))
    assert info.value.code == "session_store_corrupted"
    with pytest.raises(SessionCorruptedError):
        Session.resume(fresh, "s")
    with pytest.raises(SessionCorruptedError):
        run(fresh.history_page("s", 0, 10))
    with pytest.raises(SessionCorruptedError):
        run(fresh.commit("s", [*history, text("user", "more")]))
    with pytest.raises(SessionCorruptedError):
        run(store.commit("s", [*history, text("user", "more")]))  # a cached tail too
    with pytest.raises(SessionCorruptedError):
        run(fresh.create("s", exist_ok=True))
    with pytest.raises(SessionCorruptedError):
        run(fresh.create("s"))
    with pytest.raises(SessionCorruptedError):  # open-or-create restores, never re-creates
        Agent(model=ScriptedModel(["x"]), session_manager=Session(fresh, "s"))
    # Nothing was deleted or changed.
    left = {str(p.relative_to(sdir)): p.read_bytes() for p in sdir.rglob("*.json*")}
    assert left == {name: data for name, data in files.items() if name != "meta.json"}
    # Listed, marked damaged.
    (listed,) = run(fresh.list())
    assert listed.session_id == "s"
    assert listed.damaged is not None
    assert "meta.json" in listed.damaged
    # Rebuilt from the journal: the same session again.
    assert run(fresh.rebuild_meta("s")) is True
    assert run(fresh.rebuild_meta("s")) is False
    record = run(FileSessionStore(tmp_path / "data").get("s"))
    assert (record.messages, record.meta.created_at) == (history, created)


def test_only_what_an_interrupted_create_leaves_reads_as_no_session(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    run(store.create("s"))
    sdir = store.session_dir("s")
    (sdir / "meta.json").unlink()  # create died before writing meta.json
    (sdir / f".meta.json.{'ab' * 16}.tmp").write_bytes(b"{")
    assert run(store.list()) == []
    with pytest.raises(SessionNotFoundError):
        run(store.get("s"))
    run(store.create("s"))  # clears its own leftovers
    assert run(store.get("s")).messages == []
    assert sorted(p.name for p in sdir.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("extra", ["attachments/x", "notes.txt", "segments/000001.jsonl"])
def test_a_create_never_deletes_what_it_did_not_write(tmp_path: Path, extra: str) -> None:
    store = FileSessionStore(tmp_path / "data")
    run(store.create("s"))
    sdir = store.session_dir("s")
    (sdir / "meta.json").unlink()
    (sdir / extra).parent.mkdir(exist_ok=True)
    (sdir / extra).write_bytes(b"keep me")
    with pytest.raises(SessionCorruptedError):
        run(store.create("s", exist_ok=True))
    assert (sdir / extra).read_bytes() == b"keep me"
    assert [m.damaged is not None for m in run(store.list())] == [True]


def turns(tmp_path: Path, n: int = 3, **options: Any) -> tuple[FileSessionStore, list[Message]]:
    """Session "s" after ``n`` turns of a real agent (each turn ends by writing the head)."""
    store = FileSessionStore(tmp_path / "data", **options)
    agent = Agent(
        model=ScriptedModel([f"a{i}" for i in range(n)]), session_manager=Session(store, "s")
    )
    for i in range(n):
        agent(f"q{i}")
    return store, run(store.get("s")).messages


def assert_truncation_is_damage(root: Path) -> None:
    store = FileSessionStore(root)
    journal = store.session_dir("s") / "journal.jsonl"
    before = journal.read_bytes() if journal.exists() else None
    with pytest.raises(SessionCorruptedError, match="acknowledged records are missing") as info:
        run(store.get("s"))
    assert info.value.details["kind"] == "truncated"
    # The offset says where the journal now ends, not a placeholder.
    assert info.value.details["offset"] == (len(before) if before is not None else 0)
    with pytest.raises(SessionCorruptedError):
        run(store.history_page("s", 0, 50))
    with pytest.raises(SessionCorruptedError):
        run(store.get("s", offset=1))  # the windowed read a resume makes
    with pytest.raises(SessionCorruptedError):
        Session.resume(store, "s")
    with pytest.raises(SessionCorruptedError):
        run(store.commit("s", conversation(40)))
    (listed,) = run(store.list())
    assert listed.damaged is not None
    # The writer touched nothing: no truncation "healed", nothing appended.
    assert (journal.read_bytes() if journal.exists() else None) == before


@pytest.mark.parametrize("durability", ["commit", "invocation", "none"])
def test_a_journal_cut_at_any_line_boundary_is_damage_not_a_shorter_session(
    tmp_path: Path, durability: Any
) -> None:
    store, history = turns(tmp_path, durability=durability)
    path = journal_of(store, "s")
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    for keep in range(len(lines)):
        path.write_bytes(b"".join(lines[:keep]))
        assert_truncation_is_damage(tmp_path / "data")
    path.write_bytes(data)
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == history


def test_a_deleted_journal_or_head_is_damage(tmp_path: Path) -> None:
    store, _ = turns(tmp_path)
    sdir = store.session_dir("s")
    journal = sdir / "journal.jsonl"
    data = journal.read_bytes()
    journal.unlink()
    assert_truncation_is_damage(tmp_path / "data")
    journal.write_bytes(data)
    (sdir / "head").unlink()
    with pytest.raises(SessionCorruptedError, match="head file is missing"):
        run(FileSessionStore(tmp_path / "data").get("s"))
    (sdir / "head").write_bytes(b"x" * 512)
    with pytest.raises(SessionCorruptedError, match="head file is unreadable"):
        run(FileSessionStore(tmp_path / "data").get("s"))


def test_a_sealed_session_cut_back_to_its_segments_is_damage(tmp_path: Path) -> None:
    store, _ = turns(tmp_path, n=5, segmentation=Segmentation(max_records=4))
    sdir = store.session_dir("s")
    assert (sdir / "manifest.json").exists()
    (sdir / "journal.jsonl").write_bytes(b"")
    assert_truncation_is_damage(tmp_path / "data")


def test_the_head_is_written_once_per_turn_and_only_after_the_journal(tmp_path: Path) -> None:
    store, history = turns(tmp_path, n=2)
    sdir = store.session_dir("s")
    head = journal_module.decode_head((sdir / "head").read_bytes())
    assert head is not None
    last = journal_of(store, "s").read_bytes().splitlines()[-1]
    (seq, digest, count) = head[1][-1]
    assert (seq, digest, count) == (json.loads(last)["n"], json.loads(last)["h"], len(history))
    # A torn slot (a crash in the middle of writing it) leaves the other one.
    generation = head[0]
    raw = bytearray((sdir / "head").read_bytes())
    at = (generation % 2) * journal_module.HEAD_SLOT
    raw[at : at + 10] = b"\x00" * 10
    (sdir / "head").write_bytes(bytes(raw))
    older = journal_module.decode_head(bytes(raw))
    assert older is not None
    assert older[0] == generation - 1
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == history


def test_either_volume_of_an_interrupted_rewrite_agrees_with_its_head(tmp_path: Path) -> None:
    store, history = turns(tmp_path)
    sdir = store.session_dir("s")
    old_volume = tmp_path / "old"
    shutil.copytree(sdir, old_volume)
    old_head = journal_module.decode_head((sdir / "head").read_bytes())
    run(store.commit("s", history[2:], rewritten=True))
    new_head = journal_module.decode_head((sdir / "head").read_bytes())
    assert old_head is not None
    assert new_head is not None
    assert len(new_head[1]) == 1  # the rewrite is complete: only the new end
    # Between the head naming both ends and the rename, a crash leaves the old volume;
    # after it, the new one. Either reads cleanly under a head naming both.
    both = journal_module.encode_head_slot(9, [*old_head[1], *new_head[1]])
    for volume, expected in ((old_volume, history), (sdir, history[2:])):
        target = tmp_path / "check" / "sessions" / "s"
        shutil.rmtree(target.parent.parent, ignore_errors=True)
        shutil.copytree(volume, target)
        (target / "head").write_bytes(both + both)
        assert run(FileSessionStore(tmp_path / "check").get("s")).messages == expected
    # And a head naming only the old end does not accept the new volume.
    (sdir / "head").write_bytes(journal_module.encode_head_slot(10, old_head[1]) * 2)
    with pytest.raises(SessionCorruptedError):
        run(FileSessionStore(tmp_path / "data").get("s"))


REWRITE_KILLED_AT_ITS_COMMIT_POINT = """
import asyncio, os, signal, sys
from perdure.session import FileSessionStore
from perdure.stores.file import store as fs_module

real_replace = os.replace
def replace(source, target):
    if str(source).endswith("rewrite.jsonl.tmp"):
        os.kill(os.getpid(), signal.SIGKILL)  # just before the rewrite's commit point
    real_replace(source, target)
fs_module.os.replace = replace

async def main():
    store = FileSessionStore(sys.argv[1])
    history = (await store.get("s")).messages
    await store.commit("s", history[-2:], rewritten=True)

asyncio.run(main())
"""


def test_rewrites_killed_before_their_commit_point_never_fake_damage(tmp_path: Path) -> None:
    _, history = turns(tmp_path)
    script = tmp_path / "rewrite.py"
    script.write_text(REWRITE_KILLED_AT_ITS_COMMIT_POINT)
    for _ in range(4):  # each leaves its new end in the head, the old volume in place
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "data")],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            check=False,
        )
        assert done.returncode == -signal.SIGKILL
        assert run(FileSessionStore(tmp_path / "data").get("s")).messages == history
    run(FileSessionStore(tmp_path / "data").commit("s", history[-2:], rewritten=True))
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == history[-2:]


def test_a_session_from_before_head_files_reads_and_gains_one(tmp_path: Path) -> None:
    store, history = turns(tmp_path)
    sdir = store.session_dir("s")
    (sdir / "head").unlink()
    meta = json.loads((sdir / "meta.json").read_bytes())
    del meta["head"], meta["sha256"]  # a meta.json as perdure 0.1 wrote it
    (sdir / "meta.json").write_text(json.dumps(meta))
    fresh = FileSessionStore(tmp_path / "data")
    assert run(fresh.get("s")).messages == history
    agent = Agent(model=ScriptedModel(["more"]), session_manager=Session(fresh, "s"))
    agent("again")
    assert (sdir / "head").exists()
    journal_of(fresh, "s").write_bytes(b"")
    with pytest.raises(SessionCorruptedError):
        run(FileSessionStore(tmp_path / "data").get("s"))


# ---------------------------------------------------------------- appends inside a turn


def without_commit_log(store: FileSessionStore) -> FileSessionStore:
    """``store`` syncing each journal itself: the path without the commit log (where
    the log is not made yet, or failed; tests/session/test_commit_log.py has the log's)."""
    store._commit_log = None
    return store


def count_kernel_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap the store's start_fsync (the real one still runs) and record each fd."""
    calls: list[int] = []
    real = file_store_module.start_fsync

    def counting(fd: int, executor: Any = None) -> Any:
        calls.append(fd)
        return real(fd, executor)

    monkeypatch.setattr(file_store_module, "start_fsync", counting)
    return calls


async def test_appends_in_a_held_turn_write_on_the_loop_and_sync_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_kernel_fsyncs(monkeypatch)
    store = without_commit_log(FileSessionStore(tmp_path / "data"))
    await store.create("s")
    history = conversation(10)
    async with store.writer_lock("s"):
        tail = None
        for end in range(1, 11):
            tail = (await store.commit("s", history[:end], expected_tail=tail)).tail
    # The first append reads the tail from disk on the writer thread; the other nine
    # are written on the loop and synced through start_fsync; the turn's end syncs
    # the head file once (another fd): one fsync per turn, none per message.
    assert len(calls) == 10
    assert len(set(calls[:9])) == 1
    assert calls[9] != calls[0]
    assert (await store.get("s")).messages == history
    assert (await FileSessionStore(tmp_path / "data").get("s")).messages == history


async def test_without_durability_inline_appends_never_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_kernel_fsyncs(monkeypatch)
    store = FileSessionStore(tmp_path / "data", durability="none")
    await store.create("s")
    async with store.writer_lock("s"):
        for end in range(1, 6):
            await store.commit("s", conversation(end))
    assert calls == []
    assert (await store.get("s")).messages == conversation(5)


async def test_an_inline_append_that_fills_the_segment_seals_it(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=3))
    await store.create("s")
    async with store.writer_lock("s"):
        for end in range(1, 12):
            await store.commit("s", conversation(end))
    sdir = store.session_dir("s")
    assert len(list((sdir / "segments").iterdir())) >= 3
    assert (await FileSessionStore(tmp_path / "data").get("s")).messages == conversation(11)
    page = await read_history_page(store, "s", offset=6, limit=4)
    assert page.messages == conversation(11)[6:10]


async def test_a_failed_inline_fsync_is_raised_and_the_tail_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = without_commit_log(FileSessionStore(tmp_path / "data"))
    await store.create("s")
    real = file_store_module.start_fsync

    def failing(fd: int, executor: Any = None) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(OSError(5, "Input/output error"))
        return future

    async with store.writer_lock("s"):
        await store.commit("s", conversation(2))
        monkeypatch.setattr(file_store_module, "start_fsync", failing)
        with pytest.raises(OSError, match="Input/output"):
            await store.commit("s", conversation(3))
        monkeypatch.setattr(file_store_module, "start_fsync", real)
        # The store forgot its cached tail: the next commit reads the journal again
        # (which holds the unsynced record) and appends only what is new.
        await store.commit("s", conversation(4))
    assert (await store.get("s")).messages == conversation(4)


async def test_inline_appends_to_two_sessions_on_one_loop(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    await asyncio.gather(store.create("a"), store.create("b"))

    async def turn(session_id: str) -> None:
        async with store.writer_lock(session_id):
            for end in range(1, 21):
                await store.commit(session_id, conversation(end, prefix=session_id))

    await asyncio.gather(turn("a"), turn("b"))
    assert (await store.get("a")).messages == conversation(20, prefix="a")
    assert (await store.get("b")).messages == conversation(20, prefix="b")


@pytest.mark.parametrize("log_ready", [False, True], ids=["journal-syncs", "log-syncs"])
def test_a_sessions_turn_appends_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_ready: bool
) -> None:
    # The path the agent really takes: Session holds the writer lock for the turn,
    # so after its first commit each message is written on the loop and synced apart.
    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        return key.upper()

    # A message's sync is its journal's, or the commit log's once the log is made
    # (on the writer thread, the first time a held append asks): both ways, made sure.
    calls = count_kernel_fsyncs(monkeypatch)
    log_syncs: list[int] = []
    real_log_sync = wal_module.start_fsync

    def counting_log_sync(
        fd: int, executor: Any = None, *, datasync: bool = False, offload: bool = False
    ) -> Any:
        log_syncs.append(fd)
        return real_log_sync(fd, executor, datasync=datasync)

    monkeypatch.setattr(wal_module, "start_fsync", counting_log_sync)
    store = FileSessionStore(tmp_path / "data")
    if log_ready:  # made now, as the writer thread makes it after the first ask
        assert store._commit_log is not None
        store._commit_log._state = "preparing"
        store._commit_log.prepare()
    else:
        without_commit_log(store)
    session = Session(store)
    agent = Agent(
        model=ScriptedModel([tool_call("t1", "lookup", key="a"), "A it is"]),
        tools=[lookup],
        session_manager=session,
    )
    agent("find a")
    assert len(agent.messages) == 4
    if log_ready:  # each inline message waits for a sync of the log, none of its journal
        assert len(log_syncs) >= 3
        assert not calls
    else:
        assert len(calls) >= 3
        assert not log_syncs
    stored = run(FileSessionStore(tmp_path / "data").get(session.session_id))
    assert stored.messages == agent.messages


@pytest.mark.parametrize("min_window", [64, None])
async def test_pages_match_the_reference_when_line_sizes_vary_wildly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, min_window: int | None
) -> None:
    # A page's first read window is sized from the file's average bytes per message;
    # a page of big messages after small ones (or the reverse), with state records in
    # between, needs the window to grow (forced often with a 64-byte margin). Every
    # page must equal the memory store's.
    if min_window is not None:
        monkeypatch.setattr(file_store_module, "_MIN_WINDOW", min_window)
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=40))
    reference = MemorySessionStore()
    history: list[Message] = []
    for store_ in (store, reference):
        await store_.create("s")
    for i in range(60):
        size = 6000 if (i // 10) % 2 else 8
        history.append(text("user" if i % 2 == 0 else "assistant", f"{i}:" + "x" * size))
        for store_ in (store, reference):
            await store_.commit("s", history, agent_state={"i": i} if i % 3 else None)
    for offset in range(0, 61, 4):
        for limit in (1, 5, 17, 60):
            got = await read_history_page(store, "s", offset=offset, limit=limit)
            want = await read_history_page(reference, "s", offset=offset, limit=limit)
            assert got == want


async def test_a_large_append_in_a_turn_goes_to_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_kernel_fsyncs(monkeypatch)
    store = without_commit_log(FileSessionStore(tmp_path / "data"))
    await store.create("s")
    history = conversation(2)
    async with store.writer_lock("s"):
        await store.commit("s", history[:1])  # reads the tail: writer thread
        await store.commit("s", history)  # small: inline
        history.append(text("user", "x" * (300 * 1024)))  # over 256 KiB: writer thread
        await store.commit("s", history)
        history.append(text("assistant", "ok"))  # inline again
        await store.commit("s", history)
    assert len(calls) == 3  # two inline appends, and the head at the turn's end
    assert (await FileSessionStore(tmp_path / "data").get("s")).messages == history


def test_turns_on_two_threads_loops_share_one_store(tmp_path: Path) -> None:
    # Each thread runs its own loop and holds its own session's lock: their inline
    # appends contend for the store's guard (the loser goes to the writer thread) and
    # their fsync completions may be reaped by either loop.
    store = FileSessionStore(tmp_path / "data")
    errors: list[BaseException] = []

    def turn(session_id: str) -> None:
        async def run_turn() -> None:
            await store.create(session_id)
            async with store.writer_lock(session_id):
                for end in range(1, 41):
                    await store.commit(session_id, conversation(end, prefix=session_id))

        try:
            asyncio.run(run_turn())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=turn, args=(sid,)) for sid in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    reopened = FileSessionStore(tmp_path / "data")
    for sid in ("a", "b", "c"):
        assert run(reopened.get(sid)).messages == conversation(40, prefix=sid)


# ---------------------------------------------------------------- sealed segment digests


def sealed(tmp_path: Path, n: int = 30) -> FileSessionStore:
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=10))
    run(store.create("s"))
    for end in range(1, n + 1):
        run(store.commit("s", conversation(end)))
    return store


def test_a_sealed_segment_is_verified_by_its_digest_not_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sealed(tmp_path)
    sdir = store.session_dir("s")
    manifest = json.loads((sdir / "manifest.json").read_text())
    assert all(len(entry["sha256"]) == 64 for entry in manifest["segments"])
    checked: list[int] = []
    real = journal_module._verify_line

    def counting(line: bytes, prev: str, offset: int) -> str:
        checked.append(offset)
        return real(line, prev, offset)

    monkeypatch.setattr(journal_module, "_verify_line", counting)
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(30)
    active = journal_of(store, "s").read_bytes().count(b"\n")
    assert len(checked) == active  # only the active journal, line by line


def test_a_flipped_byte_in_a_sealed_segment_is_named_as_before(tmp_path: Path) -> None:
    store = sealed(tmp_path)
    segment = sorted((store.session_dir("s") / "segments").iterdir())[1]
    data = bytearray(segment.read_bytes())
    at = data.index(b"m1") + 1
    data[at] ^= 0x01
    segment.write_bytes(bytes(data))
    with pytest.raises(SessionCorruptedError) as info:
        run(FileSessionStore(tmp_path / "data").get("s"))
    # the digest differs, so the lines are checked one by one and the bad one named
    assert info.value.details["kind"] == "bad_hash"
    assert info.value.details["file"] == str(segment)
    assert info.value.details["offset"] == data.rindex(b"\n", 0, at) + 1


def test_a_damaged_digest_in_the_manifest_is_corruption(tmp_path: Path) -> None:
    store = sealed(tmp_path)
    path = store.session_dir("s") / "manifest.json"
    manifest = json.loads(path.read_text())
    digest = manifest["segments"][0]["sha256"]
    manifest["segments"][0]["sha256"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    path.write_text(json.dumps(manifest))
    with pytest.raises(SessionCorruptedError, match="manifest digest"):
        run(FileSessionStore(tmp_path / "data").get("s"))


def test_manifests_without_digests_are_verified_line_by_line(tmp_path: Path) -> None:
    # Manifests sealed before segments carried a digest still read, the slow way.
    store = sealed(tmp_path)
    path = store.session_dir("s") / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["segments"]:
        del entry["sha256"]
    path.write_text(json.dumps(manifest))
    reader = FileSessionStore(tmp_path / "data")
    assert run(reader.get("s")).messages == conversation(30)
    run(reader.commit("s", conversation(45)))  # seals more, now with digests
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(45)


def test_a_deleted_session_leaves_through_the_trash_and_is_never_listed(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    for sid in ("a", "b", "c"):
        run(store.create(sid))
    sessions = tmp_path / "data" / "sessions"
    # A crash in the middle of an older delete left this inside sessions/.
    shutil.copytree(sessions / "a", sessions / f".deleted-a-{'0' * 32}")
    # A crash in the middle of a delete left this in the trash.
    trash = tmp_path / "data" / ".trash"
    shutil.copytree(sessions / "b", trash / "leftover")
    assert [m.session_id for m in run(store.list())] == ["a", "b", "c"]
    run(store.delete("b"))
    assert [m.session_id for m in run(store.list())] == ["a", "c"]
    assert list(trash.iterdir()) == []  # its own directory and the leftover are gone
    with pytest.raises(SessionNotFoundError):
        run(store.get("b"))


def test_listing_while_another_thread_deletes_never_fails(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data", durability="none")
    ids = [f"s{i:03}" for i in range(60)]
    for sid in ids:
        run(store.create(sid))
    stop = threading.Event()
    errors: list[BaseException] = []

    def delete_all() -> None:
        try:
            for sid in ids:
                run(store.delete(sid))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    deleter = threading.Thread(target=delete_all)
    deleter.start()
    listings = 0
    while not stop.is_set():
        listed = [m.session_id for m in run(store.list())]
        assert listed == sorted(listed)
        assert set(listed) <= set(ids)
        listings += 1
    deleter.join()
    assert errors == []
    assert listings > 0
    assert run(store.list()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_commits_through_its_own_writer_thread(tmp_path: Path) -> None:
    # The parent's commits started the store's writer thread; a child made by fork()
    # inherits the executor but not the thread, and used to wait on it for ever.
    store = filled(tmp_path, 2)
    run(store.commit("s", conversation(3)))

    def child() -> None:
        run(store.commit("s", conversation(4)))
        store.close()

    assert exit_code(fork_child(child)) == 0
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(4)
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_during_a_turn_sees_the_parents_appends(tmp_path: Path) -> None:
    # Within a writer-lock hold the store trusts the journal's end it remembers. A
    # child forked during the hold (here by a worker thread, as a tool could) does
    # not share its parent's hold: it is locked out like any other process, so its
    # stale append is refused, never a second record chained to the same place.
    store = filled(tmp_path, 2, durability="none")
    ready, go = os.pipe()

    def child(before: str) -> None:
        os.read(ready, 1)  # the parent has appended
        with pytest.raises(SessionLockedError):
            run(store.commit("s", conversation(4, "child"), expected_tail=before))

    async def turn() -> int:
        async with store.writer_lock("s"):
            before = (await store.commit("s", conversation(3))).tail  # remembered
            pid = await asyncio.to_thread(fork_child, lambda: child(before))
            await store.commit("s", conversation(4), expected_tail=before)
            os.write(go, b"x")
            return await asyncio.to_thread(exit_code, pid)

    assert run(turn()) == 0, "the child's stale append was not refused"
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == conversation(4)


async def test_a_commit_without_tail_finds_the_last_message_in_a_sealed_segment(
    tmp_path: Path,
) -> None:
    # The last stored message (and its redaction) may sit in a sealed segment, with
    # the active journal empty: the check of a tail-less commit reads it there.
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=3))
    await store.create("s")
    history = conversation(12)
    for end in range(1, 13):
        await store.commit("s", history[:end])
    diverged = [*history[:-1], text("assistant", "diverged")]
    with pytest.raises(SessionConflictError):
        await store.commit("s", diverged)
    other = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=3))
    with pytest.raises(SessionConflictError):
        await other.commit("s", diverged)
    await store.commit("s", history, redactions={11: text("assistant", "[redacted]")})
    await other.commit("s", [*history, text("user", "x")])  # as written
    seen = (await other.get("s")).messages
    assert seen[11] == text("assistant", "[redacted]")
    await FileSessionStore(tmp_path / "data").commit("s", [*seen, text("assistant", "y")])
    assert len((await store.get("s")).messages) == 14


def test_an_edited_creation_time_in_meta_json_is_damage(tmp_path: Path) -> None:
    store, history = turns(tmp_path)
    path = store.session_dir("s") / "meta.json"
    good = path.read_bytes()
    created = json.loads(good)["created_at"]
    for edited in (
        created.replace("T", "V"),
        created.replace(created[3], str((int(created[3]) + 1) % 10), 1),
    ):
        path.write_bytes(good.replace(created.encode(), edited.encode()))
        fresh = FileSessionStore(tmp_path / "data")
        with pytest.raises(SessionCorruptedError, match=r"meta\.json"):
            run(fresh.get("s"))
        (listed,) = run(fresh.list())
        assert listed.damaged is not None
        assert not run(verify_store(fresh)).clean
    path.write_bytes(good)
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == history


def test_a_flush_never_records_an_end_another_process_rewrote_away(tmp_path: Path) -> None:
    """A's cached tail from an earlier turn is stale once B rewrote the session: an
    empty turn of A that flushes must not write that old end into the head."""

    async def scenario() -> int:
        a = FileSessionStore(tmp_path / "data", durability="invocation")
        b = FileSessionStore(tmp_path / "data")
        await a.create("s")
        async with a.writer_lock("s"):
            await a.commit("s", conversation(3))
            await a.flush("s")
        async with b.writer_lock("s"):
            current = await b.get("s")
            await b.commit("s", conversation(1), rewritten=True, expected_tail=current.tail)
        async with a.writer_lock("s"):  # a turn that commits nothing, then flushes
            await a.flush("s")
        await a.flush("s")  # and a flush outside any turn
        return (await FileSessionStore(tmp_path / "data").get("s")).meta.message_count

    assert run(scenario()) == 1


def test_an_invocation_turn_records_its_flushed_end_in_the_head(tmp_path: Path) -> None:
    """With durability="invocation" the flush at a turn's end fsyncs the journal (on
    the open descriptor, no hop to a thread) and the head then names that end: every
    turn, including one that follows a flush outside any turn."""
    store = FileSessionStore(tmp_path / "data", durability="invocation")
    sdir = store.session_dir("s")

    async def turn(history: list[Message], count: int) -> None:
        async with store.writer_lock("s"):
            for _ in range(count):
                history.append(conversation(len(history) + 1)[-1])
                await store.commit("s", history)
            await store.flush("s")

    async def scenario() -> None:
        await store.create("s")
        history: list[Message] = []
        for count in (2, 3, 1):
            await turn(history, count)
            assert [end[2] for end in layout.head_ends(sdir)][-1] == len(history)
        history.append(conversation(len(history) + 1)[-1])
        await store.commit("s", history)  # outside a turn: a head of its own
        await store.flush("s")
        await turn(history, 2)
        assert [end[2] for end in layout.head_ends(sdir)][-1] == len(history)
        assert (await FileSessionStore(tmp_path / "data").get("s")).messages == history

    run(scenario())


def test_a_half_written_first_head_of_an_old_session_is_no_damage(tmp_path: Path) -> None:
    """A session from before head files gets its first head file at its next turn;
    a crash may leave that file empty. It was not required yet: no damage."""
    store, history = turns(tmp_path)
    sdir = store.session_dir("s")
    meta = json.loads((sdir / "meta.json").read_bytes())
    del meta["head"], meta["sha256"]  # a meta.json as perdure 0.1 wrote it
    (sdir / "meta.json").write_text(json.dumps(meta))
    (sdir / "head").write_bytes(b"")
    assert run(FileSessionStore(tmp_path / "data").get("s")).messages == history
    # once meta.json says a head is kept, an unreadable one is damage
    (sdir / "meta.json").write_bytes(layout.meta_bytes("s", meta["created_at"]))
    with pytest.raises(SessionCorruptedError, match="head file is unreadable"):
        run(FileSessionStore(tmp_path / "data").get("s"))


def test_a_session_stored_under_an_id_now_refused_is_listed_damaged(tmp_path: Path) -> None:
    """Ids starting with '.' or over 200 bytes were accepted before: such a session
    is listed and verified as damaged, never silently left out."""
    store, _ = turns(tmp_path)
    shutil.copytree(store.session_dir("s"), store.root / "sessions" / ".hidden")
    fresh = FileSessionStore(tmp_path / "data")
    listed = {m.session_id: m.damaged for m in run(fresh.list())}
    assert listed["s"] is None
    assert "rename the directory" in str(listed[".hidden"])
    report = run(verify_store(fresh))
    assert [(d.session_id, d.kind) for d in report.damage] == [(".hidden", "bad_id")]
    assert report.sessions_checked == 2


def test_two_stores_taking_turns_keep_the_head_at_the_newest_end(tmp_path: Path) -> None:
    """Each store remembers the head file it wrote so as not to decode it again; a head
    another writer changed meanwhile must be decoded, or the next slot would reuse a
    generation and the head would name an older end than the journal's."""
    first = FileSessionStore(tmp_path / "data")
    second = FileSessionStore(tmp_path / "data")
    sdir = first.session_dir("s")

    async def turn(store: FileSessionStore, history: list[Message]) -> None:
        async with store.writer_lock("s"):
            history.append(conversation(len(history) + 1)[-1])
            await store.commit("s", history)

    async def scenario() -> None:
        await first.create("s")
        history: list[Message] = []
        for store in (first, second, second, first, first, second, first):
            await turn(store, history)
            assert layout.head_ends(sdir)[-1][2] == len(history)
        assert (await FileSessionStore(tmp_path / "data").get("s")).messages == history

    run(scenario())


def test_a_turn_ends_without_waiting_for_its_head_fsync_and_a_failed_one_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The turn's messages are durable in the journal before its head is written; the
    head's own fsync runs behind the turn (a head left behind by a power loss is what a
    crash during the turn leaves anyway), and its failure is a warning, not an error."""
    store = without_commit_log(FileSessionStore(tmp_path / "data"))
    started: list[asyncio.Future[None]] = []
    real = file_store_module.start_fsync

    def held_head_fsync(fd: int, executor: Any) -> asyncio.Future[None]:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/head"):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            started.append(future)
            return future
        return real(fd, executor)

    monkeypatch.setattr(file_store_module, "start_fsync", held_head_fsync)

    async def scenario() -> None:
        await store.create("s")
        history = conversation(2)

        async def first_turn() -> None:
            async with store.writer_lock("s"):
                await store.commit("s", history)

        await asyncio.wait_for(first_turn(), 10)  # a turn that waited would never end
        assert len(started) == 1
        assert not started[0].done()
        assert layout.head_ends(store.session_dir("s"))[-1][2] == 2
        started[0].set_exception(OSError(5, "Input/output error"))
        await asyncio.sleep(0)
        history += conversation(4)[2:]
        async with store.writer_lock("s"):
            await store.commit("s", history)
        assert (await FileSessionStore(tmp_path / "data").get("s")).messages == history

    with caplog.at_level("WARNING"):
        run(scenario())
    assert "the fsync of its head file failed" in caplog.text
