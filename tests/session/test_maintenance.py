"""Store maintenance (SPEC §7, §9): verify every session, repair by quarantine, gc."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from session_stores import OPENED, STORE_KINDS, make_store

from helpers import set_created_at
from perdure import Agent, maintenance
from perdure.checkpoints.storage import StorageCheckpointStore
from perdure.checkpoints.store import FileCheckpointStore, MemoryCheckpointStore
from perdure.maintenance import (
    Damage,
    gc_store,
    parse_duration,
    repair_store,
    verify_store,
)
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.storage import LocalFileStorage
from perdure.stores.memory import MemorySessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing.checkpoints import put_aged

NOW = dt.datetime.now(dt.UTC)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def populate(store: SessionStore, ids: list[str], *, checkpoints: int = 1) -> None:
    """Two turns per session through a real agent, then ``checkpoints`` checkpoints."""
    for sid in ids:
        session = Session(store, sid)
        agent = Agent(
            model=ScriptedModel([f"{sid} answer 1", f"{sid} answer 2"]), session_manager=session
        )
        agent(f"{sid} question 1")
        agent(f"{sid} question 2")
        for i in range(checkpoints):
            run(session.checkpoint(f"mark {i}"))


def flip(path: Path, needle: bytes) -> int:
    """Flip one bit of the first byte of ``needle`` in ``path``; return the line's offset."""
    data = bytearray(path.read_bytes())
    at = data.index(needle)
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return data.rfind(b"\n", 0, at) + 1


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for a directory)."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def age(store: SessionStore, session_id: str, when: dt.datetime) -> None:
    """Make ``session_id`` look created and last updated at ``when``."""
    if isinstance(store, FileSessionStore):
        # updated_at is the journal's mtime, never earlier than meta.json's created_at
        set_created_at(store.session_dir(session_id), when.isoformat().replace("+00:00", "Z"))
        stamp = when.timestamp()
        os.utime(store.session_dir(session_id) / "journal.jsonl", (stamp, stamp))
    else:
        assert isinstance(store, SQLiteSessionStore)
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "UPDATE perdure_sessions SET updated_at = ? WHERE id = ?",
                (when.isoformat().replace("+00:00", "Z"), session_id),
            )
        conn.close()


# ----------------------------------------------------------------------------- verify


@pytest.mark.parametrize("kind", ["file", "sqlite", "memory", "postgres"])
def test_a_clean_store_verifies_clean(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    populate(store, ["a", "b", "c"], checkpoints=2)
    seen: list[tuple[int, int]] = []
    report = run(verify_store(store, progress=lambda done, total: seen.append((done, total))))
    assert report.clean
    assert (report.sessions_checked, report.checkpoints_checked) == (3, 6)
    assert report.damage == report.missing == ()
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert report.to_dict()["clean"] is True
    json.dumps(report.to_dict())


def test_a_flipped_byte_in_one_file_session_is_reported_with_its_position(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b", "c"])
    journal = store.session_dir("b") / "journal.jsonl"
    offset = flip(journal, b"b question 2")
    before = tree(tmp_path)
    report = run(verify_store(FileSessionStore(tmp_path / "data")))
    assert tree(tmp_path) == before  # verify only reads
    assert not report.clean
    assert report.damaged_sessions == ("b",)
    (damage,) = report.damage
    assert damage.kind == "bad_hash"
    assert (damage.file, damage.offset) == (str(journal), offset)
    assert damage.position == f"journal.jsonl byte {offset}"
    assert report.sessions_checked == 3  # the walk went on past the damage
    assert report.checkpoints_checked == 3


def test_a_changed_row_in_one_sqlite_session_is_reported_with_its_row(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "p.db")
    populate(store, ["a", "b", "c"])
    with sqlite3.connect(store.path) as conn:
        (sid,) = conn.execute("SELECT sid FROM perdure_sessions WHERE id = 'b'").fetchone()
        conn.execute(
            "UPDATE perdure_messages SET body = replace(body, 'question 2', 'question X') "
            "WHERE key = ?",
            ((sid << 32) + 2,),
        )
    conn.close()
    report = run(verify_store(SQLiteSessionStore(tmp_path / "p.db")))
    assert report.damaged_sessions == ("b",)
    (damage,) = report.damage
    assert (damage.kind, damage.row, damage.position) == ("bad_hash", 2, "row 2")
    assert report.sessions_checked == 3


def test_every_damaged_checkpoint_file_is_reported(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"], checkpoints=3)
    files = sorted((store.session_dir("a") / "checkpoints").iterdir())
    files[0].write_bytes(files[0].read_bytes()[:-20])  # truncated
    files[2].write_bytes(b"not json")
    report = run(verify_store(store))
    assert report.damaged_sessions == ("a",)
    assert [(d.kind, d.checkpoint_id) for d in report.damage] == [
        ("bad_checkpoint", files[0].stem),
        ("bad_checkpoint", files[2].stem),
    ]
    assert report.damage[0].position == f"checkpoint {files[0].stem}"
    assert report.checkpoints_checked == 6


def test_an_edited_checkpoint_file_is_reported_and_the_others_still_checked(
    tmp_path: Path,
) -> None:
    """ISSUE 14 item 5: an edit that keeps the JSON valid is caught by the sha256."""
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=3)
    files = sorted((store.session_dir("a") / "checkpoints").iterdir())
    files[1].write_bytes(files[1].read_bytes().replace(b"a answer 1", b"a answer 9"))
    json.loads(files[1].read_bytes())  # still well-formed JSON
    report = run(verify_store(store))
    assert [(d.session_id, d.kind, d.checkpoint_id, d.file) for d in report.damage] == [
        ("a", "bad_checkpoint", files[1].stem, str(files[1]))
    ]
    assert "sha256" in report.damage[0].detail
    assert report.checkpoints_checked == 3


def test_a_checkpoint_written_without_a_hash_is_reported_unsealed(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=1)
    (path,) = (store.session_dir("a") / "checkpoints").iterdir()
    path.write_bytes(unsealed(path.read_bytes()))
    report = run(verify_store(store))
    assert [(d.kind, d.checkpoint_id) for d in report.damage] == [
        ("unsealed_checkpoint", path.stem)
    ]


def unsealed(data: bytes) -> bytes:
    """A sealed checkpoint file rewritten as perdure 0.1 wrote it: format /1, no sha256."""
    record = json.loads(data)["record"]
    return json.dumps({"format": "perdure-checkpoint-record/1", **record}).encode()


def test_a_damaged_sqlite_checkpoint_is_reported(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "p.db")
    populate(store, ["a", "b"], checkpoints=2)
    (meta, _) = run(store.checkpoints.list("b"))
    with sqlite3.connect(store.path) as conn:
        conn.execute(
            "UPDATE perdure_checkpoints SET body = CAST('{}' AS BLOB) WHERE checkpoint_id = ?",
            (meta.checkpoint_id,),
        )
    conn.close()
    report = run(verify_store(SQLiteSessionStore(tmp_path / "p.db")))
    assert [(d.session_id, d.kind, d.checkpoint_id) for d in report.damage] == [
        ("b", "bad_checkpoint", meta.checkpoint_id)
    ]


@pytest.mark.parametrize("page_size", [2, 500])
def test_sessions_too_damaged_to_list_are_reported_and_the_walk_goes_on(
    page_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "PAGE_SIZE", page_size)
    store = FileSessionStore(tmp_path / "data")
    ids = [f"s{i:02d}" for i in range(9)]
    populate(store, ids, checkpoints=0)
    for sid in ("s03", "s04", "s07"):
        (store.session_dir(sid) / "meta.json").write_bytes(b"{broken")
    report = run(verify_store(store))
    assert report.damaged_sessions == ("s03", "s04", "s07")
    assert [Path(d.file or "").name for d in report.damage] == ["meta.json"] * 3
    # Every session counts, the damaged ones too: "3 of 9 damaged", never "3 of 6".
    assert report.sessions_checked == 9


def test_a_missing_meta_json_is_verified_repaired_and_never_expired(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b", "c"])
    before = run(store.get("b"))
    (store.session_dir("b") / "meta.json").unlink()
    report = run(verify_store(store))
    assert (report.sessions_checked, report.damaged_sessions) == (3, ("b",))
    assert Path(report.damage[0].file or "").name == "meta.json"
    gc = run(gc_store(store, ttl_seconds=1, dry_run=True, now=NOW + dt.timedelta(days=9)))
    assert [e.session_id for e in gc.expired] == ["a", "c"]  # never on guessed metadata
    assert [(s.session_id, s.code) for s in gc.skipped] == [("b", "session_store_corrupted")]
    plan = run(repair_store(store))
    assert [(s.session_id, s.status) for s in plan.sessions] == [("b", "would_repair")]
    assert not (store.session_dir("b") / "meta.json").exists()
    applied = run(repair_store(store, dry_run=False))
    assert [(s.session_id, s.status, s.quarantined) for s in applied.sessions] == [
        ("b", "repaired", 0)
    ]
    assert applied.clean
    after = run(FileSessionStore(tmp_path / "data").get("b"))
    assert (after.messages, after.meta.created_at) == (before.messages, before.meta.created_at)
    assert run(verify_store(store)).clean


def test_a_truncated_journal_is_reported_and_repair_accepts_the_loss_out_loud(
    tmp_path: Path,
) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"], checkpoints=0)
    journal = store.session_dir("b") / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:-2]))  # cut at a line boundary
    report = run(verify_store(store))
    assert report.damaged_sessions == ("b",)
    assert report.damage[0].kind == "truncated"
    plan = run(repair_store(store))
    (item,) = plan.sessions
    assert item.status == "would_repair"
    assert "acknowledged messages are lost" in str(item.detail)
    assert journal.read_bytes() == b"".join(lines[:-2])
    applied = run(repair_store(store, dry_run=False))
    assert [(s.session_id, s.status) for s in applied.sessions] == [("b", "repaired")]
    assert "accepted" in str(applied.sessions[0].detail)
    assert run(verify_store(FileSessionStore(tmp_path / "data"))).clean
    held = json.loads(lines[-3])["c"]  # what the journal still held
    assert len(run(store.get("b")).messages) == held < 4


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_lost_head_file_is_reported_and_rebuilt_from_the_journal(
    tmp_path: Path, damage: str
) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=0)
    before = run(store.get("a")).messages
    head = store.session_dir("a") / "head"
    if damage == "deleted":
        head.unlink()
    else:
        head.write_bytes(b"\x00" * 512)
    assert run(verify_store(store)).damaged_sessions == ("a",)
    applied = run(repair_store(store, dry_run=False))
    assert [(s.status, "head file was lost" in str(s.detail)) for s in applied.sessions] == [
        ("repaired", True)
    ]
    assert run(FileSessionStore(tmp_path / "data").get("a")).messages == before
    assert run(verify_store(store)).clean


def test_an_unreadable_database_is_store_level_damage(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    path.write_bytes(b"this is not a database" * 200)
    report = run(verify_store(SQLiteSessionStore(path)))
    (damage,) = report.damage
    assert (damage.session_id, damage.kind) == (None, "bad_database")
    assert report.damaged_sessions == ()
    assert not report.clean


def test_named_sessions_only_and_missing_ones_reported(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"])
    flip(store.session_dir("b") / "journal.jsonl", b"b answer 1")
    report = run(verify_store(store, session_ids=["a", "zz", "a"]))
    assert report.clean
    assert (report.sessions_checked, report.missing) == (1, ("zz",))
    with pytest.raises(ValueError):
        run(verify_store(store, session_ids=["../x"]))


def test_verify_refuses_a_store_that_heals_on_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="strict"):
        run(verify_store(FileSessionStore(tmp_path, recovery="quarantine")))


def test_damage_positions_read_well() -> None:
    assert Damage(
        "s", "bad_line", "x", file="/d/sessions/s/segments/000001.jsonl", offset=9
    ).position == ("segments/000001.jsonl byte 9")
    assert Damage("s", "bad_payload", "x", file="/d/sessions/s/meta.json").position == "meta.json"
    assert Damage(None, "bad_database", "x").position == "-"


# ----------------------------------------------------------------------------- repair


def damaged_file_store(tmp_path: Path) -> tuple[FileSessionStore, int]:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b", "c"])
    journal = store.session_dir("b") / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    flip(journal, b"b question 2")
    line = next(i for i, text in enumerate(lines, start=1) if b"b question 2" in text)
    return store, line


def test_repair_dry_run_writes_nothing_and_says_what_would_move(tmp_path: Path) -> None:
    store, line = damaged_file_store(tmp_path)
    before = tree(tmp_path)
    report = run(repair_store(tmp_path / "data"))
    assert tree(tmp_path) == before  # byte for byte, no new file either
    assert report.dry_run
    assert not report.clean
    (item,) = report.sessions
    assert (item.session_id, item.status, item.quarantined) == ("b", "would_repair", 1)
    assert (item.positions, item.kinds, item.quarantine_path) == ((line,), ("bad_hash",), None)
    assert item.damage.kind == "bad_hash"
    assert report.quarantine_dir == str(store.quarantine_dir)


def test_repair_apply_heals_and_reports_counts_and_positions_only(tmp_path: Path) -> None:
    store, line = damaged_file_store(tmp_path)
    quarantine = tmp_path / "quarantine"
    planned = run(repair_store(store, quarantine_dir=quarantine))
    report = run(repair_store(store, dry_run=False, quarantine_dir=quarantine))
    assert report.clean
    assert not report.dry_run
    (item,) = report.sessions
    assert (item.status, item.quarantined, item.positions) == ("repaired", 1, (line,))
    assert (planned.sessions[0].positions, planned.sessions[0].kinds) == (
        item.positions,
        item.kinds,
    )
    moved = Path(item.quarantine_path or "")
    assert moved.parent == quarantine / "b"
    assert b"question 2" in moved.read_bytes()  # the bad record is kept aside, not lost
    text = json.dumps(report.to_dict())
    assert "question" not in text  # counts and positions, no content
    assert "answer" not in text
    # a strict reader reads the healed session; the other sessions were not touched
    healed = run(FileSessionStore(tmp_path / "data").get("b"))
    assert [b["text"] for m in healed.messages for b in m["content"]] == [
        "b question 1",
        "b answer 1",
        "b answer 2",
    ]
    assert run(verify_store(FileSessionStore(tmp_path / "data"))).clean
    assert run(repair_store(store, dry_run=False)).sessions == ()  # nothing left to do


def test_repair_reports_a_deleted_line_as_missing_and_keeps_the_records_after_it(
    tmp_path: Path,
) -> None:
    store, _ = damaged_file_store(tmp_path)
    assert run(repair_store(store, dry_run=False)).clean  # an earlier repair rewrote "b"
    journal = store.session_dir("b") / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    gone = next(i for i, line in enumerate(lines) if b"b answer 1" in line)
    del lines[gone]  # a line in the middle: what follows is intact
    journal.write_bytes(b"".join(lines))
    before = tree(tmp_path)

    found = run(verify_store(FileSessionStore(store.root)))
    (damage,) = found.damage
    assert (damage.kind, damage.offset) == ("missing_record", sum(map(len, lines[:gone])))
    planned = run(repair_store(store))
    assert tree(tmp_path) == before
    assert (planned.missing_records, planned.quarantined, planned.clean) == (1, 0, False)
    report = run(repair_store(store, dry_run=False))
    (item,) = report.sessions
    assert (item.status, item.damage.kind, item.quarantined, item.kinds) == (
        "repaired",
        "missing_record",
        0,
        (),
    )
    # the record after the gap is reported as what it is: line gone + 1 (counting from 1)
    assert item.gaps == planned.sessions[0].gaps == ((gone + 1, 1),)
    assert item.to_dict()["gaps"] == [{"line": gone + 1, "records": 1}]
    assert (report.to_dict()["missing_records"], report.clean, report.remaining) == (1, True, ())
    healed = run(FileSessionStore(store.root).get("b"))
    assert [b["text"] for m in healed.messages for b in m["content"]] == [
        "b question 1",
        "b answer 2",  # kept: intact, and vouched for by the record after it
    ]
    assert run(verify_store(FileSessionStore(store.root))).clean


def test_repair_remaining_lists_whatever_is_left_damaged(tmp_path: Path) -> None:
    store, _ = damaged_file_store(tmp_path)
    planned = run(repair_store(store))  # a dry run leaves everything damaged
    assert not planned.clean
    assert [(d.session_id, d.kind) for d in planned.remaining] == [("b", "bad_hash")]
    assert planned.to_dict()["remaining"] == [planned.sessions[0].damage.to_dict()]
    done = run(repair_store(store, dry_run=False))
    assert (done.clean, done.remaining, done.to_dict()["remaining"]) == (True, (), [])


def test_damage_quarantine_cannot_pin_is_reported_unrepairable(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"], checkpoints=2)
    # meta.json alone is rebuilt from the journal's first record; not when that is bad too.
    (store.session_dir("a") / "meta.json").write_bytes(b"{broken")
    flip(store.session_dir("a") / "journal.jsonl", b'"created"')
    first = sorted((store.session_dir("b") / "checkpoints").iterdir())[0]
    first.unlink()
    first.mkdir()  # a checkpoint that cannot even be read: no file to move or seal
    before = tree(tmp_path)
    report = run(repair_store(store, dry_run=False))
    assert tree(tmp_path) == before
    (item,) = report.sessions
    assert (item.session_id, item.status, item.quarantined) == ("a", "unrepairable", 0)
    assert "journal.jsonl" in str(item.detail)
    # everything left damaged: the unrepairable session and the checkpoint file
    assert [(d.session_id, d.kind, d.checkpoint_id) for d in report.remaining] == [
        ("a", item.damage.kind, None),
        ("b", "unreadable", first.stem),
    ]
    assert report.checkpoints == ()
    assert not report.clean


def test_repair_quarantines_damaged_checkpoints_and_seals_unsealed_ones(tmp_path: Path) -> None:
    """ISSUE 14 item 12: repair handles damaged checkpoints instead of giving up."""
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"], checkpoints=3)
    files = sorted((store.session_dir("a") / "checkpoints").iterdir())
    edited = files[0].read_bytes().replace(b"a answer 1", b"a answer 9")
    files[0].write_bytes(edited)
    files[1].write_bytes(b"garbage")
    legacy = unsealed(files[2].read_bytes())
    files[2].write_bytes(legacy)
    quarantine = tmp_path / "q"

    before = tree(tmp_path)
    planned = run(repair_store(store, quarantine_dir=quarantine))
    assert tree(tmp_path) == before  # a dry run writes nothing
    assert [(c.checkpoint_id, c.damage.kind, c.status) for c in planned.checkpoints] == [
        (files[0].stem, "bad_checkpoint", "would_quarantine"),
        (files[1].stem, "bad_checkpoint", "would_quarantine"),
        (files[2].stem, "unsealed_checkpoint", "would_seal"),
    ]
    assert (planned.sessions, planned.clean) == ((), False)
    # a dry run repairs nothing: every damaged checkpoint is still there
    assert planned.remaining == tuple(c.damage for c in planned.checkpoints)

    report = run(repair_store(store, dry_run=False, quarantine_dir=quarantine))
    assert [(c.checkpoint_id, c.status) for c in report.checkpoints] == [
        (files[0].stem, "quarantined"),
        (files[1].stem, "quarantined"),
        (files[2].stem, "sealed"),
    ]
    assert report.clean
    assert report.to_dict()["checkpoints"][0]["quarantine_path"] == str(
        quarantine / "a" / "checkpoints" / files[0].name
    )
    # the damaged bytes are kept aside, not lost; the sealed one keeps its content
    assert (quarantine / "a" / "checkpoints" / files[0].name).read_bytes() == edited
    assert (quarantine / "a" / "checkpoints" / files[1].name).read_bytes() == b"garbage"
    assert not files[0].exists()
    assert not files[1].exists()
    legacy_body = {k: v for k, v in json.loads(legacy).items() if k != "format"}
    assert json.loads(files[2].read_bytes())["record"] == legacy_body
    restored = run(store.checkpoints.get("a", files[2].stem))
    assert restored.meta.checkpoint_id == files[2].stem
    assert "answer" not in json.dumps(report.to_dict())  # ids and kinds, no content
    assert run(verify_store(FileSessionStore(tmp_path / "data"))).clean
    again = run(repair_store(store, dry_run=False, quarantine_dir=quarantine))
    assert (again.checkpoints, again.clean) == ((), True)


def test_repair_leaves_a_checkpoint_whose_session_is_busy(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=1)
    (path,) = (store.session_dir("a") / "checkpoints").iterdir()
    path.write_bytes(b"garbage")

    async def scenario() -> Any:
        async with FileSessionStore(store.root).writer_lock("a"):
            return await repair_store(store, dry_run=False)

    report = run(scenario())
    assert [(c.checkpoint_id, c.status) for c in report.checkpoints] == [(path.stem, "locked")]
    assert path.read_bytes() == b"garbage"
    assert not report.clean


def test_repair_skips_a_session_whose_writer_is_busy(tmp_path: Path) -> None:
    store, _ = damaged_file_store(tmp_path)

    async def scenario() -> Any:
        async with FileSessionStore(store.root).writer_lock("b"):
            return await repair_store(store, dry_run=False)

    report = run(scenario())
    (item,) = report.sessions
    assert (item.status, item.quarantined) == ("locked", 0)
    assert "locked" in str(item.detail)
    assert not report.clean
    assert run(repair_store(store, dry_run=False)).sessions[0].status == "repaired"


def test_repair_needs_an_existing_file_or_sqlite_store(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="file and SQLite stores only"):
        run(repair_store(MemorySessionStore()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not exist"):
        run(repair_store(SQLiteSessionStore(tmp_path / "p.db")))
    with pytest.raises(ValueError, match="does not exist"):
        run(repair_store(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()
    assert not (tmp_path / "p.db").exists()


def dump(path: Path) -> list[Any]:
    """Every row of the database (opening it may fold its WAL: the bytes may change)."""
    with sqlite3.connect(path) as conn:
        tables = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        rows = [(t, sorted(conn.execute(f"SELECT * FROM {t}").fetchall())) for t in tables]
    conn.close()
    return sorted(rows)


def damage_sqlite_row(path: Path, session_id: str, row: int) -> None:
    """Alter one message row's body as a flipped bit would (its hash no longer matches)."""
    with sqlite3.connect(path) as conn:
        (sid,) = conn.execute(
            "SELECT sid FROM perdure_sessions WHERE id = ?", (session_id,)
        ).fetchone()
        conn.execute(
            "UPDATE perdure_messages SET body = replace(body, 'question', 'questioN') "
            "WHERE key = ?",
            ((sid << 32) + row,),
        )
    conn.close()


def test_sqlite_repair_dry_run_writes_nothing_and_says_what_would_move(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    populate(SQLiteSessionStore(path), ["a", "b", "c"])
    damage_sqlite_row(path, "b", 2)
    before = dump(path)
    store = SQLiteSessionStore(path)
    report = run(repair_store(store))
    store.close()
    assert dump(path) == before
    (item,) = report.sessions
    # Row 3 chains from the damaged row 2: both move, rows 0 and 1 stay.
    assert (item.session_id, item.status, item.quarantined) == ("b", "would_repair", 2)
    assert (item.positions, item.quarantine_path) == ((2, 3), None)
    assert item.kinds == ("bad_hash", "after_damage")
    assert not report.clean
    assert not (tmp_path / ".session-recovery-quarantine").exists()


def test_sqlite_repair_keeps_the_verifiable_prefix_and_quarantines_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.db"
    store = SQLiteSessionStore(path)
    populate(store, ["a", "b", "c"])
    before = run(store.get("b")).messages
    store.close()
    damage_sqlite_row(path, "b", 0)
    quarantine = tmp_path / "q"
    store = SQLiteSessionStore(path)
    report = run(repair_store(store, dry_run=False, quarantine_dir=quarantine))
    (item,) = report.sessions
    assert (item.status, item.positions) == ("repaired", (0, 1, 2, 3))
    assert item.kinds == ("bad_hash", "after_damage", "after_damage", "after_damage")
    assert report.clean
    assert run(verify_store(store)).clean
    record = run(store.get("b"))
    assert record.messages == []  # the prefix before row 0 is empty
    assert run(store.get("a")).meta.message_count == 4  # the others are untouched
    assert item.quarantine_path is not None
    moved = Path(item.quarantine_path)
    assert moved.parent == quarantine / "b"
    lines = [json.loads(line) for line in moved.read_text().splitlines()]
    assert [line["row"] for line in lines] == [0, 1, 2, 3]
    assert [line["kind"] for line in lines] == list(item.kinds)
    assert [line["body"] for line in lines[1:]] == [
        json.dumps(m, separators=(",", ":"), ensure_ascii=False) for m in before[1:]
    ]
    # The repaired session goes on: a new turn appends after the kept prefix.
    agent = Agent(model=ScriptedModel(["again"]), session_manager=Session(store, "b"))
    agent("b question 3")
    assert run(store.get("b")).meta.message_count == 2
    store.close()


def test_sqlite_repair_of_a_bad_state_and_a_moved_head(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    store = SQLiteSessionStore(path)
    populate(store, ["a", "b"])
    run(store.commit("a", run(store.get("a")).messages, agent_state={"k": 1}))
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE perdure_states SET body = '{\"x\": 1}'")  # no longer its hash
        conn.execute("UPDATE perdure_sessions SET message_count = 3 WHERE id = 'b'")
    conn.close()
    store = SQLiteSessionStore(path)
    report = run(repair_store(store, dry_run=False))
    assert sorted((s.session_id, s.status) for s in report.sessions) == [
        ("a", "repaired"),
        ("b", "repaired"),
    ]
    by_id = {s.session_id: s for s in report.sessions}
    assert "bad_state" in by_id["a"].kinds
    assert by_id["a"].quarantined == 1  # the state went to quarantine
    # Row 3 verifies and the recorded head is its hash: the count was what broke.
    assert (by_id["b"].kinds, by_id["b"].quarantined) == (("bad_meta",), 0)
    assert run(verify_store(store)).clean
    assert run(store.get("a")).agent_state == {}
    assert run(store.get("b")).meta.message_count == 4
    store.close()


# ----------------------------------------------------------------------------- gc


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_gc_expires_only_sessions_inactive_past_the_ttl(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    populate(store, ["old", "older", "fresh"])
    age(store, "old", NOW - dt.timedelta(days=2))
    age(store, "older", NOW - dt.timedelta(days=40))
    dry = run(gc_store(store, ttl_seconds=86400, now=NOW))
    assert dry.dry_run
    assert [e.session_id for e in dry.expired] == ["old", "older"]
    assert dry.expired[0].idle_seconds == pytest.approx(2 * 86400, abs=1)
    assert dry.expired[0].message_count == 4
    assert [m.session_id for m in run(store.list())] == ["fresh", "old", "older"]  # untouched
    done = run(gc_store(store, ttl_seconds=86400, dry_run=False, now=NOW))
    assert [e.session_id for e in done.expired] == ["old", "older"]
    assert [m.session_id for m in run(store.list())] == ["fresh"]
    assert run(store.checkpoints.list("old")) == []  # type: ignore[attr-defined]
    # a later "now" expires the rest
    later = run(gc_store(store, ttl_seconds=86400, now=NOW + dt.timedelta(days=3)))
    assert [e.session_id for e in later.expired] == ["fresh"]
    json.dumps(later.to_dict())


@pytest.mark.parametrize("kind", ["file", "sqlite", "memory", "postgres"])
def test_gc_keeps_the_newest_checkpoints_of_each_session(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    populate(store, ["a", "b"], checkpoints=4)
    populate(store, ["c"], checkpoints=1)
    cps: Any = store.checkpoints  # type: ignore[attr-defined]
    ids = {sid: [m.checkpoint_id for m in run(cps.list(sid))] for sid in "abc"}
    dry = run(gc_store(store, keep_checkpoints=2))
    assert [(p.session_id, p.checkpoint_id) for p in dry.pruned] == [
        ("a", ids["a"][0]),
        ("a", ids["a"][1]),
        ("b", ids["b"][0]),
        ("b", ids["b"][1]),
    ]
    assert {sid: [m.checkpoint_id for m in run(cps.list(sid))] for sid in "abc"} == ids
    run(gc_store(store, keep_checkpoints=2, dry_run=False))
    assert [m.checkpoint_id for m in run(cps.list("a"))] == ids["a"][2:]
    assert [m.checkpoint_id for m in run(cps.list("c"))] == ids["c"]
    run(gc_store(store, keep_checkpoints=0, dry_run=False))
    assert all(run(cps.list(sid)) == [] for sid in "abc")
    assert len(run(store.list())) == 3  # sessions stay


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_gc_prunes_past_damaged_checkpoints_and_keeps_newest_readable(
    kind: str, tmp_path: Path
) -> None:
    """ISSUE 14 item 12: one damaged checkpoint no longer stops gc for its session."""
    store = make_store(kind, tmp_path)
    populate(store, ["a"], checkpoints=5)
    cps: Any = store.checkpoints  # type: ignore[attr-defined]
    ids = [m.checkpoint_id for m in run(cps.list("a"))]
    for damaged in (ids[0], ids[4]):  # the oldest, and the newest
        if isinstance(store, FileSessionStore):
            (store.session_dir("a") / "checkpoints" / f"{damaged}.json").write_bytes(b"{}")
        else:
            with sqlite3.connect(store.path) as conn:  # type: ignore[attr-defined]
                conn.execute(
                    "UPDATE perdure_checkpoints SET trigger = 'whenever' WHERE checkpoint_id = ?",
                    (damaged,),
                )
            conn.close()
    report = run(gc_store(store, keep_checkpoints=2, dry_run=False))
    # the damaged newest does not count as kept: ids[2] and ids[3] are the two kept
    assert [(p.checkpoint_id, p.damaged) for p in report.pruned] == [
        (ids[0], True),
        (ids[1], False),
    ]
    assert report.pruned[0].trigger == "unknown"
    assert report.pruned[0].created_at[:4] == report.pruned[1].created_at[:4]
    assert [(s.session_id, s.checkpoint_id, s.code) for s in report.skipped] == [
        ("a", ids[4], "session_store_corrupted")
    ]
    assert run(cps.checkpoint_ids("a")) == ids[2:]
    run(gc_store(store, keep_checkpoints=0, dry_run=False))
    assert run(cps.checkpoint_ids("a")) == []


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_gc_prunes_checkpoints_older_than_the_age(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    populate(store, ["a", "b"], checkpoints=0)
    cps: Any = store.checkpoints  # type: ignore[attr-defined]
    a = [run(put_aged(cps, "a", hours=h)).meta.checkpoint_id for h in (3, 1.5, 0.1)]
    b = run(put_aged(cps, "b", hours=2)).meta.checkpoint_id
    dry = run(gc_store(store, max_checkpoint_age=3600))
    assert [(p.session_id, p.checkpoint_id) for p in dry.pruned] == [
        ("a", a[0]),
        ("a", a[1]),
        ("b", b),
    ]
    assert dry.to_dict()["max_checkpoint_age"] == 3600
    assert [m.checkpoint_id for m in run(cps.list("a"))] == a  # a dry run deletes nothing
    # Ages are measured against `now`: three hours on, the newest is past an hour too.
    later = run(gc_store(store, max_checkpoint_age=3600, now=NOW + dt.timedelta(hours=3)))
    assert [p.checkpoint_id for p in later.pruned] == [*a, b]
    # With a count too, the stores' one rule: the aged go, then the oldest past it.
    both = run(gc_store(store, max_checkpoint_age=2 * 3600, keep_checkpoints=1))
    assert [p.checkpoint_id for p in both.pruned] == [*a[:2], b]  # b: 2 h and a moment
    run(gc_store(store, max_checkpoint_age=3600, dry_run=False))
    assert [m.checkpoint_id for m in run(cps.list("a"))] == a[2:]
    assert run(cps.list("b")) == []
    assert len(run(store.list())) == 2  # sessions stay


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "redis"])
def test_gc_applies_the_age_limit_the_store_was_opened_with(kind: str, tmp_path: Path) -> None:
    unlimited = make_store(kind, tmp_path)
    populate(unlimited, ["a"], checkpoints=0)
    cps: Any = unlimited.checkpoints  # type: ignore[attr-defined]
    made = [run(put_aged(cps, "a", hours=h)).meta.checkpoint_id for h in (5, 0.5)]
    with pytest.raises(ValueError, match="gc_store needs"):
        run(gc_store(unlimited))
    limited = make_store(kind, tmp_path, max_checkpoint_age=3600)
    report = run(gc_store(limited, dry_run=False))
    assert (report.max_checkpoint_age, [p.checkpoint_id for p in report.pruned]) == (
        3600,
        made[:1],
    )
    assert [m.checkpoint_id for m in run(cps.list("a"))] == made[1:]
    # An explicit limit wins over the store's.
    report = run(gc_store(limited, max_checkpoint_age=600))
    assert [p.checkpoint_id for p in report.pruned] == made[1:]


def test_gc_prunes_a_damaged_checkpoint_by_the_age_its_id_tells(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=0)
    made = [run(put_aged(store.checkpoints, "a", hours=h)).meta.checkpoint_id for h in (3, 2, 0)]
    for damaged in (made[0], made[2]):
        (store.session_dir("a") / "checkpoints" / f"{damaged}.json").write_bytes(b"{}")
    report = run(gc_store(store, max_checkpoint_age=3600, dry_run=False))
    assert [(p.checkpoint_id, p.damaged) for p in report.pruned] == [
        (made[0], True),
        (made[1], False),
    ]
    assert [(s.checkpoint_id, s.code) for s in report.skipped] == [
        (made[2], "session_store_corrupted")  # young: kept for `perdure repair`
    ]
    assert run(store.checkpoints.checkpoint_ids("a")) == made[2:]


def own_checkpoint_store(kind: str, tmp_path: Path, **retention: Any) -> Any:
    """A checkpoint store of its own, over ``tmp_path`` (or the test's schema)."""
    if kind == "file":
        return FileCheckpointStore(tmp_path / "cps", **retention)
    if kind == "storage":
        return StorageCheckpointStore(LocalFileStorage(tmp_path / "blobs"), **retention)
    # PostgreSQL: the checkpoints of the test's PostgreSQL session store, seen from a
    # PostgresCheckpointStore over the same schema (dropped after the test).
    beside: Any = make_store("postgres", tmp_path)
    from perdure.stores.postgres import PostgresCheckpointStore
    from postgres_server import DSN

    store = PostgresCheckpointStore(DSN, schema=beside.schema, **retention)
    OPENED.append(store)
    return store


@pytest.mark.parametrize("kind", ["file", "storage", "postgres"])
def test_gc_checkpoints_prunes_a_store_of_its_own_whose_sessions_are_gone(
    kind: str, tmp_path: Path
) -> None:
    # Checkpoints whose sessions live (or lived) elsewhere: no session store lists them.
    cps = own_checkpoint_store(kind, tmp_path)
    old = run(put_aged(cps, "gone", hours=48)).meta.checkpoint_id
    young = run(put_aged(cps, "gone", hours=1)).meta.checkpoint_id
    other = [run(put_aged(cps, "other", hours=h)).meta.checkpoint_id for h in (30, 3, 2)]
    with pytest.raises(ValueError, match="gc_checkpoints needs"):
        run(maintenance.gc_checkpoints(cps))
    dry = run(maintenance.gc_checkpoints(cps, max_checkpoint_age=86400))
    assert (dry.dry_run, dry.sessions_checked) == (True, 2)
    assert [(p.session_id, p.checkpoint_id) for p in dry.pruned] == [
        ("gone", old),
        ("other", other[0]),
    ]
    assert run(cps.checkpoint_ids("gone")) == [old, young]  # a dry run deletes nothing
    both = run(maintenance.gc_checkpoints(cps, max_checkpoint_age=86400, keep_checkpoints=1))
    assert [p.checkpoint_id for p in both.pruned] == [old, *other[:2]]
    # The store's own limit is the default.
    limited = own_checkpoint_store(kind, tmp_path, max_checkpoint_age=86400)
    done = run(maintenance.gc_checkpoints(limited, dry_run=False))
    assert done.max_checkpoint_age == 86400
    assert run(cps.checkpoint_ids("gone")) == [young]
    assert run(cps.checkpoint_ids("other")) == other[1:]
    json.dumps(done.to_dict())


def test_gc_checkpoints_needs_a_store_that_names_its_sessions(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    try:
        with pytest.raises(TypeError, match="names its sessions"):
            run(maintenance.gc_checkpoints(store.checkpoints, keep_checkpoints=1))
        with pytest.raises(ValueError, match="max_checkpoint_age"):
            run(maintenance.gc_checkpoints(MemoryCheckpointStore(), max_checkpoint_age=-1))
    finally:
        store.close()


def test_gc_skips_a_session_another_writer_holds(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"])
    age(store, "a", NOW - dt.timedelta(days=9))
    age(store, "b", NOW - dt.timedelta(days=9))

    async def scenario() -> Any:
        async with FileSessionStore(tmp_path / "data").writer_lock("a"):
            return await gc_store(store, ttl_seconds=3600, dry_run=False, now=NOW)

    report = run(scenario())
    assert [(s.session_id, s.code) for s in report.skipped] == [("a", "session_locked")]
    assert [e.session_id for e in report.expired] == ["b"]
    assert [m.session_id for m in run(store.list())] == ["a"]


KILLED_FORK = """
import asyncio, os, signal, sys
from perdure.session import FileSessionStore

async def main():
    store = FileSessionStore(sys.argv[1])
    async with store.writer_lock(sys.argv[2]):  # as Session.fork does
        await store.create(sys.argv[2])
        os.kill(os.getpid(), signal.SIGKILL)  # before the history is committed

asyncio.run(main())
"""


def test_gc_removes_what_killed_seals_and_forks_left_and_nothing_else(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"])
    session = Session(store, "a")
    Agent(model=ScriptedModel([]), session_manager=session)
    checkpoint = run(session.list_checkpoints())[0]
    forked = run(session.fork(checkpoint.checkpoint_id))  # a fork that completed
    Agent(model=ScriptedModel([]), session_manager=Session(store, "empty"))  # a user's
    script = tmp_path / "fork.py"
    script.write_text(KILLED_FORK)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data"), "orphan"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    # A seal killed between its temp manifest and the rename leaves this:
    temp = store.session_dir("a") / f".manifest.json.{'5' * 32}.tmp"
    temp.write_bytes(b'{"format": "perdure-manifest/1", "segm')
    # An older version's delete, killed halfway, left this inside sessions/:
    legacy = tmp_path / "data" / "sessions" / f".deleted-gone-{'7' * 32}"
    legacy.mkdir()
    (legacy / "journal.jsonl").write_bytes(b"{}\n")
    ids = {m.session_id for m in run(store.list())}
    assert ids == {"a", "empty", "orphan", forked}

    report = run(gc_store(store, keep_checkpoints=5))  # a dry run
    assert report.orphans == ("orphan",)
    assert set(report.temp_files) == {str(temp), str(legacy)}
    assert temp.exists()
    assert legacy.exists()
    assert store.session_dir("orphan").exists()

    async def while_held() -> Any:
        async with FileSessionStore(tmp_path / "data").writer_lock("orphan"):
            return await gc_store(store, keep_checkpoints=5, dry_run=False)

    held = run(while_held())  # a writer holds it: left alone
    assert held.orphans == ()
    assert ("orphan", "session_locked") in [(s.session_id, s.code) for s in held.skipped]
    assert store.session_dir("orphan").exists()
    assert not temp.exists()  # session "a" was free: its temp file went
    assert not legacy.exists()

    applied = run(gc_store(store, keep_checkpoints=5, dry_run=False))
    assert applied.orphans == ("orphan",)
    assert {m.session_id for m in run(store.list())} == {"a", "empty", forked}
    assert run(verify_store(store)).clean
    assert run(gc_store(store, keep_checkpoints=5, dry_run=False)).orphans == ()


def test_gc_arguments_are_checked() -> None:
    store: Any = object()
    for kwargs in (
        {},
        {"max_checkpoint_age": 0},
        {"max_checkpoint_age": "1h"},
        {"ttl_seconds": 0},
        {"ttl_seconds": -5},
        {"ttl_seconds": True},
        {"keep_checkpoints": -1},
        {"keep_checkpoints": 1.5},
        {"ttl_seconds": 10, "now": dt.datetime(2025, 1, 1)},  # naive
    ):
        with pytest.raises(ValueError):
            run(gc_store(store, **kwargs))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600s", 3600), ("90m", 5400), ("12h", 43200), ("30d", 2592000), ("2w", 1209600)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "30", "d", "0s", "-1d", "+1d", "1.5h", "30 d", " 30d", "30D", "1d2h", "30days"]
)
def test_durations_are_parsed_strictly(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_gc_never_keeps_a_sqlite_checkpoint_whose_body_is_damaged(tmp_path: Path) -> None:
    """SQLite's checkpoint list reads no bodies: gc must read them before it decides
    what it keeps, or it would prune the good one and keep the damaged one."""
    path = tmp_path / "p.db"
    store = SQLiteSessionStore(path)
    populate(store, ["b"], checkpoints=2)
    older, newer = [m.checkpoint_id for m in run(store.checkpoints.list("b"))]
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE perdure_checkpoints SET body = replace(body, 'question', 'quesTion') "
            "WHERE checkpoint_id = ?",
            (newer,),
        )
    conn.close()
    store = SQLiteSessionStore(path)
    report = run(gc_store(store, keep_checkpoints=1, dry_run=False))
    assert report.pruned == ()  # the older, intact one is the one kept
    assert [(s.session_id, s.checkpoint_id) for s in report.skipped] == [("b", newer)]
    assert run(store.checkpoints.get("b", older)).meta.checkpoint_id == older
    store.close()


def test_gc_skips_a_locked_session_with_leftovers_once(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"])
    (store.session_dir("a") / f".meta.json.{'0' * 32}.tmp").write_bytes(b"x")

    async def scenario() -> Any:
        async with FileSessionStore(store.root).writer_lock("a"):
            return await gc_store(store, ttl_seconds=1, now=NOW + dt.timedelta(days=400))

    report = run(scenario())
    assert [(s.session_id, s.code) for s in report.skipped] == [("a", "session_locked")]
    assert report.expired == ()


def test_gc_collects_new_sqlite_databases_a_killed_process_left(tmp_path: Path) -> None:
    # A new database is made aside and linked into place whole; a process killed in
    # between leaves the file (and SQLite's side files). gc removes those of dead
    # processes and stale ones; one a live process may still be making stays.
    store = SQLiteSessionStore(tmp_path / "s.db")
    asyncio.run(store.create("a"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(dead.stdout)
    killed = [tmp_path / f".s.db.new-{dead_pid}-0badf00d{side}" for side in ("", "-journal")]
    stale = tmp_path / f".s.db.new-{os.getpid()}-00000001"
    making = tmp_path / f".s.db.new-{os.getpid()}-00000002"
    other_db = tmp_path / f".other.db.new-{dead_pid}-0badf00d"
    for path in (*killed, stale, making, other_db):
        path.write_bytes(b"SQLite format 3\x00")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    dry = asyncio.run(gc_store(store, keep_checkpoints=5))
    assert sorted(dry.temp_files) == sorted(str(p) for p in (*killed, stale))
    assert all(p.exists() for p in (*killed, stale, making))
    done = asyncio.run(gc_store(store, keep_checkpoints=5, dry_run=False))
    assert sorted(done.temp_files) == sorted(dry.temp_files)
    assert not any(p.exists() for p in (*killed, stale))
    assert making.exists()  # a live process may still be making it
    assert other_db.exists()  # another database's
    assert asyncio.run(store.get("a")).messages == []
    store.close()
