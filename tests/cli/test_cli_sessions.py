"""``perdure sessions list|show|history|delete`` through the real entry points.

Every test runs the click group ``perdure.cli.main.cli`` (or ``python -m perdure``)
on file and SQLite stores the test fills with real agents and sessions.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import postgres_server
from perdure import Agent, tool
from perdure.cli._common import (
    EXIT_CORRUPTED,
    EXIT_LOCKED,
    EXIT_NOT_FOUND,
    EXIT_PROBLEM,
    EXIT_USAGE,
)
from perdure.cli.main import cli
from perdure.cli.render import format_time, human_size, render_message
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder
from perdure.session import Session, SessionStore, open_store

PNG = b"\x89PNG\r\n\x1a\n" + bytes(2040)  # 2048 bytes: "2.0 KiB"
NOTES = b"remember the milk\n" * 30  # 540 bytes


@tool
def snapshot(city: str) -> list[dict[str, Any]]:
    """Take a picture of a city.

    Args:
        city: where to point the camera.
    """
    return [{"text": f"a view of {city}"}, {"image": {"format": "png", "source": {"bytes": PNG}}}]


def invoke(*args: str, input: str | None = None) -> Result:
    """Run ``perdure ARGS``; an unexpected exception fails the test with its traceback."""
    result = CliRunner().invoke(cli, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def assert_error(result: Result, code: int, *fragments: str) -> None:
    """The command failed with ``code`` and one ``error: …`` line naming ``fragments``."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


@pytest.fixture(params=["file", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_server.store_url(request)
    return (
        f"file:{tmp_path / 'store'}" if request.param == "file" else f"sqlite:{tmp_path / 'p.db'}"
    )


def close(store: SessionStore) -> None:
    getattr(store, "close", lambda: None)()


def seed(url: str, session_id: str = "s1") -> None:
    """Store a conversation with a tool call, an image result and a document, and state."""
    store = open_store(url)
    model = ScriptedModel(
        [
            {
                "role": "assistant",
                "content": [
                    {"text": "Let me look."},
                    {"toolUse": {"toolUseId": "t1", "name": "snapshot", "input": {"city": "Oslo"}}},
                ],
            },
            "Oslo looks sunny.",
            "Noted.",
        ]
    )
    agent = Agent(model=model, tools=[snapshot], session_manager=Session(store, session_id))
    agent("How does Oslo look?")
    agent.state.set("city", "Oslo")
    agent(
        [
            {"text": "keep these notes"},
            {"document": {"format": "txt", "name": "notes.txt", "source": {"bytes": NOTES}}},
        ]
    )
    close(store)


@pytest.fixture
def seeded(store_url: str) -> str:
    seed(store_url)
    return store_url


def test_list_shows_metadata_never_content(seeded: str) -> None:
    seed(seeded, "s2")
    result = invoke("sessions", "list", "--store", seeded)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "id" in line)
    assert header.split() == ["id", "created", "updated", "messages"]
    row = next(line for line in lines if line.split()[:1] == ["s1"])
    assert row.split()[-1] == "6"
    assert "Oslo" not in result.stdout

    data = json.loads(invoke("sessions", "list", "--store", seeded, "--json").stdout)
    assert [s["session_id"] for s in data["sessions"]] == ["s1", "s2"]
    assert set(data["sessions"][0]) == {
        "session_id",
        "created_at",
        "updated_at",
        "message_count",
        "damaged",
        "expires_at",
        "expires_in",
    }
    assert data["sessions"][0]["message_count"] == 6
    assert data["sessions"][0]["damaged"] is None
    assert data["sessions"][0]["expires_at"] is None  # no ttl
    assert data["sessions"][0]["expires_in"] is None
    assert data["next_after"] is None


@pytest.mark.parametrize("damage", ["missing", "unreadable"])
def test_one_bad_meta_json_is_marked_and_the_rest_listed(tmp_path: Path, damage: str) -> None:
    url = f"file:{tmp_path / 'data'}"
    for sid in ("s1", "s2", "s3"):
        seed(url, sid)
    meta = tmp_path / "data" / "sessions" / "s2" / "meta.json"
    if damage == "missing":
        meta.unlink()
    else:
        meta.write_bytes(b"{broken")
    result = invoke("sessions", "list", "--store", url)
    assert result.exit_code == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.strip()}
    assert rows["s1"][-1] == rows["s3"][-1] == "6"
    assert rows["s2"][-1] == "damaged"
    assert "1 session damaged" in result.stderr  # notes leave piped TSV a pure table
    data = json.loads(invoke("sessions", "list", "--store", url, "--json").stdout)
    assert [(s["session_id"], s["damaged"] is None) for s in data["sessions"]] == [
        ("s1", True),
        ("s2", False),
        ("s3", True),
    ]
    verified = invoke("verify", "--store", url)
    assert verified.exit_code == EXIT_PROBLEM
    assert "1 of 3 sessions damaged" in verified.stderr


def test_list_pages_with_limit_and_after(seeded: str) -> None:
    seed(seeded, "s2")
    seed(seeded, "s3")
    first = json.loads(invoke("sessions", "list", "--limit", "2", "--json", "-s", seeded).stdout)
    assert [s["session_id"] for s in first["sessions"]] == ["s1", "s2"]
    assert first["next_after"] == "s2"
    rest = invoke("sessions", "list", "--limit", "2", "--after", "s2", "--json", "-s", seeded)
    assert [s["session_id"] for s in json.loads(rest.stdout)["sessions"]] == ["s3"]
    human = invoke("sessions", "list", "--limit", "1", "-s", seeded)
    assert "more: --after s1" in human.stderr
    assert_error(invoke("sessions", "list", "--limit", "0", "-s", seeded), EXIT_USAGE, "--limit")


def test_list_of_an_empty_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = invoke("sessions", "list", "--store", f"file:{tmp_path / 'empty'}")
    # Piped: the header alone (a script reads "no rows"), the sentence on stderr.
    assert (result.exit_code, result.stdout) == (0, "id\tcreated\tupdated\tmessages\n")
    assert result.stderr == "no sessions\n"
    drawn = invoke("sessions", "list", "--store", f"file:{tmp_path / 'empty'}", "--format", "table")
    assert drawn.stdout == "no sessions\n"  # on a terminal: the sentence, no empty table


def test_show_summarises_state_and_checkpoints(seeded: str) -> None:
    assert invoke("checkpoints", "create", "s1", "-s", seeded).exit_code == 0
    result = invoke("sessions", "show", "s1", "--store", seeded)
    assert result.exit_code == 0, result.stderr
    rows = {
        line.split(None, 1)[0]: line.split(None, 1)[1].strip()
        for line in result.stdout.splitlines()
        if line.strip()
    }
    assert rows["session"] == "s1"
    assert rows["messages"] == "6"
    assert rows["state"] == "1 key: city"
    assert rows["interrupts"] == "0 pending"
    assert rows["checkpoints"].startswith("1 (latest ")
    assert "Oslo" not in result.stdout  # state values are not shown

    data = json.loads(invoke("sessions", "show", "s1", "--store", seeded, "--json").stdout)
    assert data["session_id"] == "s1"
    assert data["message_count"] == 6
    assert data["agent_state"]["state_keys"] == ["city"]
    assert data["agent_state"]["removed_message_count"] == 0
    assert data["checkpoints"] == 1
    assert len(data["latest_checkpoint_id"]) == 26


def test_history_renders_tool_calls_and_names_binaries(seeded: str) -> None:
    result = invoke("sessions", "history", "s1", "--store", seeded)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "session s1: messages 0–5 of 6",
        "#0 user",
        "  How does Oslo look?",
        "#1 assistant",
        "  Let me look.",
        '  ⚙ snapshot({"city": "Oslo"})',
        "#2 user",
        "  ↳ a view of Oslo [image png, 2.0 KiB]",
        "#3 assistant",
        "  Oslo looks sunny.",
        "#4 user",
        "  keep these notes",
        '  [document txt "notes.txt", 540 B]',
        "#5 assistant",
        "  Noted.",
    ]


def test_history_pages_keep_tool_pairs_together(seeded: str) -> None:
    # offset 2 is the tool result: the page starts back at its call
    result = invoke("sessions", "history", "s1", "--offset", "2", "--limit", "1", "-s", seeded)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "session s1: messages 1–2 of 6"
    assert [line for line in lines if line.startswith("#")] == ["#1 assistant", "#2 user"]
    assert lines[-1] == "more: --offset 3"
    # a page ending on the call grows to include its result
    data = json.loads(
        invoke("sessions", "history", "s1", "--limit", "2", "--json", "-s", seeded).stdout
    )
    assert (data["offset"], data["next_offset"], data["total"]) == (0, 3, 6)
    # --all reads every page from --offset, each message once
    every = json.loads(
        invoke("sessions", "history", "s1", "--all", "--limit", "1", "--json", "-s", seeded).stdout
    )
    assert (every["offset"], every["next_offset"], len(every["messages"])) == (0, 6, 6)
    past = invoke("sessions", "history", "s1", "--offset", "9", "-s", seeded)
    assert past.stdout == "session s1: no messages at offset 9 of 6\n"
    assert_error(
        invoke("sessions", "history", "s1", "--offset", "-1", "-s", seeded), EXIT_USAGE, "offset"
    )


def test_history_json_is_raw_messages_with_bytes_as_sizes(seeded: str) -> None:
    result = invoke("sessions", "history", "s1", "--json", "--store", seeded)
    data = json.loads(result.stdout)
    assert data["session_id"] == "s1"
    messages = data["messages"]
    assert messages[1]["content"][1]["toolUse"] == {
        "toolUseId": "t1",
        "name": "snapshot",
        "input": {"city": "Oslo"},
    }
    image = messages[2]["content"][0]["toolResult"]["content"][1]["image"]
    assert image == {"format": "png", "source": {"bytes": {"bytes": len(PNG)}}}
    document = messages[4]["content"][1]["document"]
    assert document["source"] == {"bytes": {"bytes": len(NOTES)}}


def test_delete_asks_first_and_is_idempotent(seeded: str) -> None:
    declined = invoke("sessions", "delete", "s1", "--store", seeded, input="n\n")
    assert declined.exit_code == EXIT_PROBLEM
    assert "Delete session 's1' (6 messages) and its checkpoints?" in declined.stderr
    assert "error: not confirmed; nothing deleted" in declined.stderr
    assert invoke("sessions", "show", "s1", "-s", seeded).exit_code == 0

    no_terminal = invoke("sessions", "delete", "s1", "--store", seeded)  # end of input
    assert no_terminal.exit_code == EXIT_PROBLEM

    confirmed = invoke("sessions", "delete", "s1", "--store", seeded, input="y\n")
    assert confirmed.exit_code == 0, confirmed.stderr
    assert confirmed.stdout == "deleted session 's1'\n"
    assert_error(invoke("sessions", "show", "s1", "-s", seeded), EXIT_NOT_FOUND, "s1")

    again = invoke("sessions", "delete", "s1", "--yes", "--store", seeded)
    assert (again.exit_code, again.stdout) == (0, "no session 's1'; nothing to delete\n")
    seed(seeded, "s2")
    data = json.loads(invoke("sessions", "delete", "s2", "-y", "--json", "-s", seeded).stdout)
    assert data == {"session_id": "s2", "deleted": True}
    data = json.loads(invoke("sessions", "delete", "s2", "-y", "--json", "-s", seeded).stdout)
    assert data == {"session_id": "s2", "deleted": False}


@pytest.mark.parametrize(
    "command",
    [["sessions", "list"], ["sessions", "show", "s1"], ["sessions", "history", "s1"]],
)
def test_an_unknown_store_scheme_is_a_usage_error(command: list[str]) -> None:
    result = invoke(*command, "--store", "mongodb:./x")
    assert_error(result, EXIT_USAGE, "unknown store scheme 'mongodb'", "file:, sqlite:, memory:")
    assert_error(invoke(*command, "--store", "nowhere"), EXIT_USAGE, "has no scheme")


def test_missing_session_and_missing_store_exit_3(seeded: str, tmp_path: Path) -> None:
    for command in (["show", "nope"], ["history", "nope"]):
        assert_error(
            invoke("sessions", *command, "--store", seeded),
            EXIT_NOT_FOUND,
            "session 'nope' not found",
            "[session_not_found]",
        )
    for url in (f"file:{tmp_path / 'typo'}", f"sqlite:{tmp_path / 'typo.db'}"):
        assert_error(invoke("sessions", "list", "--store", url), EXIT_NOT_FOUND, "no store at")
    assert not (tmp_path / "typo").exists()
    assert not (tmp_path / "typo.db").exists()  # reading never creates a store


def test_a_postgres_schema_without_a_store_exits_3_and_is_not_made() -> None:
    postgres_server.require_server()
    schema = postgres_server.new_schema_name()
    url = f"{postgres_server.DSN}?schema={schema}"
    for command in (["list"], ["show", "s1"], ["history", "s1"]):
        assert_error(invoke("sessions", *command, "--store", url), EXIT_NOT_FOUND, "no store at")
    made = postgres_server.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    assert made == []  # reading never creates a store


def test_a_bad_session_id_is_a_usage_error(seeded: str) -> None:
    assert_error(invoke("sessions", "show", "a/b", "-s", seeded), EXIT_USAGE, "session_id")


def test_a_flipped_byte_in_a_journal_exits_4(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'store'}"
    seed(url)
    journal = tmp_path / "store" / "sessions" / "s1" / "journal.jsonl"
    data = bytearray(journal.read_bytes())
    data[data.index(b"How does Oslo look?")] ^= 0x01
    journal.write_bytes(bytes(data))
    for command in (["history", "s1"], ["show", "s1"]):
        assert_error(
            invoke("sessions", *command, "--store", url),
            EXIT_CORRUPTED,
            "session 's1' is damaged",
            "bad_hash",
            "[session_store_corrupted]",
        )
    # the metadata listing still works, and a damaged session can be deleted
    assert invoke("sessions", "list", "--store", url).exit_code == 0
    assert invoke("sessions", "delete", "s1", "--yes", "--store", url).exit_code == 0
    assert not journal.exists()


def test_a_changed_sqlite_row_exits_4(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'p.db'}"
    seed(url)
    with sqlite3.connect(tmp_path / "p.db") as db:
        db.execute("UPDATE perdure_messages SET body = replace(body, 'Oslo', 'Rome')")
    db.close()
    assert_error(
        invoke("sessions", "history", "s1", "--store", url),
        EXIT_CORRUPTED,
        "s1",
        "[session_store_corrupted]",
    )


LOCK_HOLDER = """
import asyncio, sys
from perdure.session import open_store

async def main() -> None:
    store = open_store(sys.argv[1])
    async with store.writer_lock(sys.argv[2]):
        print("locked", flush=True)
        await asyncio.sleep(120)

asyncio.run(main())
"""


def test_deleting_a_session_another_process_holds_exits_5(seeded: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, seeded, "s1"], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "locked\n"
            result = invoke("sessions", "delete", "s1", "--yes", "--store", seeded)
            assert_error(result, EXIT_LOCKED, "session 's1' is locked", "[session_locked]")
        finally:
            holder.kill()
            holder.wait()
    assert invoke("sessions", "show", "s1", "-s", seeded).exit_code == 0  # nothing deleted
    assert invoke("sessions", "delete", "s1", "--yes", "-s", seeded).exit_code == 0


def test_python_dash_m_perdure_lists_sessions_as_json(seeded: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "sessions", "list", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PERDURE_STORE": seeded},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [s["session_id"] for s in json.loads(proc.stdout)["sessions"]] == ["s1"]
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "sessions", "history", "missing", "--store", seeded],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == EXIT_NOT_FOUND
    assert proc.stderr.startswith("error: session 'missing' not found")


def test_render_names_binaries_and_survives_odd_blocks() -> None:
    assert [human_size(n) for n in (0, 1023, 1024, 12_595, 5 << 20, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "12.3 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": [
            {"text": "two\nlines"},
            {"reasoningContent": {"reasoningText": {"text": "think  first", "signature": "s"}}},
            {"reasoningContent": {"redactedContent": b"xyz"}},
            {"toolUse": {"toolUseId": "t", "name": "look", "input": {"raw": b"12345"}}},
            {"toolUse": {"toolUseId": "u", "name": "long", "input": "x" * 300}},
            {"image": {"format": "jpeg", "source": {"location": "s3://bucket/key"}}},
            {"json": {"a": 1}},
            {"cachePoint": {"type": "default"}},
            "not a block",
        ],
    }
    assert render_message(message, 7).splitlines() == [
        "#7 assistant",
        "  two",
        "  lines",
        "  [reasoning] think first",
        "  [reasoning, redacted]",
        '  ⚙ look({"raw": "<5 B>"})',
        "  ⚙ long(" + "x" * 199 + "…)",
        "  [image jpeg]",
        '  {"a": 1}',
        "  [cachePoint]",
        "  [unknown block str]",
    ]
    failed = {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "t", "status": "error", "content": [{"text": "boom"}]}}
        ],
    }
    assert render_message(failed) == "user\n  ✗ boom"
    assert format_time("2025-01-02T03:04:05.123456Z") == "2025-01-02T03:04:05Z"
    assert format_time("2025-01-02T05:04:05+02:00") == "2025-01-02T03:04:05Z"  # shown in UTC
    assert format_time("yesterday") == "yesterday"


def with_ttl(url: str, seconds: int) -> str:
    return f"{url}{'&' if '?' in url else '?'}ttl={seconds}"


def test_list_shows_the_time_to_expiry_in_a_store_with_a_ttl(store_url: str) -> None:
    url = with_ttl(store_url, 3600)
    seed(url, "s1")
    result = invoke("sessions", "list", "--store", url)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "id" in line)
    assert header.split() == ["id", "created", "updated", "messages", "expires", "in"]
    row = next(line for line in lines if line.split()[:1] == ["s1"])
    assert row.split()[-3:] == ["6", "59m", "59s"]  # 3600 s, less the moments since

    data = json.loads(invoke("sessions", "list", "--store", url, "--json").stdout)
    listed = data["sessions"][0]
    assert 3500 < listed["expires_in"] <= 3600
    assert listed["expires_at"] > listed["updated_at"]


class CutOff(KeyboardInterrupt):
    """Stands in for the process dying inside a node (it goes up, unrecorded)."""


def graph_on_a_session(url: str, *, cut_at: str | None) -> str:
    """plan -> review (an agent) on a Session ``g1``; ``cut_at`` a node is cut off."""

    async def plan(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        state["planned"] = True
        return "the plan"

    async def review(task: str, upstream: dict[str, str]) -> str:
        if cut_at == "review":
            raise CutOff
        return "approved"

    b = GraphBuilder()
    b.add_node(plan, "plan")
    b.add_node(review, "review")
    b.add_edge("plan", "review")
    b.set_entry_point("plan")
    store = open_store(url)
    try:
        return b.build(session_manager=Session(store, "g1"))("ship it").status
    except CutOff:
        return "cut off"
    finally:
        close(store)


def test_run_shows_where_a_graph_kept_in_a_session_stands(store_url: str) -> None:
    assert graph_on_a_session(store_url, cut_at="review") == "cut off"
    shown = invoke("sessions", "run", "g1", "--store", store_url, "--json")
    assert shown.exit_code == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert (info["kind"], info["status"], info["task"]) == ("graph", "running", "ship it")
    assert info["completed"] == ["plan"]
    assert info["pending"] == ["review"]
    assert info["results"] == {"plan": "the plan"}
    assert info["shared"] == {"planned": True}
    table = invoke("sessions", "run", "g1", "--store", store_url)
    assert table.exit_code == 0
    assert "next\treview" in table.stdout
    assert graph_on_a_session(store_url, cut_at=None) == "completed"
    info = json.loads(invoke("sessions", "run", "g1", "--store", store_url, "--json").stdout)
    assert info["status"] == "completed"
    assert info["completed"] == ["plan", "review"]


def test_run_of_an_agents_session_or_none_says_so(seeded: str) -> None:
    assert_error(
        invoke("sessions", "run", "s1", "--store", seeded),
        EXIT_NOT_FOUND,
        "session 's1' holds no graph or swarm run",
    )
    assert_error(invoke("sessions", "run", "nope", "--store", seeded), EXIT_NOT_FOUND, "nope")
