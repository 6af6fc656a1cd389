"""``perdure migrate openai-agents --from sqlite:DB --to URL``: a database written by the
SDK's real ``SQLiteSession`` becomes perdure sessions that ``PerdureSession`` reads equal."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from oa_support import import_agents, items, opened, store_url

import_agents()

from agents.memory import SQLiteSession  # noqa: E402

from perdure.adapters.openai_agents import PerdureSession  # noqa: E402
from perdure.cli._common import EXIT_NOT_FOUND, EXIT_PROBLEM, EXIT_USAGE  # noqa: E402
from perdure.cli.main import cli  # noqa: E402
from perdure.maintenance import verify_store  # noqa: E402
from perdure.migrate.openai_agents import migrate_openai_agents  # noqa: E402
from perdure.session import open_store  # noqa: E402


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


async def _write_sdk_db(path: Path, **tables: str) -> dict[str, list[object]]:
    """Conversations written by the SDK's SQLiteSession; what it reads back, by id."""
    stream = items()
    wanted = {"alice": 9, "bob": 3, "carol": 0}
    answers: dict[str, list[object]] = {}
    for session_id, count in wanted.items():
        sdk = SQLiteSession(session_id, path, **tables)  # type: ignore[arg-type]
        try:
            await sdk.add_items(list(islice(stream, count)))
            if session_id == "bob":
                await sdk.pop_item()  # history the SDK changed, not only appended
            if session_id == "carol":
                await sdk.add_items([{"role": "user", "content": "soon gone"}])
                await sdk.pop_item()  # the session row stays, with no item
            answers[session_id] = list(await sdk.get_items())
        finally:
            sdk.close()
    return answers


@pytest.fixture
def sdk_db(tmp_path: Path) -> tuple[Path, dict[str, list[object]]]:
    path = tmp_path / "oa.db"
    return path, asyncio.run(_write_sdk_db(path))


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "redis"])
def test_cli_imports_every_conversation_equal_and_verified(
    kind: str,
    sdk_db: tuple[Path, dict[str, list[object]]],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    db, answers = sdk_db
    url = store_url(kind, tmp_path, request)
    result = invoke("migrate", "openai-agents", "--from", f"sqlite:{db}", "--to", url, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] is True
    assert report["counts"]["imported"] == 3
    assert {s["session_id"]: s["items_imported"] for s in report["sessions"]} == {
        session_id: len(found) for session_id, found in answers.items()
    }
    assert all(s["verified"] for s in report["sessions"])

    store = opened(url, request)
    for session_id, found in answers.items():
        assert asyncio.run(PerdureSession(session_id, store).get_items()) == found
    assert asyncio.run(verify_store(store)).clean

    # Run again: the sessions exist, nothing is written twice.
    again = invoke("migrate", "openai-agents", "--from", str(db), "--to", url, "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["counts"]["skipped"] == 3
    assert asyncio.run(PerdureSession("alice", store).get_items()) == answers["alice"]


def test_a_dry_run_writes_nothing(
    sdk_db: tuple[Path, dict[str, list[object]]], tmp_path: Path
) -> None:
    db, _ = sdk_db
    target = tmp_path / "target.db"
    result = invoke("migrate", "openai-agents", "--from", str(db), "--to", f"sqlite:{target}")
    assert result.exit_code == 0, result.output
    assert "3 imported" in result.stderr  # piped: the table on stdout, the summary not
    header, *rows = (line.split("\t") for line in result.stdout.splitlines())
    assert header[:2] == ["session", "status"]
    assert [row[1] for row in rows] == ["imported"] * 3
    assert all(len(row) == len(header) for row in rows)
    dry = tmp_path / "dry"
    result = invoke(
        "migrate", "openai-agents", "--from", str(db), "--to", f"file:{dry}", "--dry-run"
    )
    assert result.exit_code == 0, result.output
    assert "3 would import" in result.output
    assert not dry.exists()


def test_rows_the_sdk_would_skip_are_reported_not_dropped(
    sdk_db: tuple[Path, dict[str, list[object]]], tmp_path: Path
) -> None:
    db, answers = sdk_db
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES ('alice', '{broken')"
        )
        (row_id,) = conn.execute("SELECT MAX(id) FROM agent_messages").fetchone()
    url = f"file:{tmp_path / 'store'}"
    result = invoke("migrate", "openai-agents", "--from", str(db), "--to", url)
    assert result.exit_code == EXIT_PROBLEM, result.output
    assert f"row {row_id}: not JSON" in result.output
    store = open_store(url)
    # What was readable is imported, equal to what the SDK itself reads.
    assert asyncio.run(PerdureSession("alice", store).get_items()) == answers["alice"]


def test_custom_table_names(tmp_path: Path) -> None:
    db = tmp_path / "custom.db"
    tables = {"sessions_table": "s_tab", "messages_table": "m_tab"}
    answers = asyncio.run(_write_sdk_db(db, **tables))
    store = open_store(f"file:{tmp_path / 'store'}")
    report = asyncio.run(migrate_openai_agents(db, store, **tables))
    assert report.ok, report.to_dict()
    assert asyncio.run(PerdureSession("alice", store).get_items()) == answers["alice"]
    with pytest.raises(ValueError, match="no table 'agent_messages'"):
        asyncio.run(migrate_openai_agents(db, store))
    with pytest.raises(ValueError, match="messages_table"):
        asyncio.run(migrate_openai_agents(db, store, messages_table="x; DROP TABLE m_tab"))


def test_bad_sources_and_targets(tmp_path: Path) -> None:
    missing = invoke("migrate", "openai-agents", "--from", "sqlite:./nope.db", "--to", "file:x")
    assert missing.exit_code == EXIT_USAGE
    not_sdk = tmp_path / "other.db"
    sqlite3.connect(not_sdk).close()
    result = invoke(
        "migrate", "openai-agents", "--from", str(not_sdk), "--to", f"file:{tmp_path / 's'}"
    )
    assert result.exit_code == EXIT_USAGE
    assert "not a SQLiteSession database" in result.output
    memory = invoke("migrate", "openai-agents", "--from", str(not_sdk), "--to", "memory:")
    assert memory.exit_code == EXIT_USAGE
    empty = tmp_path / "empty.db"
    SQLiteSession("x", empty).close()  # the SDK's tables, no session
    none = invoke("migrate", "openai-agents", "--from", str(empty), "--to", f"file:{tmp_path}/t")
    assert none.exit_code == EXIT_NOT_FOUND


def test_a_copy_that_reads_back_different_fails_and_is_removed(
    sdk_db: tuple[Path, dict[str, list[object]]], tmp_path: Path
) -> None:
    db, _ = sdk_db
    store = open_store(f"file:{tmp_path / 'store'}")
    real = store.commit

    async def lossy(session_id: str, messages: Any, **kwargs: Any) -> Any:
        return await real(session_id, list(messages)[:-1], **kwargs)  # loses one item

    store.commit = lossy  # type: ignore[method-assign]
    report = asyncio.run(migrate_openai_agents(db, store))
    by_id = {entry.session_id: entry for entry in report.sessions}
    assert by_id["alice"].status == "failed"
    assert "read back different" in (by_id["alice"].reason or "")
    assert not by_id["alice"].verified
    assert by_id["carol"].status == "imported"  # nothing to lose in an empty session
    assert not report.ok
    del store.commit  # type: ignore[method-assign]
    assert asyncio.run(PerdureSession("alice", store).get_items()) == []  # removed again
    assert [m.session_id for m in asyncio.run(store.list())] == ["carol"]


def test_overwrite_replaces_a_session_that_exists(
    sdk_db: tuple[Path, dict[str, list[object]]], tmp_path: Path
) -> None:
    db, answers = sdk_db
    url = f"file:{tmp_path / 'store'}"
    store = open_store(url)
    asyncio.run(PerdureSession("alice", store).add_items([{"role": "user", "content": "x"}]))
    kept = invoke("migrate", "openai-agents", "--from", str(db), "--to", url, "--json")
    entries = {e["session_id"]: e for e in json.loads(kept.output)["sessions"]}
    assert entries["alice"]["status"] == "skipped"
    assert asyncio.run(PerdureSession("alice", store).get_items()) == [
        {"role": "user", "content": "x"}
    ]
    replaced = invoke(
        "migrate", "openai-agents", "--from", str(db), "--to", url, "--overwrite", "--json"
    )
    assert replaced.exit_code == 0, replaced.output
    assert json.loads(replaced.output)["counts"]["imported"] == 3
    assert asyncio.run(PerdureSession("alice", store).get_items()) == answers["alice"]


def test_an_id_perdure_refuses_is_reported_failed(tmp_path: Path) -> None:
    db = tmp_path / "oa.db"

    async def write() -> None:
        for session_id in ("team/alice", "bob"):
            sdk = SQLiteSession(session_id, db)
            await sdk.add_items([{"role": "user", "content": "hi"}])
            sdk.close()

    asyncio.run(write())
    store = open_store(f"file:{tmp_path / 'store'}")
    report = asyncio.run(migrate_openai_agents(db, store))
    by_id = {entry.session_id: entry for entry in report.sessions}
    assert by_id["team/alice"].status == "failed"
    assert "not a valid perdure session id" in (by_id["team/alice"].reason or "")
    assert by_id["bob"].status == "imported"
    assert not report.ok


def test_each_session_keeps_the_sdks_creation_time(
    sdk_db: tuple[Path, dict[str, list[object]]], tmp_path: Path
) -> None:
    db, _ = sdk_db
    with sqlite3.connect(db) as conn:
        # As the SDK stamps it: SQLite's CURRENT_TIMESTAMP, UTC without an offset.
        conn.execute("UPDATE agent_sessions SET created_at = '2025-01-02 03:04:05'")
        conn.execute("UPDATE agent_sessions SET created_at = 'soon' WHERE session_id = 'bob'")
    url = f"file:{tmp_path / 'store'}"
    result = invoke("migrate", "openai-agents", "--from", str(db), "--to", url, "--json")
    assert result.exit_code == 0, result.output
    notes = {s["session_id"]: s["notes"] for s in json.loads(result.stdout)["sessions"]}
    assert any("created_at 'soon' is no time" in note for note in notes["bob"])
    assert notes["alice"] == []
    listed = {m.session_id: m.created_at for m in asyncio.run(open_store(url).list())}
    assert listed["alice"] == listed["carol"] == "2025-01-02T03:04:05.000000Z"
    assert listed["bob"] > "2025-01-02T03:04:05.000000Z"  # the migration's time
