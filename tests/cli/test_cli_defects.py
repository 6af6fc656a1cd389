"""Defects a tester found in the ``perdure`` command line, each through the real entry points.

Real stores on disk, a second process holding a session's writer lock, a port another
socket holds, a pseudo-terminal for what reaches a terminal: no mocks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import json
import os
import pty
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from perdure import Agent
from perdure.cli._common import (
    EXIT_CORRUPTED,
    EXIT_ERROR,
    EXIT_LOCKED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    exit_code_for,
)
from perdure.cli.main import cli
from perdure.errors import MemoryStoreError, MemoryStoreLockedError, StorageError
from perdure.memory import LocalMemoryStore
from perdure.models import ScriptedModel
from perdure.session import Session, open_store


def invoke(*args: str, input: str | None = None) -> Result:
    """Run ``perdure ARGS``; an unexpected exception fails the test with its traceback."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def assert_error(result: Result, code: int, *fragments: str) -> None:
    """The command failed with ``code`` and one ``error: …`` line naming ``fragments``."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def talk(url: str, session_id: str, *prompts: str, checkpoint_after: int | None = None) -> str:
    """One turn per prompt; a checkpoint after turn ``checkpoint_after``: its id (or "")."""
    store = open_store(url)
    session = Session(store, session_id)
    agent = Agent(model=ScriptedModel([f"re: {p}" for p in prompts]), session_manager=session)
    checkpoint_id = ""
    for turn, prompt in enumerate(prompts):
        agent(prompt)
        if turn == checkpoint_after:
            checkpoint_id = asyncio.run(session.checkpoint("first")).checkpoint_id
    getattr(store, "close", lambda: None)()
    return checkpoint_id


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


@pytest.fixture
def held() -> Iterator[Any]:
    """``held(url, session_id)``: another process holds the session's writer lock."""
    holders: list[subprocess.Popen[str]] = []

    def hold(url: str, session_id: str) -> None:
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, url, session_id], stdout=subprocess.PIPE, text=True
        )
        holders.append(holder)
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"

    yield hold
    for holder in holders:
        holder.kill()
        holder.communicate()  # waits, and closes its pipe


@pytest.fixture(params=["file", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"file:{tmp_path / 'store'}" if request.param == "file" else f"sqlite:{tmp_path}/s.db"


# -------------------------------------------------- 1. checkpoints of a damaged session


def _cut_journal(session_dir: Path) -> None:
    journal = session_dir / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:5]))  # acknowledged records are missing


@pytest.mark.parametrize(
    "damage",
    [
        _cut_journal,
        lambda d: (d / "head").unlink(),
        lambda d: (d / "meta.json").unlink(),
    ],
    ids=["journal_truncated", "head_lost", "meta_lost"],
)
def test_checkpoints_of_a_damaged_session_are_listed_exported_and_forked(
    tmp_path: Path, damage: Any
) -> None:
    url = f"file:{tmp_path / 'store'}"
    checkpoint_id = talk(url, "a", "one", "two", "three", checkpoint_after=0)
    damage(tmp_path / "store" / "sessions" / "a")
    assert_error(invoke("sessions", "history", "a", "-s", url), EXIT_CORRUPTED)  # damaged

    listed = json.loads(ok("checkpoints", "list", "a", "-s", url, "--json").stdout)
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == [checkpoint_id]
    out = tmp_path / "cp.json"
    ok("checkpoints", "export", "a", checkpoint_id, "-o", str(out), "-s", url)
    assert json.loads(out.read_bytes())["checkpoint"]["checkpoint_id"] == checkpoint_id
    forked = ok("fork", "a", checkpoint_id, "-s", url).stdout.strip()
    history = json.loads(ok("sessions", "history", forked, "--all", "-s", url, "--json").stdout)
    assert [m["content"][0]["text"] for m in history["messages"]] == ["one", "re: one"]
    # what needs the history itself still refuses it
    assert_error(invoke("checkpoints", "create", "a", "-s", url), EXIT_CORRUPTED)
    # and an unknown session is still not found
    assert_error(invoke("checkpoints", "list", "nobody", "-s", url), EXIT_NOT_FOUND)
    assert_error(invoke("fork", "nobody", checkpoint_id, "-s", url), EXIT_NOT_FOUND)


# -------------------------------------------------- 2. perdure serve --port


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_serve_refuses_a_port_out_of_range_with_one_line(tmp_path: Path, port: str) -> None:
    url = f"file:{tmp_path / 'store'}"
    talk(url, "a", "one")
    result = invoke("serve", "-s", url, "--port", port)
    assert_error(result, EXIT_USAGE, "--port", port)
    assert "perdure serve: http" not in result.stderr


def test_serve_on_a_port_in_use_is_one_error_line_and_no_banner(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'store'}"
    talk(url, "a", "one")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "perdure", "serve", "-s", url, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == EXIT_ERROR, result.stderr
    assert result.stderr == (
        f"error: cannot listen on 127.0.0.1:{port}: {os.strerror(errno.EADDRINUSE)}\n"
    )
    assert result.stdout == ""


# -------------------------------------------------- 3. escape sequences on a terminal

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;PWNED\x07"


def _on_a_terminal(*args: str) -> str:
    """What ``perdure ARGS`` writes to a terminal (a pseudo-terminal), as text."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure", *args],
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"},
    )
    os.close(child)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=60) == 0, b"".join(chunks)
    return b"".join(chunks).decode()


@pytest.fixture
def escapes(tmp_path: Path) -> str:
    url = f"file:{tmp_path / 'store'}"
    store = open_store(url)
    model = ScriptedModel([f"reply {TITLE} \x1b[31mRED\x9b2J\x7f"])
    agent = Agent(model=model, session_manager=Session(store, "esc"))
    agent.state.set("k\x1b[31m", "v")
    agent(f"user says {CLEAR}\x1b[H\r cleared?")
    Agent(model=ScriptedModel(["ok"]), session_manager=Session(store, f"id{CLEAR}x"))("hi")
    return url


def _raw(text: str) -> list[str]:
    """The stored control sequences found raw in ``text`` (rich's own styles aside)."""
    return [
        s for s in (CLEAR, "\x1b]0;", "\x1b[31m", "\x1b[H", "\x9b", "\x7f", "\r c") if s in text
    ]


def test_stored_escape_sequences_reach_a_terminal_shown_not_obeyed(escapes: str) -> None:
    history = _on_a_terminal("sessions", "history", "esc", "-s", escapes)
    assert _raw(history) == [], history
    assert "user says \\x1b[2J\\x1b[H\r\n" in history  # a carriage return breaks the line
    assert "reply \\x1b]0;PWNED\\x07 \\x1b[31mRED\\x9b2J\\x7f" in history
    listing = _on_a_terminal("sessions", "list", "-s", escapes)
    assert _raw(listing) == [], listing
    assert "id\\x1b[2Jx" in listing
    shown = _on_a_terminal("sessions", "show", "esc", "-s", escapes)
    assert _raw(shown) == [], shown
    assert "k\\x1b[31m" in shown


def test_json_output_keeps_stored_text_exact(escapes: str) -> None:
    history = json.loads(ok("sessions", "history", "esc", "-s", escapes, "--json").stdout)
    assert history["messages"][0]["content"][0]["text"] == f"user says {CLEAR}\x1b[H\r cleared?"
    listed = json.loads(ok("sessions", "list", "-s", escapes, "--json").stdout)
    assert f"id{CLEAR}x" in [s["session_id"] for s in listed["sessions"]]


def test_terminal_safe_shows_every_control_but_the_kept_ones() -> None:
    from perdure.cli.output import terminal_safe

    assert terminal_safe("a\x1b[2Jb\x07\x9b\x7f\x00\r") == "a\\x1b[2Jb\\x07\\x9b\\x7f\\x00\\x0d"
    assert terminal_safe("line\n\tcell") == "line\n\tcell"
    assert terminal_safe("line\n\tcell", "") == "line\\x0a\\x09cell"
    assert terminal_safe("plain é ✓ 日本") == "plain é ✓ 日本"


# -------------------------------------------------- 4. perdure chat on a locked session


def test_chat_on_a_session_another_process_holds_exits_5_with_one_error_line(
    url: str, held: Any
) -> None:
    talk(url, "a", "one")
    held(url, "a")
    result = invoke("chat", "--model", "scripted", "--session", "a", "-s", url, input="hi\n")
    assert result.exit_code == EXIT_LOCKED, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.rstrip().endswith("[session_locked]")


# -------------------------------------------------- 5. checkpoints delete/import, locked


def test_checkpoints_delete_and_import_refuse_a_session_another_process_holds(
    url: str, held: Any, tmp_path: Path
) -> None:
    checkpoint_id = talk(url, "a", "one", checkpoint_after=0)
    export = tmp_path / "cp.json"
    ok("checkpoints", "export", "a", checkpoint_id, "-o", str(export), "-s", url)
    held(url, "a")
    assert_error(
        invoke("checkpoints", "delete", "a", checkpoint_id, "-s", url),
        EXIT_LOCKED,
        "[session_locked]",
    )
    assert_error(
        invoke("checkpoints", "import", "a", str(export), "-s", url),
        EXIT_LOCKED,
        "[session_locked]",
    )
    listed = json.loads(ok("checkpoints", "list", "a", "-s", url, "--json").stdout)
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == [checkpoint_id]


# -------------------------------------------------- 6. a damaged memory database


def _memory_file(path: Path) -> None:
    async def fill() -> None:
        store = LocalMemoryStore(path, namespace="u1")
        for n in range(200):
            await store.add(f"fact {n}: " + "words " * 40, metadata={"n": n})
        store.close()

    asyncio.run(fill())


def test_a_damaged_memory_database_exits_4(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.sqlite"
    _memory_file(corrupt)
    data = bytearray(corrupt.read_bytes())
    for page in range(1, len(data) // 4096):  # every page's header, the first page's aside
        data[page * 4096] = 7
    corrupt.write_bytes(bytes(data))
    assert_error(
        invoke("memory", "list", "--store", f"sqlite:{corrupt}", "--user", "u1"),
        EXIT_CORRUPTED,
        "[memory_store_error]",
    )
    not_a_db = tmp_path / "text.sqlite"
    not_a_db.write_bytes(b"not a database at all, just some text to fill the header " * 20)
    assert_error(
        invoke("memory", "list", "--store", f"sqlite:{not_a_db}", "--user", "u1"),
        EXIT_CORRUPTED,
        "SQLITE_NOTADB",
    )


def test_only_damage_of_a_backend_maps_to_4() -> None:
    assert exit_code_for(MemoryStoreError("damaged", details={"fault": "damage"})) == 4
    assert exit_code_for(StorageError("damaged", details={"fault": "damage"})) == 4
    assert exit_code_for(MemoryStoreError("disk full", details={"fault": "failure"})) == 6
    assert exit_code_for(MemoryStoreError("closed")) == 6
    assert exit_code_for(MemoryStoreLockedError("busy", details={"fault": "busy"})) == 5


# -------------------------------------------------- 7. gc --ttl counts the checkpoints


def _checkpoint_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "store" / "sessions").glob("*/checkpoints/*.json"))


def test_gc_ttl_counts_the_checkpoints_deleted_with_the_sessions(url: str, tmp_path: Path) -> None:
    for session_id in ("a", "b"):
        talk(url, session_id, "one", checkpoint_after=0)
    talk(url, "c", "one")  # no checkpoint
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).isoformat()
    dry = invoke("gc", "-s", url, "--ttl", "1d", "--now", later)
    assert dry.exit_code == 0, dry.stderr
    assert "would delete 3 of 3 sessions and 2 checkpoints" in dry.stderr
    report = json.loads(ok("gc", "-s", url, "--ttl", "1d", "--now", later, "--json").stdout)
    assert {e["session_id"]: e["checkpoints"] for e in report["expired"]} == {
        "a": 1,
        "b": 1,
        "c": 0,
    }
    assert report["checkpoints_deleted"] == 2
    done = invoke("gc", "-s", url, "--ttl", "1d", "--now", later, "--apply")
    assert done.exit_code == 0, done.stderr
    assert "deleted 3 of 3 sessions and 2 checkpoints" in done.stderr
    if url.startswith("file:"):
        assert _checkpoint_files(tmp_path) == []
    store = open_store(url)
    try:
        assert asyncio.run(store.list()) == []
        checkpoints = store.checkpoints  # type: ignore[attr-defined]
        assert [asyncio.run(checkpoints.list(s)) for s in ("a", "b")] == [[], []]
    finally:
        getattr(store, "close", lambda: None)()
