"""``perdure gc`` through its real entry point, on real stores."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import postgres_server
from helpers import set_created_at
from perdure import Agent
from perdure.checkpoints.store import FileCheckpointStore
from perdure.cli.gc import human_duration, short_time
from perdure.cli.main import cli
from perdure.errors import SessionNotFoundError
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore, open_store
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing.checkpoints import put_aged


def perdure(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None})
    return runner.invoke(cli, list(args), catch_exceptions=False)


def populate(store: SessionStore, ids: list[str], *, checkpoints: int = 0) -> None:
    for sid in ids:
        session = Session(store, sid)
        agent = Agent(model=ScriptedModel([f"{sid} answer"]), session_manager=session)
        agent(f"{sid} question")
        for _ in range(checkpoints):
            asyncio.run(session.checkpoint())


def age_file_session(store: FileSessionStore, session_id: str, days: float) -> None:
    """Make a file session look created and last written ``days`` ago (meta and mtime)."""
    when = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    set_created_at(store.session_dir(session_id), when.isoformat().replace("+00:00", "Z"))
    os.utime(store.session_dir(session_id) / "journal.jsonl", (when.timestamp(),) * 2)


def ids(store: SessionStore) -> list[str]:
    return [m.session_id for m in asyncio.run(store.list())]


def checkpoint_ids(store: Any, session_id: str) -> list[str]:
    return [m.checkpoint_id for m in asyncio.run(store.checkpoints.list(session_id))]


@pytest.fixture
def aged(tmp_path: Path) -> FileSessionStore:
    """Sessions idle for 40 days, 2 days and none."""
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["ancient", "recent", "today"])
    age_file_session(store, "ancient", 40)
    age_file_session(store, "recent", 2)
    return store


def test_gc_is_a_dry_run_by_default(aged: FileSessionStore) -> None:
    result = perdure("gc", "--store", f"file:{aged.root}", "--ttl", "30d")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("dry run: nothing was deleted")
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert rows[0][:5] == ["kind", "session", "updated", "idle", "messages"]
    assert [row[:2] for row in rows[1:]] == [["session", "ancient"]]
    assert "would delete 1 of 3 sessions and 0 checkpoints" in result.stderr
    drawn = perdure("gc", "--store", f"file:{aged.root}", "--ttl", "30d", "--format", "table")
    assert "sessions inactive for more than 30d:" in drawn.stdout  # a heading on a terminal
    assert "would delete 1 of 3 sessions and 0 checkpoints" in drawn.stdout
    assert ids(aged) == ["ancient", "recent", "today"]


def test_gc_apply_deletes_only_sessions_past_the_ttl(aged: FileSessionStore) -> None:
    result = perdure("gc", "--store", f"file:{aged.root}", "--ttl", "24h", "--apply", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["dry_run"] is False
    assert report["ttl_seconds"] == 86400
    assert [e["session_id"] for e in report["expired"]] == ["ancient", "recent"]
    assert report["expired"][0]["idle_seconds"] == pytest.approx(40 * 86400, abs=60)
    assert ids(aged) == ["today"]
    assert not aged.session_dir("ancient").exists()


def test_gc_removes_temp_files_and_empty_forks_killed_writers_left(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["kept"])

    async def killed_fork() -> None:  # the state a fork killed before its commit leaves
        async with store.writer_lock("orphan"):
            await store.create("orphan")

    asyncio.run(killed_fork())
    temp = store.session_dir("kept") / f".manifest.json.{'a' * 32}.tmp"
    temp.write_bytes(b'{"format": "perdure-manifest/1", "se')
    url = f"file:{store.root}"
    dry = perdure("gc", "--store", url, "--ttl", "30d")
    assert dry.exit_code == 0, dry.output
    assert "would delete what killed writers left: 1 empty session" in dry.stderr
    assert "1 temp file" in dry.stderr
    assert temp.exists()
    report = json.loads(perdure("gc", "--store", url, "--ttl", "30d", "--json").stdout)
    assert (report["orphans"], report["temp_files"]) == (["orphan"], [str(temp)])
    applied = perdure("gc", "--store", url, "--ttl", "30d", "--apply")
    assert applied.exit_code == 0, applied.output
    assert "deleted what killed writers left" in applied.stderr
    assert not temp.exists()
    assert ids(store) == ["kept"]


def test_gc_keeps_the_newest_checkpoints(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "p.db")
    populate(store, ["a", "b"], checkpoints=3)
    before = {sid: checkpoint_ids(store, sid) for sid in "ab"}
    url = f"sqlite:{store.path}"
    dry = perdure("gc", "--store", url, "--keep-checkpoints", "1")
    assert dry.exit_code == 0
    assert [line.split("\t")[0] for line in dry.stdout.splitlines()] == ["kind"] + 4 * [
        "checkpoint"
    ]
    assert "would delete 0 of 2 sessions and 4 checkpoints" in dry.stderr
    drawn = perdure("gc", "--store", url, "--keep-checkpoints", "1", "--format", "table")
    assert "checkpoints beyond each session's newest 1:" in drawn.stdout
    assert {sid: checkpoint_ids(store, sid) for sid in "ab"} == before
    done = perdure("gc", "--store", url, "--keep-checkpoints", "1", "--apply")
    assert done.exit_code == 0
    assert "deleted 0 of 2 sessions and 4 checkpoints" in done.stderr
    assert {sid: checkpoint_ids(store, sid) for sid in "ab"} == {
        sid: before[sid][-1:] for sid in "ab"
    }


def test_gc_deletes_checkpoints_older_than_the_age(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    populate(store, ["a"])
    old = asyncio.run(put_aged(store.checkpoints, "a", hours=30)).meta.checkpoint_id
    young = asyncio.run(put_aged(store.checkpoints, "a", hours=1)).meta.checkpoint_id
    url = f"file:{store.root}"
    bad = perdure("gc", "--store", url, "--max-checkpoint-age", "1.5d")
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: --max-checkpoint-age: '1.5d' is not a duration")
    dry = perdure("gc", "--store", url, "--max-checkpoint-age", "1d")
    assert dry.exit_code == 0
    assert "would delete 0 of 1 session and 1 checkpoint" in dry.stderr
    assert dry.stdout.splitlines()[1].split("\t")[:6] == ["checkpoint", "a", "", "", "", old]
    drawn = perdure("gc", "--store", url, "--max-checkpoint-age", "1d", "--format", "table")
    assert "checkpoints older than 1d:" in drawn.stdout
    done = perdure("gc", "--store", url, "--max-checkpoint-age", "2h", "--apply", "--json")
    assert done.exit_code == 0
    report = json.loads(done.stdout)
    assert report["max_checkpoint_age"] == 7200
    assert [p["checkpoint_id"] for p in report["pruned"]] == [old]
    assert checkpoint_ids(store, "a") == [young]


def test_gc_ttl_on_sqlite_with_a_given_now(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "p.db")
    populate(store, ["a", "b"], checkpoints=1)
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE perdure_sessions SET updated_at = '2025-01-01T00:00:00Z' WHERE id='a'")
        conn.execute("UPDATE perdure_sessions SET updated_at = '2025-03-01T00:00:00Z' WHERE id='b'")
    conn.close()
    url = f"sqlite:{store.path}"
    args = ["gc", "--store", url, "--ttl", "2w", "--now", "2025-03-02T00:00:00Z", "--json"]
    report = json.loads(perdure(*args).stdout)
    assert [e["session_id"] for e in report["expired"]] == ["a"]
    assert report["now"] == "2025-03-02T00:00:00.000000Z"
    assert perdure(*args, "--apply").exit_code == 0
    assert ids(store) == ["b"]
    assert checkpoint_ids(store, "a") == []  # deleted with their session


def test_gc_reports_a_locked_session_and_exits_1(aged: FileSessionStore) -> None:
    async def scenario() -> Result:
        async with FileSessionStore(aged.root).writer_lock("ancient"):
            return await asyncio.to_thread(
                perdure, "gc", "--store", f"file:{aged.root}", "--ttl", "30d", "--apply"
            )

    result = asyncio.run(scenario())
    assert result.exit_code == 1
    assert "session_locked" in result.stdout
    assert ids(aged) == ["ancient", "recent", "today"]


@pytest.mark.parametrize("ttl", ["30", "30x", "0d", "-1d", "1.5h", "30 d", "1d2h", ""])
def test_a_bad_duration_is_a_usage_error_naming_the_option(
    aged: FileSessionStore, ttl: str
) -> None:
    result = perdure("gc", "--store", f"file:{aged.root}", "--ttl", ttl, "--apply")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --ttl: {ttl!r} is not a duration")
    assert result.stderr.count("\n") == 1
    assert ids(aged) == ["ancient", "recent", "today"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: nothing to do: give --ttl, --keep-checkpoints, --max-checkpoint-age"),
        (["--keep-checkpoints", "-1"], "error: --keep-checkpoints must be 0 or more"),
        (["--ttl", "1d", "--store", "redis2:x"], "error: --store: unknown store scheme"),
        (["--ttl", "1d", "--now", "yesterday"], "error: --now: 'yesterday' is not an ISO-8601"),
    ],
)
def test_bad_inputs_get_one_line_and_exit_2(
    aged: FileSessionStore, args: list[str], message: str
) -> None:
    result = perdure("gc", "--store", f"file:{aged.root}", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1


def test_gc_on_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    result = perdure("gc", "--store", f"sqlite:{tmp_path}/none.db", "--ttl", "1d", "--apply")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: no store at")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (61, "1m 1s"), (3600, "1h"), (90061, "1d 1h"), (40 * 86400, "40d")],
)
def test_idle_times_read_well(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_table_times_are_cut_to_the_second() -> None:
    assert short_time("2025-03-01T12:00:05.123456Z") == "2025-03-01T12:00:05Z"


def test_gc_ttl_on_postgres_deletes_the_idle_session_with_its_checkpoints(
    request: pytest.FixtureRequest,
) -> None:
    url = postgres_server.store_url(request)
    store = open_store(url)
    populate(store, ["a", "b"], checkpoints=1)
    schema = url.rsplit("schema=", 1)[1]
    postgres_server.execute(
        f"UPDATE \"{schema}\".perdure_sessions SET updated_at = '2025-01-01T00:00:00Z' "
        "WHERE id = 'a'"
    )
    args = ["gc", "--store", url, "--ttl", "2w", "--now", "2025-03-02T00:00:00Z", "--json"]
    report = json.loads(perdure(*args).stdout)
    assert [e["session_id"] for e in report["expired"]] == ["a"]
    assert perdure(*args, "--apply").exit_code == 0
    assert ids(store) == ["b"]
    assert checkpoint_ids(store, "a") == []
    assert len(checkpoint_ids(store, "b")) == 1
    getattr(store, "close", lambda: None)()


def test_gc_checkpoints_prunes_a_postgres_checkpoint_store_of_its_own(
    request: pytest.FixtureRequest,
) -> None:
    postgres_server.require_server()
    from perdure.stores.postgres import PostgresCheckpointStore

    schema = postgres_server.new_schema_name()
    request.addfinalizer(lambda: postgres_server.drop_schema(schema))
    url = f"{postgres_server.DSN}?schema={schema}"
    absent = perdure("gc", "--checkpoints", url, "--max-checkpoint-age", "1d")
    assert absent.exit_code == 3  # no tables: reported, nothing created
    assert absent.stderr.startswith("error: no checkpoint store at")
    store = PostgresCheckpointStore(postgres_server.DSN, schema=schema)
    try:
        # Sessions that live in another store (Redis, say), or lived there once.
        old = asyncio.run(put_aged(store, "gone", hours=100 * 24)).meta.checkpoint_id
        young = asyncio.run(put_aged(store, "live", hours=1)).meta.checkpoint_id
        dry = perdure("gc", "--checkpoints", url, "--max-checkpoint-age", "90d")
        assert dry.exit_code == 0, dry.stderr
        assert "would delete 0 of 2 sessions and 1 checkpoint" in dry.stderr
        done = perdure(
            "gc", "--checkpoints", f"{url}&max_checkpoint_age=7776000", "--apply", "--json"
        )
        assert done.exit_code == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["max_checkpoint_age"], report["sessions_checked"]) == (7776000, 2)
        assert [p["checkpoint_id"] for p in report["pruned"]] == [old]
        assert asyncio.run(store.checkpoint_ids("gone")) == []
        assert asyncio.run(store.checkpoint_ids("live")) == [young]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-checkpoint-age", "1d", "--ttl", "1d"], "error: --ttl expires sessions"),
        ([], "error: nothing to do: give --keep-checkpoints, --max-checkpoint-age"),
        (["--keep-checkpoints", "1", "--checkpoints", "sqlite:x.db"], "error: --checkpoints:"),
        (["--keep-checkpoints", "1", "--checkpoints", "postgresql://h/d?ttl=1"], "error: --check"),
    ],
)
def test_gc_checkpoints_bad_inputs_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    cps = FileCheckpointStore(tmp_path / "cps")
    asyncio.run(put_aged(cps, "s", hours=1))
    result = perdure("gc", "--checkpoints", f"file:{cps.root}", *args)
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(message)


def test_gc_checkpoints_on_a_file_checkpoint_store(tmp_path: Path) -> None:
    cps = FileCheckpointStore(tmp_path / "cps")
    made = [asyncio.run(put_aged(cps, sid, hours=h)) for sid, h in (("a", 50), ("a", 1), ("b", 2))]
    missing = perdure("gc", "--checkpoints", f"file:{tmp_path}/none", "--keep-checkpoints", "1")
    assert missing.exit_code == 3
    done = perdure("gc", "--checkpoints", f"file:{cps.root}", "--keep-checkpoints", "1", "--apply")
    assert done.exit_code == 0, done.stderr
    assert "deleted 0 of 2 sessions and 1 checkpoint" in done.stderr
    assert asyncio.run(cps.checkpoint_sessions()) == ["a", "b"]
    assert asyncio.run(cps.checkpoint_ids("a")) == [made[1].meta.checkpoint_id]


@pytest.fixture(params=["file", "sqlite", "postgres"])
def ttl_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL with ``ttl=3600`` (an hour of inactivity)."""
    if request.param == "postgres":
        return postgres_server.store_url(request) + "&ttl=3600"
    if request.param == "file":
        return f"file:{tmp_path / 'store'}?ttl=3600"
    return f"sqlite:{tmp_path / 'p.db'}?ttl=3600"


def last_used(url: str, session_id: str, seconds_ago: float) -> None:
    """Make the session's last use ``seconds_ago`` (behind the store's back)."""
    if url.startswith("postgresql"):
        schema = url.split("schema=", 1)[1].split("&", 1)[0]
        postgres_server.execute(
            f'UPDATE "{schema}".perdure_sessions SET touched_at = now() - %s * interval '
            "'1 second' WHERE id = %s",
            (seconds_ago, session_id),
        )
        return
    path = Path(url.split(":", 1)[1].split("?", 1)[0])
    stamps = path / ".ttl" if url.startswith("file:") else Path(f"{path}.ttl")
    when = dt.datetime.now(dt.UTC).timestamp() - seconds_ago
    os.utime(stamps / session_id, (when, when))


def stored_messages(url: str) -> int:
    """Messages stored in the store's files or rows, read behind its back."""
    path = Path(url.split(":", 1)[1].split("?", 1)[0])
    if url.startswith("postgresql"):
        schema = url.split("schema=", 1)[1].split("&", 1)[0]
        rows = postgres_server.execute(f'SELECT count(*) FROM "{schema}".perdure_messages')
        return int(str(rows[0][0]))
    if url.startswith("sqlite:"):
        with sqlite3.connect(path) as conn:
            return int(conn.execute("SELECT count(*) FROM perdure_messages").fetchone()[0])
    return sum(
        len(p.read_bytes().splitlines()) - 1  # the genesis record is no message
        for p in (path / "sessions").glob("*/journal.jsonl")
    )


def test_gc_deletes_what_the_stores_own_ttl_expired_and_keeps_its_tombstone(
    ttl_url: str,
) -> None:
    store = open_store(ttl_url)
    populate(store, ["idle", "used"], checkpoints=1)
    before = stored_messages(ttl_url)
    last_used(ttl_url, "idle", 2 * 3600)

    dry = json.loads(perdure("gc", "--store", ttl_url, "--json").stdout)
    assert dry["ttl_seconds"] == 3600
    assert [(e["session_id"], e["message_count"]) for e in dry["expired"]] == [("idle", 2)]
    assert dry["expired"][0]["idle_seconds"] == pytest.approx(7200, abs=60)
    assert stored_messages(ttl_url) == before

    table = perdure("gc", "--store", ttl_url, "--apply", "--format", "table")
    assert table.exit_code == 0, table.output
    assert "sessions inactive for more than 3600s (the store's ttl):" in table.stdout
    assert "deleted 1 of 2 sessions and 0 checkpoints" in table.stdout
    assert stored_messages(ttl_url) == before - 2  # idle's two messages are gone
    assert ids(store) == ["used"]
    with pytest.raises(SessionNotFoundError) as info:
        asyncio.run(store.get("idle"))
    assert info.value.details["reason"] == "expired"  # its tombstone
    assert len(checkpoint_ids(store, "idle")) == 1  # kept (SPEC §9)
    assert len(asyncio.run(store.get("used")).messages) == 2

    # The tombstone lives max(10 × ttl, 7 days) after the last use; then gc drops it.
    last_used(ttl_url, "idle", 8 * 86400)
    again = json.loads(perdure("gc", "--store", ttl_url, "--apply", "--json").stdout)
    assert again["expired"] == []
    with pytest.raises(SessionNotFoundError) as info:
        asyncio.run(store.get("idle"))
    assert info.value.details["reason"] == "unknown"
    getattr(store, "close", lambda: None)()


def test_gc_without_limits_on_a_store_without_a_ttl_has_nothing_to_do(tmp_path: Path) -> None:
    populate(FileSessionStore(tmp_path / "d"), ["a"])
    result = perdure("gc", "--store", f"file:{tmp_path / 'd'}")
    assert result.exit_code == 2
    assert "a store URL with a ttl" in result.stderr
