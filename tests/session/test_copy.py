"""``copy_sessions`` and ``perdure copy``: sessions with their checkpoints between stores.

Every pair of real store kinds, PostgreSQL included (skipped without a server): the
copy reads back equal — history, agent state, every checkpoint with its id and
meta — and what cannot be copied as it is (locked, damaged, already there) is
reported, never written half-way or silently.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from session_stores import make_store

from perdure import Agent
from perdure.cli.main import cli
from perdure.errors import SessionCorruptedError
from perdure.migrate.copy import copy_sessions
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.testing.messages import text

LONG_AGO = "2024-02-29T12:00:00.000001Z"


def populate(store: SessionStore, ids: list[str]) -> None:
    """Sessions written by real agents, with state, a redaction and two checkpoints;
    the first made long ago (a copy must keep each session's creation time)."""
    asyncio.run(store.create(ids[0], created_at=LONG_AGO))
    for sid in ids:
        session = Session(store, sid)
        agent = Agent(model=ScriptedModel([f"{sid} one", f"{sid} two"]), session_manager=session)
        agent(f"{sid} question 1")
        asyncio.run(session.checkpoint(label="first"))
        agent.state.set("city", f"{sid}-town")
        agent(f"{sid} question 2")
        asyncio.run(session.checkpoint())
    history = asyncio.run(store.get(ids[0])).messages
    asyncio.run(store.commit(ids[0], history, redactions={0: text("user", "[redacted]")}))


def snapshot(store: SessionStore, sid: str) -> tuple[Any, Any, Any, list[Any]]:
    async def read() -> tuple[Any, Any, Any, list[Any]]:
        record = await store.get(sid)
        checkpoints: Any = store.checkpoints  # type: ignore[attr-defined]
        metas = await checkpoints.list(sid)
        bodies = [await checkpoints.get(sid, m.checkpoint_id) for m in metas]
        return (
            record.meta.created_at,
            record.messages,
            record.agent_state,
            [(b.meta, b.messages, b.agent_state) for b in bodies],
        )

    return asyncio.run(read())


PAIRS = [("file", "sqlite"), ("sqlite", "postgres"), ("postgres", "file"), ("memory", "file")]


@pytest.mark.parametrize(("source_kind", "target_kind"), PAIRS)
def test_a_copy_reads_back_equal_with_its_checkpoints(
    tmp_path: Path, source_kind: str, target_kind: str
) -> None:
    source = make_store(source_kind, tmp_path / "from")
    target = make_store(target_kind, tmp_path / "to")
    populate(source, ["a", "b"])
    report = asyncio.run(copy_sessions(source, target))
    assert report.ok
    assert [(s.session_id, s.status, s.messages, s.checkpoints) for s in report.sessions] == [
        ("a", "copied", 4, 2),
        ("b", "copied", 4, 2),
    ]
    for sid in ("a", "b"):
        assert snapshot(target, sid) == snapshot(source, sid)
    assert asyncio.run(target.get("a")).meta.created_at == LONG_AGO
    assert [m.created_at for m in asyncio.run(target.list())] == [
        m.created_at for m in asyncio.run(source.list())
    ]
    assert asyncio.run(target.get("a")).messages[0] == text("user", "[redacted]")
    # A second copy finds them there; --overwrite replaces them.
    again = asyncio.run(copy_sessions(source, target))
    assert [(s.status, s.reason) for s in again.sessions] == [("skipped", "exists")] * 2
    assert not again.ok
    replaced = asyncio.run(copy_sessions(source, target, session_ids=["b"], overwrite=True))
    assert [(s.session_id, s.status) for s in replaced.sessions] == [("b", "copied")]
    assert snapshot(target, "b") == snapshot(source, "b")


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    source = make_store("file", tmp_path / "from")
    target = make_store("sqlite", tmp_path / "to")
    populate(source, ["a"])
    report = asyncio.run(copy_sessions(source, target, dry_run=True))
    assert [(s.status, s.checkpoints) for s in report.sessions] == [("would_copy", 2)]
    assert asyncio.run(target.list()) == []


def test_a_locked_or_damaged_session_is_reported_and_nothing_of_it_written(
    tmp_path: Path,
) -> None:
    source = FileSessionStore(tmp_path / "from")
    target = make_store("sqlite", tmp_path / "to")
    populate(source, ["busy", "broken", "fine"])
    journal = source.session_dir("broken") / "journal.jsonl"
    data = bytearray(journal.read_bytes())
    data[data.index(b"broken one")] ^= 0x01
    journal.write_bytes(bytes(data))
    with pytest.raises(SessionCorruptedError):
        asyncio.run(source.get("broken"))

    async def copy_while_busy() -> Any:
        other = FileSessionStore(tmp_path / "from")
        async with other.writer_lock("busy"):
            return await copy_sessions(source, target)

    report = asyncio.run(copy_while_busy())
    assert [(s.session_id, s.status, s.reason) for s in report.sessions] == [
        ("broken", "failed", "session_store_corrupted"),
        ("busy", "skipped", "session_locked"),
        ("fine", "copied", None),
    ]
    assert [m.session_id for m in asyncio.run(target.list())] == ["fine"]


def test_perdure_copy_on_the_command_line(tmp_path: Path) -> None:
    source = make_store("sqlite", tmp_path / "from")
    populate(source, ["a", "b"])
    source.close()  # type: ignore[attr-defined]
    source_url = f"sqlite:{tmp_path / 'from' / 'sessions.db'}"
    target_url = f"file:{tmp_path / 'copy'}"
    runner = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None})
    result = runner.invoke(cli, ["copy", "--from", source_url, "--to", target_url, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(s["session_id"], s["status"]) for s in data["sessions"]] == [
        ("a", "copied"),
        ("b", "copied"),
    ]
    listed = runner.invoke(cli, ["sessions", "list", "--store", target_url])
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert rows[0][:2] == ["id", "created"]
    assert rows[1][:2] == ["a", "2024-02-29T12:00:00Z"]  # the source's creation time
    human = runner.invoke(cli, ["copy", "--from", source_url, "--to", target_url])
    assert human.exit_code == 1  # both there already: skipped, and said so
    assert "0 copied, 2 skipped, 0 failed" in human.stderr  # the summary: stderr when piped
    refused = runner.invoke(cli, ["copy", "--from", source_url, "--to", "memory:"])
    assert refused.exit_code == 2
    assert "persists" in refused.stderr
    missing = runner.invoke(
        cli, ["copy", "--from", f"file:{tmp_path / 'nope'}", "--to", target_url]
    )
    assert missing.exit_code == 3


def test_a_target_that_reads_back_differently_is_reported_failed(tmp_path: Path) -> None:
    from perdure.stores.memory import MemorySessionStore

    class Forgetful(MemorySessionStore):
        async def get(self, session_id: str, *, offset: int = 0) -> Any:
            record = await super().get(session_id, offset=offset)
            record.messages = record.messages[:-1]  # loses the last message on read
            return record

    source = make_store("file", tmp_path / "from")
    populate(source, ["a"])
    report = asyncio.run(copy_sessions(source, Forgetful()))
    assert [(s.status, s.reason) for s in report.sessions] == [("failed", "verify_mismatch")]
    assert "history" in (report.sessions[0].detail or "")


def test_a_target_that_forgets_the_creation_time_is_reported_failed(tmp_path: Path) -> None:
    from perdure.stores.memory import MemorySessionStore

    class Renewing(MemorySessionStore):
        async def create(self, session_id: str, **options: Any) -> Any:
            return await super().create(session_id, exist_ok=options.get("exist_ok", False))

    source = make_store("file", tmp_path / "from")
    populate(source, ["a"])
    report = asyncio.run(copy_sessions(source, Renewing()))
    assert [(s.status, s.reason) for s in report.sessions] == [("failed", "verify_mismatch")]
    assert "creation time" in (report.sessions[0].detail or "")
