"""``perdure repair`` of a SQLite store says which message rows were already gone.

A row deleted behind the store's back is lost: nothing can bring it back, but the
repair report counts it (``missing_records``, ``gaps``) as the file store's does for a
deleted journal line, labels the rows it moves for what they are (the intact row
after a gap is ``unverifiable``, not ``bad_sequence``), and names a quarantine file
only when it moved something into one.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from perdure.cli.main import cli
from perdure.maintenance import repair_store, verify_store
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing.messages import conversation


async def _made(path: Path) -> None:
    store = SQLiteSessionStore(path)
    try:
        for session_id in ("a", "c"):
            await store.create(session_id)
            await store.commit(session_id, conversation(12))
    finally:
        store.close()


def _delete_row(path: Path, session_id: str, row: int) -> None:
    """Delete one message row of ``session_id`` by hand (as an operator would)."""
    with sqlite3.connect(path) as conn:
        (sid,) = conn.execute(
            "SELECT sid FROM perdure_sessions WHERE id = ?", (session_id,)
        ).fetchone()
        assert conn.execute("DELETE FROM perdure_messages WHERE key = ?", ((sid << 32) + row,))
    conn.close()


async def test_a_last_row_already_gone_is_reported_missing_and_no_file_is_claimed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.db"
    await _made(path)
    _delete_row(path, "c", 11)
    quarantine = tmp_path / "q"
    store = SQLiteSessionStore(path)
    try:
        planned = await repair_store(store, quarantine_dir=quarantine)
        (item,) = planned.sessions
        assert (item.status, item.gaps, item.missing_records) == ("would_repair", ((12, 1),), 1)
        assert (item.quarantined, item.positions, item.kinds) == (0, (), ())
        report = await repair_store(store, dry_run=False, quarantine_dir=quarantine)
        (item,) = report.sessions
        assert (item.status, item.gaps, item.quarantined, item.kinds) == (
            "repaired",
            ((12, 1),),
            0,
            (),
        )
        assert item.quarantine_path is None  # nothing was moved: no file to point at
        assert not (quarantine / "c").exists()
        assert report.missing_records == 1
        assert report.to_dict()["sessions"][0]["gaps"] == [{"line": 12, "records": 1}]
        assert (await verify_store(store)).clean
        assert (await store.get("c")).messages == conversation(12)[:11]
    finally:
        store.close()


async def test_a_middle_row_already_gone_is_a_gap_and_the_row_after_it_unverifiable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.db"
    await _made(path)
    _delete_row(path, "c", 5)
    quarantine = tmp_path / "q"
    store = SQLiteSessionStore(path)
    try:
        report = await repair_store(store, dry_run=False, quarantine_dir=quarantine)
        (item,) = report.sessions
        assert (item.status, item.gaps, item.missing_records) == ("repaired", ((6, 1),), 1)
        # Only row 4's hash could vouch for row 6's body: it moves, and what chains from it.
        assert item.positions == (6, 7, 8, 9, 10, 11)
        assert item.kinds == ("unverifiable", *["after_damage"] * 5)
        assert item.quarantine_path is not None
        text = await asyncio.to_thread(Path(item.quarantine_path).read_text)
        moved = [json.loads(line) for line in text.splitlines()]
        assert [(line["row"], line["kind"]) for line in moved] == list(
            zip(item.positions, item.kinds, strict=True)
        )
        assert (await verify_store(store)).clean
        assert (await store.get("c")).messages == conversation(12)[:5]
        assert (await store.get("a")).messages == conversation(12)  # untouched
    finally:
        store.close()


async def test_the_cli_says_a_record_is_missing_and_names_no_empty_file(tmp_path: Path) -> None:
    outputs = []
    for name, options in (("json.db", ["--json"]), ("text.db", [])):
        path = tmp_path / name
        await _made(path)
        _delete_row(path, "c", 11)
        result = CliRunner().invoke(
            cli, ["--store", f"sqlite:{path}", "repair", "--apply", "c", *options]
        )
        assert result.exit_code == 0, result.output
        outputs.append(result)
    data = json.loads(outputs[0].stdout)
    assert data["missing_records"] == 1
    (item,) = data["sessions"]
    assert (item["missing_records"], item["quarantine_path"]) == (1, None)
    text = outputs[1].output
    assert "1 record already missing" in text
    assert "moved to" not in text
