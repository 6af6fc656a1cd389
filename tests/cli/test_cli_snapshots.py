"""``perdure snapshots list|show|restore`` through the real entry points.

The storage is written by a real ``SnapshotSessionManager`` (with a ``snapshot_trigger``
appending an immutable snapshot after every invocation), on files, on SQLite, on
PostgreSQL (a schema of its own, dropped after the test; see postgres_server), on
Redis (a key prefix of its own, likewise; see redis_server) and on S3 (moto's server
on loopback, a bucket of its own; see s3_server).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import postgres_server
import redis_server
import s3_server
from perdure import Agent
from perdure.cli._common import EXIT_CORRUPTED, EXIT_NOT_FOUND, EXIT_USAGE
from perdure.cli.main import cli
from perdure.cli.render import human_size
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder, Swarm
from perdure.session import SnapshotSessionManager
from perdure.storage import LocalFileStorage, SQLiteStorage, Storage, open_storage

ABSENT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # a well-formed ULID no snapshot has
PNG = b"\x89PNG\r\n\x1a\n" + bytes(100)


def invoke(*args: str) -> Result:
    """Run ``perdure ARGS``; an unexpected exception fails the test with its traceback."""
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def ok_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def fill(storage: Storage) -> None:
    """Three invocations of a real agent; a snapshot after each, the second with an image."""
    manager = SnapshotSessionManager("s1", storage=storage, snapshot_trigger=lambda **_: True)
    agent = Agent(model=ScriptedModel(["one", "a picture", "three"]), session_manager=manager)
    agent("hello")
    agent.state.set("city", "Paris")
    agent(
        [
            {"text": "what is this?"},
            {"image": {"format": "png", "source": {"bytes": PNG}}},
        ]
    )
    agent.state.set("step", 3)
    agent("last one")


@pytest.fixture(params=["file", "sqlite", "postgres", "redis", "s3"])
def storage_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    if request.param == "s3":
        endpoint = s3_server.endpoint()
        for name, value in s3_server.ENV.items():
            monkeypatch.setenv(name, value)
        bucket = s3_server.new_bucket()
        storage = open_storage(f"s3://{bucket}/snaps?endpoint_url={endpoint}")
        fill(storage)
        # The endpoint from the environment, as any AWS tool takes it.
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        yield f"s3://{bucket}/snaps"
    elif request.param == "redis":
        server = redis_server.require_server()
        prefix = redis_server.new_prefix()
        url = f"{server}?prefix={prefix}"
        storage = open_storage(url)
        fill(storage)
        close(storage)
        yield url
        redis_server.drop_prefix(prefix)
    elif request.param == "postgres":
        url = postgres_server.store_url(request) + "&table=snapshots"
        postgres = open_storage(url)
        fill(postgres)
        close(postgres)
        yield url
    elif request.param == "file":
        storage: Storage = LocalFileStorage(tmp_path / "blobs")
        fill(storage)
        yield f"file:{tmp_path / 'blobs'}"
    else:
        sqlite = SQLiteStorage(tmp_path / "blobs.db")
        fill(sqlite)
        sqlite.close()
        yield f"sqlite:{tmp_path / 'blobs.db'}"


def close(storage: Storage) -> None:
    closer = getattr(storage, "close", None)
    if closer is not None:
        closer()


def snapshot_ids(storage_url: str) -> list[str]:
    listing = ok_json("snapshots", "list", "s1", "--storage", storage_url)
    return [row["snapshot_id"] for row in listing["snapshots"]]


def test_list_shows_ids_oldest_first_with_time_and_message_count(storage_url: str) -> None:
    listing = ok_json("snapshots", "list", "s1", "--storage", storage_url)
    rows = listing["snapshots"]
    assert [row["message_count"] for row in rows] == [2, 4, 6]
    ids = [row["snapshot_id"] for row in rows]
    assert ids == sorted(ids)
    assert all(row["created_at"].endswith("Z") for row in rows)
    assert listing["latest"] == {"message_count": 6}
    assert listing["next_cursor"] is None
    text = invoke("snapshots", "list", "s1", "--storage", storage_url)
    assert text.exit_code == 0, text.stderr
    assert all(snapshot_id in text.stdout for snapshot_id in ids)
    assert text.stdout.splitlines()[0] == "#\tsnapshot id\tcreated\tmessages"  # only the table
    assert len(text.stdout.splitlines()) == 4
    assert "snapshot_latest: 6 messages" in text.stderr  # the summary: on stderr when piped


def test_list_pages_with_limit_and_after(storage_url: str) -> None:
    ids = snapshot_ids(storage_url)
    page = ok_json("snapshots", "list", "s1", "--storage", storage_url, "--limit", "2")
    assert [row["snapshot_id"] for row in page["snapshots"]] == ids[:2]
    assert page["next_cursor"] == ids[1]
    rest = ok_json("snapshots", "list", "s1", "--storage", storage_url, "--after", ids[1])
    assert [row["snapshot_id"] for row in rest["snapshots"]] == ids[2:]


def test_show_latest_names_images_instead_of_dumping_them(storage_url: str) -> None:
    result = invoke("snapshots", "show", "s1", "--storage", storage_url, "--messages", "6")
    assert result.exit_code == 0, result.stderr
    assert f"[image png, {human_size(len(PNG))}]" in result.stdout
    assert "#5 assistant" in result.stdout
    assert "iVBORw0KGgo" not in result.stdout  # no base64 PNG
    assert "city, step" in result.stdout
    info = ok_json("snapshots", "show", "s1", "latest", "--storage", storage_url)
    assert info["message_count"] == 6
    assert info["state_keys"] == ["city", "step"]
    assert len(info["last_messages"]) == 5
    image = info["last_messages"][1]["content"][1]["image"]  # message 2 of 6
    assert image["source"]["bytes"] == {"bytes": len(PNG)}


def test_show_an_immutable_snapshot(storage_url: str) -> None:
    first = snapshot_ids(storage_url)[0]
    info = ok_json("snapshots", "show", "s1", first, "--storage", storage_url)
    assert (info["snapshot_id"], info["message_count"]) == (first, 2)
    assert info["created_at"].endswith("Z")
    assert info["state_keys"] == []


def test_restore_makes_a_snapshot_the_latest_and_keeps_a_backup(storage_url: str) -> None:
    first = snapshot_ids(storage_url)[0]
    result = invoke("snapshots", "restore", "s1", first, "--storage", storage_url)
    assert result.exit_code == 0, result.stderr
    assert "messages: 6 → 2 (first 2 unchanged)" in result.stdout
    assert "state removed: city, step" in result.stdout
    assert "kept as snapshot" in result.stdout
    listing = ok_json("snapshots", "list", "s1", "--storage", storage_url)
    assert listing["latest"] == {"message_count": 2}
    assert [row["message_count"] for row in listing["snapshots"]] == [2, 4, 6, 6]
    # A real agent built on the same storage resumes from the restored latest.
    storage = open_storage(storage_url)
    try:
        manager = SnapshotSessionManager("s1", storage=storage)
        agent = Agent(model=ScriptedModel(["again"]), session_manager=manager)
        agent("and now?")
        assert [m["role"] for m in agent.messages] == ["user", "assistant"] * 2
        assert agent.state.get() == {}
    finally:
        close(storage)
    # The backup undoes it.
    backup = listing["snapshots"][-1]["snapshot_id"]
    undo = ok_json("snapshots", "restore", "s1", backup, "--storage", storage_url, "--no-backup")
    assert (undo["messages_before"], undo["messages_after"]) == (4, 6)
    assert undo["backup_snapshot_id"] is None


def test_unknown_snapshot_session_or_storage_is_not_found(storage_url: str, tmp_path: Path) -> None:
    for args in (
        ("show", "s1", ABSENT),
        ("restore", "s1", ABSENT),
        ("list", "nobody"),
        ("show", "nobody"),
    ):
        result = invoke("snapshots", *args, "--storage", storage_url)
        assert result.exit_code == EXIT_NOT_FOUND, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("error: ")
    if storage_url.startswith("s3://"):
        gone = invoke("snapshots", "list", "s1", "--storage", "s3://perdure-no-such-bucket/p")
        assert gone.exit_code == EXIT_NOT_FOUND, gone.stderr
        assert "no such bucket" in gone.stderr
    missing = invoke("snapshots", "list", "s1", "--storage", f"file:{tmp_path / 'nowhere'}")
    assert missing.exit_code == EXIT_NOT_FOUND
    assert "no snapshot storage" in missing.stderr
    assert not (tmp_path / "nowhere").exists()


def test_a_postgres_schema_without_the_storage_exits_3_and_is_not_made() -> None:
    postgres_server.require_server()
    schema = postgres_server.new_schema_name()
    for url in (
        f"{postgres_server.DSN}?schema={schema}",
        f"{postgres_server.DSN}?schema={schema}&table=other",
    ):
        result = invoke("snapshots", "list", "s1", "--storage", url)
        assert result.exit_code == EXIT_NOT_FOUND, result.stderr
        assert "no snapshot storage" in result.stderr
    made = postgres_server.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    assert made == []
    bad = invoke("snapshots", "list", "s1", "--storage", "postgresql://db/app?table=a-b")
    assert bad.exit_code == EXIT_USAGE
    assert "--storage" in bad.stderr


def test_bad_ids_cursors_and_urls_are_usage_errors(storage_url: str) -> None:
    for args in (
        ("show", "s1", "not-a-ulid"),
        ("restore", "s1", "01arz3ndektsv4rrffq69g5fav"),
        ("list", "s1", "--after", "nope"),
        ("list", "s1", "--limit", "-1"),
        ("list", "../etc"),
    ):
        result = invoke("snapshots", *args, "--storage", storage_url)
        assert result.exit_code == EXIT_USAGE, (args, result.stdout, result.stderr)
    for url in ("ftp://x", "file:", "nowhere", "s3://bucket/p?colour=red"):
        result = invoke("snapshots", "list", "s1", "--storage", url)
        assert result.exit_code == EXIT_USAGE, (url, result.stderr)
        assert "--storage" in result.stderr


def corrupt_file(root: Path, snapshot_id: str) -> None:
    path = root / "sessions" / "s1" / "agents" / "default" / "snapshots" / f"{snapshot_id}.blob"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def corrupt_sqlite(path: Path, snapshot_id: str) -> None:
    key = f"sessions/s1/agents/default/snapshots/{snapshot_id}"
    with sqlite3.connect(path) as conn:
        (data,) = conn.execute("SELECT data FROM perdure_blobs WHERE key = ?", (key,)).fetchone()
        damaged = bytearray(data)
        damaged[len(damaged) // 2] ^= 0x01
        conn.execute("UPDATE perdure_blobs SET data = ? WHERE key = ?", (bytes(damaged), key))
    conn.close()


def corrupt_postgres(url: str, snapshot_id: str) -> None:
    schema = url.split("schema=")[1].split("&")[0]
    key = f"sessions/s1/agents/default/snapshots/{snapshot_id}"
    postgres_server.execute(
        f'UPDATE "{schema}".snapshots SET data = set_byte(data, length(data) / 2, '
        "get_byte(data, length(data) / 2) # 1) WHERE key = %s",
        (key,),
    )


def corrupt_redis(url: str, snapshot_id: str) -> None:
    prefix = url.split("prefix=")[1]
    key = f"sessions/s1/agents/default/snapshots/{snapshot_id}"
    with redis_server.client() as c:
        data = bytearray(c.hget(f"{prefix}{{storage}}:data", key))
        data[len(data) // 2] ^= 0x01
        c.hset(f"{prefix}{{storage}}:data", key, bytes(data))


def corrupt_s3(url: str, snapshot_id: str) -> None:
    storage = open_storage(url)
    key = f"sessions/s1/agents/default/snapshots/{snapshot_id}"
    data = bytearray(asyncio.run(storage.read(key)) or b"")
    data[len(data) // 2] ^= 0x01
    asyncio.run(storage.write(key, bytes(data)))


def test_a_flipped_byte_is_corruption(storage_url: str) -> None:
    ids = snapshot_ids(storage_url)
    scheme, _, path = storage_url.partition(":")
    if scheme == "file":
        corrupt_file(Path(path), ids[1])
    elif scheme == "sqlite":
        corrupt_sqlite(Path(path), ids[1])
    elif scheme == "redis":
        corrupt_redis(storage_url, ids[1])
    elif scheme == "s3":
        corrupt_s3(storage_url, ids[1])
    else:
        corrupt_postgres(storage_url, ids[1])
    shown = invoke("snapshots", "show", "s1", ids[1], "--storage", storage_url)
    assert shown.exit_code == EXIT_CORRUPTED, shown.stderr
    assert "session_store_corrupted" in shown.stderr
    restored = invoke("snapshots", "restore", "s1", ids[1], "--storage", storage_url)
    assert restored.exit_code == EXIT_CORRUPTED
    listed = invoke("snapshots", "list", "s1", "--storage", storage_url, "--json")
    assert listed.exit_code == EXIT_CORRUPTED
    rows = json.loads(listed.stdout)["snapshots"]
    assert [row.get("error") is not None for row in rows] == [False, True, False]
    # The others are still readable.
    assert (
        ok_json("snapshots", "show", "s1", ids[2], "--storage", storage_url)["message_count"] == 6
    )


def test_the_module_runs_as_a_subprocess(tmp_path: Path) -> None:
    fill(LocalFileStorage(tmp_path / "blobs"))
    completed = subprocess.run(
        [sys.executable, "-m", "perdure", "snapshots", "list", "s1", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", "PERDURE_STORAGE": "file:blobs"},
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert [row["message_count"] for row in json.loads(completed.stdout)["snapshots"]] == [2, 4, 6]


class Stop(KeyboardInterrupt):
    """Stands in for the process dying inside a node (it goes up, unrecorded)."""


def graph_run(storage: Storage, *, stop_at: str | None) -> str:
    """Run plan -> draft -> review (review an agent) on ``storage``, session s2.

    With ``stop_at`` that node is cut off as a crash would: the run stays unfinished.
    """

    def step(name: str) -> Any:
        async def run_node(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
            if name == stop_at:
                raise Stop
            state[name] = True
            return f"{name} done"

        return run_node

    b = GraphBuilder()
    b.add_node(step("plan"), "plan")
    b.add_node(step("draft"), "draft")
    b.add_node(Agent(ScriptedModel(["looks good"]), agent_id="reviewer"), "review")
    b.add_edge("plan", "draft")
    b.add_edge("draft", "review")
    b.set_entry_point("plan")
    manager = SnapshotSessionManager("s2", storage=storage, multi_agent_save_latest_on="node")
    graph = b.build(session_manager=manager, graph_id="release")
    try:
        return graph("ship it").status
    except Stop:
        return "stopped"


def swarm_run(storage: Storage) -> None:
    call = {"agent": "b", "message": "check the numbers", "context": {"year": 2026}}
    a = Agent(
        ScriptedModel(
            [
                {
                    "role": "assistant",
                    "content": [{"toolUse": {"toolUseId": "h1", "name": "handoff", "input": call}}],
                }
            ]
        ),
        name="a",
        agent_id="a",
    )
    b = Agent(ScriptedModel(["checked"]), name="b", agent_id="b")
    manager = SnapshotSessionManager("s2", storage=storage, multi_agent_save_latest_on="node")
    assert Swarm([a, b], session_manager=manager, swarm_id="desk")("task").status == "completed"


def test_runs_show_where_a_cut_off_graph_stands_and_that_it_resumed(storage_url: str) -> None:
    storage = open_storage(storage_url)
    try:
        assert graph_run(storage, stop_at="draft") == "stopped"
        listing = ok_json("snapshots", "runs", "s2", "--storage", storage_url)
        assert listing["runs"] == [
            {
                "run_id": "release",
                "kind": "graph",
                "task": "ship it",
                "status": "running",
                "completed": ["plan"],
                "pending": ["draft"],
                "error": None,
            }
        ]
        shown = ok_json("snapshots", "runs", "s2", "release", "--storage", storage_url)
        assert shown["results"] == {"plan": "plan done"}
        assert shown["shared"] == {"plan": True}
        assert shown["agents_in_run"] == []
        table = invoke("snapshots", "runs", "s2", "release", "--storage", storage_url)
        assert table.exit_code == 0
        assert "next\tdraft" in table.stdout  # piped: TSV
        # Resumed by a rebuilt graph: the listing says it completed, the agent kept in it.
        assert graph_run(storage, stop_at=None) == "completed"
        shown = ok_json("snapshots", "runs", "s2", "release", "--storage", storage_url)
        assert shown["status"] == "completed"
        assert shown["completed"] == ["plan", "draft", "review"]
        assert shown["results"]["review"] == "looks good"
        assert shown["agents_in_run"] == ["reviewer"]
        swarm_run(storage)
        listing = ok_json("snapshots", "runs", "s2", "--storage", storage_url)
        assert [(r["run_id"], r["kind"], r["status"]) for r in listing["runs"]] == [
            ("desk", "swarm", "completed"),
            ("release", "graph", "completed"),
        ]
        desk = ok_json("snapshots", "runs", "s2", "desk", "--storage", storage_url)
        assert desk["handoffs"] == [{"from": "a", "to": "b", "message": "check the numbers"}]
        assert desk["shared"] == {"year": 2026}
    finally:
        close(storage)


def test_runs_of_a_session_without_any_and_unknown_runs(storage_url: str) -> None:
    empty = invoke("snapshots", "runs", "s1", "--storage", storage_url, "--json")
    assert empty.exit_code == 0, empty.stderr
    assert json.loads(empty.stdout) == {"session_id": "s1", "runs": []}
    missing = invoke("snapshots", "runs", "s1", "nope", "--storage", storage_url)
    assert missing.exit_code == EXIT_NOT_FOUND
    assert "has no run 'nope'" in missing.stderr
    bad = invoke("snapshots", "runs", "s1", "a/b", "--storage", storage_url)
    assert bad.exit_code == EXIT_USAGE
    assert "RUN 'a/b' is invalid" in bad.stderr


def test_a_damaged_run_is_corruption_in_the_listing_and_when_shown(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path / "blobs")
    graph_run(storage, stop_at="draft")
    swarm_run(storage)
    url = f"file:{tmp_path / 'blobs'}"
    blob = tmp_path / "blobs" / "sessions" / "s2" / "multi_agents" / "release" / "latest.blob"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    shown = invoke("snapshots", "runs", "s2", "release", "--storage", url)
    assert shown.exit_code == EXIT_CORRUPTED, shown.stderr
    assert "session_store_corrupted" in shown.stderr
    listed = invoke("snapshots", "runs", "s2", "--storage", url, "--json")
    assert listed.exit_code == EXIT_CORRUPTED
    rows = {row["run_id"]: row for row in json.loads(listed.stdout)["runs"]}
    assert rows["release"]["damaged"] is True
    assert "session_store_corrupted" in rows["release"]["error"]
    assert rows["desk"]["status"] == "completed"  # the other run is still read


def test_every_command_has_help() -> None:
    for args in (
        ("snapshots",),
        ("snapshots", "list"),
        ("snapshots", "show"),
        ("snapshots", "restore"),
        ("snapshots", "runs"),
    ):
        result = invoke(*args, "--help")
        assert result.exit_code == 0
        assert "Usage:" in result.stdout
