"""``perdure verify`` and ``perdure repair`` through their real entry points, on real stores."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

import postgres_server
from perdure import Agent
from perdure.cli import output
from perdure.cli.main import cli
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore, open_store
from perdure.stores.sqlite import SQLiteSessionStore


def perdure(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None})
    return runner.invoke(cli, list(args), catch_exceptions=False)


def populate(store: SessionStore, ids: list[str], *, checkpoints: int = 1) -> None:
    for sid in ids:
        session = Session(store, sid)
        agent = Agent(
            model=ScriptedModel([f"{sid} answer 1", f"{sid} answer 2"]), session_manager=session
        )
        agent(f"{sid} question 1")
        agent(f"{sid} question 2")
        for _ in range(checkpoints):
            asyncio.run(session.checkpoint())


def flip(path: Path, needle: bytes) -> int:
    """Flip one bit in ``needle``'s first byte; return the offset of its line."""
    data = bytearray(path.read_bytes())
    at = data.index(needle)
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return data.rfind(b"\n", 0, at) + 1


def tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def file_store(tmp_path: Path) -> FileSessionStore:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b", "c"])
    return store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SQLiteSessionStore:
    store = SQLiteSessionStore(tmp_path / "p.db")
    populate(store, ["a", "b", "c"])
    store.close()
    return store


# ----------------------------------------------------------------------------- verify


def test_verify_a_clean_file_store(file_store: FileSessionStore) -> None:
    result = perdure("verify", "--store", f"file:{file_store.root}")
    assert result.exit_code == 0, result.output
    assert "3 sessions and 3 checkpoints verified: no damage" in result.stderr
    assert result.stdout == "session\tdamage\tposition\n"  # piped: the table, even empty


def test_verify_a_clean_sqlite_store_as_json(sqlite_store: SQLiteSessionStore) -> None:
    result = perdure("verify", "--store", f"sqlite:{sqlite_store.path}", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["clean"] is True
    assert (report["sessions_checked"], report["checkpoints_checked"]) == (3, 3)
    assert report["damage"] == []


def test_verify_reports_the_damaged_file_session_with_kind_and_position(
    file_store: FileSessionStore,
) -> None:
    offset = flip(file_store.session_dir("b") / "journal.jsonl", b"b answer 1")
    url = f"file:{file_store.root}"
    result = perdure("verify", "--store", url)
    assert result.exit_code == 1, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    assert rows == [
        ["session", "damage", "position"],  # the header: piped output is tab-separated
        ["b", "bad_hash", f"journal.jsonl byte {offset}"],  # the one damaged session
    ]
    assert "1 of 3 sessions damaged" in result.stderr  # the summary: on stderr when piped
    assert f"perdure repair --store {url}" in result.stderr
    report = json.loads(perdure("verify", "--store", url, "--json").stdout)
    assert report["damaged_sessions"] == ["b"]
    (damage,) = report["damage"]
    assert (damage["kind"], damage["offset"], damage["position"]) == (
        "bad_hash",
        offset,
        f"journal.jsonl byte {offset}",
    )
    assert damage["file"].endswith(os.path.join("sessions", "b", "journal.jsonl"))


def test_verify_reports_the_damaged_sqlite_session_with_its_row(
    sqlite_store: SQLiteSessionStore,
) -> None:
    with sqlite3.connect(sqlite_store.path) as conn:
        (sid,) = conn.execute("SELECT sid FROM perdure_sessions WHERE id = 'c'").fetchone()
        conn.execute(
            "UPDATE perdure_messages SET body = replace(body, 'answer', 'answeR') WHERE key = ?",
            ((sid << 32) + 1,),
        )
    conn.close()
    result = perdure("verify", "--store", f"sqlite:{sqlite_store.path}", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["damaged_sessions"] == ["c"]
    assert [(d["kind"], d["row"]) for d in report["damage"]] == [("bad_hash", 1)]
    hint = perdure("verify", "--store", f"sqlite:{sqlite_store.path}").stderr
    assert f"perdure repair --store sqlite:{sqlite_store.path}" in hint.replace("\n", "")


def test_verify_reports_damaged_checkpoint_files(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a", "b"], checkpoints=3)
    files = sorted((store.session_dir("b") / "checkpoints").iterdir())
    for broken in (files[0], files[1]):
        broken.write_bytes(broken.read_bytes()[:-3])
    result = perdure("verify", "--store", f"file:{store.root}")
    assert result.exit_code == 1
    for broken in (files[0], files[1]):
        assert f"checkpoint {broken.stem}" in result.stdout
    assert result.stdout.count("bad_checkpoint") == 2
    assert "perdure repair --store" in result.stderr  # repair quarantines checkpoints too


def test_verify_named_sessions_and_a_missing_one(file_store: FileSessionStore) -> None:
    flip(file_store.session_dir("b") / "journal.jsonl", b"b answer 1")
    url = f"file:{file_store.root}"
    assert perdure("verify", "--store", url, "a", "c").exit_code == 0
    result = perdure("verify", "--store", url, "a", "nope")
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [
        "✓ 1 session and 1 checkpoint verified: no damage",  # what was found: "a"
        "error: session 'nope' not found [session_not_found]",
    ]


def test_verify_of_only_unknown_sessions_prints_only_the_error(
    file_store: FileSessionStore,
) -> None:
    url = f"file:{file_store.root}"
    for args in (["nobody"], ["nobody", "--json"], ["nobody", "nope"]):
        result = perdure("verify", "--store", url, *args)
        assert result.exit_code == 3
        assert result.stdout == ""  # no "0 sessions verified: no damage" before the error
        assert result.stderr.startswith("error: session 'nobody' not found [session_not_found]")
    for command in (["repair"], ["repair", "--apply", "--json"]):
        result = perdure(*command, "--store", url, "nobody")
        assert (result.exit_code, result.stdout) == (3, "")
        assert result.stderr == "error: session 'nobody' not found [session_not_found]\n"


def test_verify_as_a_real_process(file_store: FileSessionStore) -> None:
    flip(file_store.session_dir("a") / "journal.jsonl", b"a question 2")
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "verify", "--store", f"file:{file_store.root}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PERDURE_STORE"},
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["damaged_sessions"] == ["a"]
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--store", "ftp:./x"], 2, "error: --store: unknown store scheme 'ftp'"),
        (["--store", "nocolon"], 2, "error: --store: store URL 'nocolon' has no scheme"),
        (["--store", "file:{tmp}/missing"], 3, "error: no store at"),
        (["--store", "sqlite:{tmp}/missing.db"], 3, "error: no store at"),
        (["--store", "file:{tmp}", "../x"], 2, "error: "),
    ],
)
def test_verify_bad_inputs(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    result = perdure("verify", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == code
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1  # one line
    assert result.stdout == ""
    assert not (tmp_path / "missing").exists()
    assert not (tmp_path / "missing.db").exists()


# ----------------------------------------------------------------------------- repair


def test_repair_is_a_dry_run_by_default_and_writes_nothing(
    file_store: FileSessionStore, tmp_path: Path
) -> None:
    flip(file_store.session_dir("b") / "journal.jsonl", b"b answer 1")
    before = tree(tmp_path)
    result = perdure("repair", "--store", f"file:{file_store.root}")
    assert tree(tmp_path) == before
    assert result.exit_code == 1  # damage remains: nothing was changed
    assert result.stderr.startswith("dry run: nothing was changed")
    assert "would repair" in result.stdout
    assert "would move 1 record of 1 session" in result.stderr
    report = json.loads(perdure("repair", "--store", f"file:{file_store.root}", "--json").stdout)
    assert report["dry_run"] is True
    (item,) = report["sessions"]
    assert (item["session_id"], item["status"], item["quarantined"], item["positions"]) == (
        "b",
        "would_repair",
        1,
        [3],  # line numbers count from 1, as editors and `sed -n 3p` do
    )
    assert tree(tmp_path) == before


def test_repair_apply_moves_bad_records_and_the_session_reads_again(
    file_store: FileSessionStore, tmp_path: Path
) -> None:
    flip(file_store.session_dir("b") / "journal.jsonl", b"b answer 1")
    quarantine = tmp_path / "q"
    url = f"file:{file_store.root}"
    result = perdure("repair", "--store", url, "--apply", "--quarantine-dir", str(quarantine))
    assert result.exit_code == 0, result.output
    assert "moved 1 record of 1 session" in result.stderr
    assert "repaired" in result.stdout
    assert "answer" not in result.stdout + result.stderr  # counts and positions, never content
    (moved,) = (quarantine / "b").iterdir()
    assert str(moved) in result.stderr.replace("\n", "")
    healed = asyncio.run(FileSessionStore(file_store.root).get("b"))  # a strict reader
    assert healed.meta.message_count == 3
    assert perdure("verify", "--store", url).exit_code == 0
    again = perdure("repair", "--store", url, "--apply")
    assert again.exit_code == 0
    assert "nothing to repair" in again.stderr


def test_repair_apply_as_json_reports_positions_not_content(
    file_store: FileSessionStore,
) -> None:
    flip(file_store.session_dir("c") / "journal.jsonl", b"c question 2")
    result = perdure("repair", "--store", f"file:{file_store.root}", "--apply", "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    (item,) = report["sessions"]
    assert (item["status"], item["quarantined"], item["kinds"]) == ("repaired", 1, ["bad_hash"])
    assert item["quarantine_path"].startswith(str(file_store.quarantine_dir))
    assert "question" not in result.stdout


def test_repair_after_a_deleted_line_reports_it_missing_and_keeps_the_next_record(
    file_store: FileSessionStore,
) -> None:
    url = f"file:{file_store.root}"
    flip(file_store.session_dir("b") / "journal.jsonl", b"b question 2")
    assert perdure("repair", "--store", url, "--apply").exit_code == 0
    journal = file_store.session_dir("b") / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    gone = next(i for i, line in enumerate(lines) if b"b answer 1" in line)
    del lines[gone]
    journal.write_bytes(b"".join(lines))

    result = perdure("repair", "--store", url, "--apply")
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line][1:]
    offset = sum(map(len, lines[:gone]))
    assert rows == [
        [
            "session",  # the kind of row: a session's records
            "b",
            "missing_record",
            f"journal.jsonl byte {offset}",
            "repaired",
            "0",
            "-",
            f"1 before line {gone + 1}",
            "",  # no checkpoint
        ]
    ]
    assert "bad_hash" not in result.stdout
    assert "moved 0 records of 0 sessions" in result.stderr
    assert "1 record already missing from the journal of 1 session" in result.stderr
    healed = asyncio.run(FileSessionStore(file_store.root).get("b"))
    assert [b["text"] for m in healed.messages for b in m["content"]] == [
        "b question 1",
        "b answer 2",  # the intact record after the deleted line is kept
    ]


def test_repair_json_remaining_agrees_with_clean(file_store: FileSessionStore) -> None:
    url = f"file:{file_store.root}"
    flip(file_store.session_dir("b") / "journal.jsonl", b"b answer 1")
    planned = perdure("repair", "--store", url, "--json")
    assert planned.exit_code == 1
    report = json.loads(planned.stdout)
    assert report["clean"] is False
    assert [(d["session_id"], d["kind"]) for d in report["remaining"]] == [("b", "bad_hash")]
    applied = json.loads(perdure("repair", "--store", url, "--apply", "--json").stdout)
    assert (applied["clean"], applied["remaining"]) == (True, [])
    (item,) = applied["sessions"]
    assert (item["positions"], item["gaps"], item["missing_records"]) == ([3], [], 0)


def test_repair_leaves_what_quarantine_cannot_fix_and_exits_1(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=1)
    (checkpoint,) = (store.session_dir("a") / "checkpoints").iterdir()
    checkpoint.unlink()
    checkpoint.mkdir()  # unreadable: nothing to move or seal
    result = perdure("repair", "--store", f"file:{store.root}", "--apply")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1].startswith("not repaired\t")  # the row's kind
    assert checkpoint.is_dir()


def test_repair_quarantines_a_damaged_checkpoint(tmp_path: Path) -> None:
    """ISSUE 14 item 12: `repair` moves a damaged checkpoint out instead of giving up."""
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"], checkpoints=2)
    first, second = sorted((store.session_dir("a") / "checkpoints").iterdir())
    first.write_bytes(first.read_bytes().replace(b"a answer 1", b"a answer 9"))
    url = f"file:{store.root}"
    dry = perdure("repair", "--store", url)
    assert dry.exit_code == 1
    assert "would quarantine" in dry.stdout
    assert first.exists()
    result = perdure("repair", "--store", url, "--apply")
    assert result.exit_code == 0, result.stdout
    assert f"checkpoint {first.stem} moved to" in result.stderr
    assert not first.exists()
    assert second.exists()
    assert perdure("verify", "--store", url).exit_code == 0
    assert "nothing to repair" in perdure("repair", "--store", url).stderr


def test_repair_refuses_stores_other_than_file_and_sqlite() -> None:
    result = perdure("repair", "--store", "memory:", "--apply")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: repair works on file and SQLite stores only")
    assert result.stderr.count("\n") == 1


def damage_row(path: Path, session_id: str, row: int) -> None:
    with sqlite3.connect(path) as conn:
        (sid,) = conn.execute(
            "SELECT sid FROM perdure_sessions WHERE id = ?", (session_id,)
        ).fetchone()
        conn.execute(
            "UPDATE perdure_messages SET body = replace(body, 'answer', 'answeR') WHERE key = ?",
            ((sid << 32) + row,),
        )
    conn.close()


def test_repair_a_sqlite_store_in_place(sqlite_store: SQLiteSessionStore, tmp_path: Path) -> None:
    damage_row(sqlite_store.path, "c", 3)
    url = f"sqlite:{sqlite_store.path}"
    dry = perdure("repair", "--store", url)
    assert dry.exit_code == 1
    assert "would repair" in dry.stdout
    assert "would move 1 record of 1 session" in dry.stderr
    assert perdure("verify", "--store", url).exit_code == 1  # the dry run changed nothing
    quarantine = tmp_path / "q"
    result = perdure("repair", "--store", url, "--apply", "--quarantine-dir", str(quarantine))
    assert result.exit_code == 0, result.output
    assert "moved 1 record of 1 session" in result.stderr
    assert "answer" not in result.stdout + result.stderr  # counts and positions, never content
    (moved,) = (quarantine / "c").iterdir()
    assert "answeR 2" in moved.read_text()  # the damaged row, as stored
    assert perdure("verify", "--store", url).exit_code == 0
    healed = asyncio.run(SQLiteSessionStore(sqlite_store.path).get("c"))
    assert healed.meta.message_count == 3  # the verifiable prefix
    report = json.loads(perdure("repair", "--store", url, "--apply", "--json").stdout)
    assert (report["clean"], report["sessions"], report["moved_files"]) == (True, [], [])


def test_verify_shows_a_progress_bar_on_a_terminal(
    file_store: FileSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = io.StringIO()

    def fake_console(*, stderr: bool = False) -> Console:
        if stderr:
            return Console(file=terminal, force_terminal=True, width=100)
        return Console(highlight=False, soft_wrap=False)

    monkeypatch.setattr(output, "console", fake_console)
    result = perdure("verify", "--store", f"file:{file_store.root}")
    assert result.exit_code == 0
    assert "verifying" in terminal.getvalue()
    assert "3/3" in terminal.getvalue()
    terminal.seek(0)
    terminal.truncate()
    json_result = perdure("verify", "--store", f"file:{file_store.root}", "--json")
    assert json.loads(json_result.stdout)["clean"] is True
    assert terminal.getvalue() == ""  # no bar around output meant for scripts


def test_verify_a_postgres_store_reports_a_row_edited_behind_its_back(
    request: pytest.FixtureRequest,
) -> None:
    url = postgres_server.store_url(request)
    store = open_store(url)
    populate(store, ["a", "b"])
    getattr(store, "close", lambda: None)()
    clean = json.loads(perdure("verify", "--store", url, "--json").stdout)
    assert (clean["clean"], clean["sessions_checked"], clean["checkpoints_checked"]) == (True, 2, 2)
    schema = url.rsplit("schema=", 1)[1]
    postgres_server.execute(
        f"UPDATE \"{schema}\".perdure_messages m SET body = replace(body, 'answer', 'answeR') "
        f"FROM \"{schema}\".perdure_sessions s WHERE m.sid = s.sid AND s.id = 'b' AND m.idx = 1"
    )
    result = perdure("verify", "--store", url, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["damaged_sessions"] == ["b"]
    assert [(d["kind"], d["row"]) for d in report["damage"]] == [("bad_hash", 1)]
