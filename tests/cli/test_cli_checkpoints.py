"""``perdure checkpoints …`` and ``perdure fork`` through the real entry points.

The commands run on file and SQLite stores that real agents and sessions filled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import postgres_server
from perdure import Agent
from perdure.cli._common import EXIT_CORRUPTED, EXIT_LOCKED, EXIT_NOT_FOUND, EXIT_USAGE
from perdure.cli.main import cli
from perdure.models import ScriptedModel
from perdure.session import EXPORT_FORMAT, Session, open_store

ABSENT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # a well-formed ULID no checkpoint has
PNG = b"\x89PNG\r\n\x1a\n" + bytes(100)


def invoke(*args: str, input: str | bytes | None = None) -> Result:
    """Run ``perdure ARGS``; an unexpected exception fails the test with its traceback."""
    result = CliRunner().invoke(cli, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def ok(*args: str, input: str | bytes | None = None) -> Result:
    result = invoke(*args, input=input)
    assert result.exit_code == 0, result.stderr
    return result


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


def assert_error(result: Result, code: int, *fragments: str) -> None:
    """The command failed with ``code`` and one ``error: …`` line naming ``fragments``."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def talk(url: str, session_id: str, *prompts: str) -> None:
    """One turn per prompt on the stored session (the model answers ``re: PROMPT``)."""
    store = open_store(url)
    model = ScriptedModel([f"re: {p}" for p in prompts])
    agent = Agent(model=model, session_manager=Session(store, session_id))
    for prompt in prompts:
        agent(prompt)
    getattr(store, "close", lambda: None)()


def history(url: str, session_id: str) -> list[Any]:
    data = as_json("sessions", "history", session_id, "--all", "--store", url)
    return [m["content"][0].get("text") for m in data["messages"]]


@pytest.fixture(params=["file", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url = postgres_server.store_url(request)
    elif request.param == "file":
        url = f"file:{tmp_path / 'store'}"
    else:
        url = f"sqlite:{tmp_path / 'p.db'}"
    talk(url, "s1", "one", "two")
    return url


def test_create_and_list(url: str) -> None:
    empty = ok("checkpoints", "list", "s1", "-s", url)
    assert empty.stdout == "id\ttrigger\tlabel\tmessages\tcreated\n"  # piped: the header alone
    assert empty.stderr == "session 's1' has no checkpoints\n"
    created = ok("checkpoints", "create", "s1", "--label", "[b]first", "-s", url).stdout
    assert created.startswith("created checkpoint ")
    assert created.endswith(" of session 's1' (4 messages)\n")
    second = ok("checkpoints", "create", "s1", "--quiet", "-s", url).stdout.strip()
    assert len(second) == 26
    meta = as_json("checkpoints", "create", "s1", "-s", url)
    assert (meta["session_id"], meta["trigger"], meta["label"]) == ("s1", "manual", None)

    table = ok("checkpoints", "list", "s1", "-s", url).stdout
    assert table.split("\n", 1)[0].split("\t") == ["id", "trigger", "label", "messages", "created"]
    assert "[b]first" in table  # labels are shown as written, never as markup
    assert second in table
    listed = as_json("checkpoints", "list", "s1", "-s", url)
    assert listed["session_id"] == "s1"
    ids = [c["checkpoint_id"] for c in listed["checkpoints"]]
    assert ids == sorted(ids)
    assert ids[1:] == [second, meta["checkpoint_id"]]
    assert [c["message_count"] for c in listed["checkpoints"]] == [4, 4, 4]


def test_restore_rewinds_the_history_after_a_pre_restore_checkpoint(url: str) -> None:
    checkpoint = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    talk(url, "s1", "three")
    assert history(url, "s1") == ["one", "re: one", "two", "re: two", "three", "re: three"]

    result = ok("checkpoints", "restore", "s1", checkpoint, "-s", url)
    assert f"restored session 's1' to checkpoint {checkpoint}: 6 → 4 messages" in result.stdout
    assert history(url, "s1") == ["one", "re: one", "two", "re: two"]
    pre = as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"][-1]
    assert (pre["trigger"], pre["message_count"]) == ("pre_restore", 6)
    assert pre["checkpoint_id"] in result.stdout

    # the state before can be restored in turn, this time without a checkpoint
    data = as_json(
        "checkpoints", "restore", "s1", pre["checkpoint_id"], "--no-checkpoint", "-s", url
    )
    assert data["status"] == "restored"
    assert (data["from_messages"], data["to_messages"]) == (4, 6)
    assert data["pre_restore_checkpoint_id"] is None
    assert len(as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]) == 2
    # the agent of the session goes on from the restored history
    talk(url, "s1", "four")
    assert history(url, "s1")[-2:] == ["four", "re: four"]


def test_bad_and_unknown_checkpoint_ids(url: str) -> None:
    for command in ("restore", "delete", "export"):
        assert_error(
            invoke("checkpoints", command, "s1", "not-a-ulid", "-s", url),
            EXIT_USAGE,
            "checkpoint_id 'not-a-ulid' is not a well-formed ULID",
        )
    assert_error(invoke("fork", "s1", "nope", "-s", url), EXIT_USAGE, "not a well-formed ULID")
    for command in (["checkpoints", "restore"], ["checkpoints", "export"], ["fork"]):
        assert_error(
            invoke(*command, "s1", ABSENT, "-s", url),
            EXIT_NOT_FOUND,
            ABSENT,
            "[checkpoint_not_found]",
        )
    # deleting is idempotent: a checkpoint that is not there is fine
    gone = ok("checkpoints", "delete", "s1", ABSENT, "-s", url)
    assert gone.stdout == f"no checkpoint {ABSENT} in session 's1'; nothing to do\n"


def test_a_missing_session_exits_3(url: str) -> None:
    for command in (
        ["checkpoints", "list", "nope"],
        ["checkpoints", "create", "nope"],
        ["checkpoints", "restore", "nope", ABSENT],
        ["checkpoints", "delete", "nope", ABSENT],
        ["fork", "nope", ABSENT],
    ):
        assert_error(invoke(*command, "-s", url), EXIT_NOT_FOUND, "session 'nope' not found")
    assert_error(invoke("checkpoints", "list", "s1", "-s", "ftp:x"), EXIT_USAGE, "store scheme")


def test_delete(url: str) -> None:
    checkpoint = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    data = as_json("checkpoints", "delete", "s1", checkpoint, "-s", url)
    assert data == {"session_id": "s1", "checkpoint_id": checkpoint, "deleted": True}
    assert as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"] == []
    assert as_json("checkpoints", "delete", "s1", checkpoint, "-s", url)["deleted"] is False


def test_export_to_a_file_or_stdout_and_import_elsewhere(url: str, tmp_path: Path) -> None:
    checkpoint = ok("checkpoints", "create", "s1", "-q", "--label", "two turns", "-s", url)
    checkpoint_id = checkpoint.stdout.strip()
    to_stdout = ok("checkpoints", "export", "s1", checkpoint_id, "-s", url).stdout_bytes
    out = tmp_path / "s1.checkpoint.json"
    to_file = ok("checkpoints", "export", "s1", checkpoint_id, "-o", str(out), "-s", url)
    assert to_file.stdout == ""
    assert f"exported checkpoint {checkpoint_id}" in to_file.stderr
    assert out.read_bytes() == to_stdout
    assert json.loads(to_stdout)["format"] == EXPORT_FORMAT

    # into another store, as a new session, then restored there
    other = f"sqlite:{tmp_path / 'other.db'}"
    assert_error(
        invoke("checkpoints", "import", "s9", str(out), "-s", other), EXIT_NOT_FOUND, "no store"
    )
    meta = as_json("checkpoints", "import", "s9", str(out), "--create", "-s", other)
    assert (meta["session_id"], meta["trigger"], meta["label"]) == ("s9", "import", "two turns")
    ok("checkpoints", "restore", "s9", meta["checkpoint_id"], "-s", other)
    assert history(other, "s9") == ["one", "re: one", "two", "re: two"]
    # A person is told the new session is empty and how to restore it, and the
    # command it prints works.
    said = ok("checkpoints", "import", "s8", str(out), "--create", "-s", other).stdout
    imported, hint = said.splitlines()
    assert imported.endswith(" into session 's8' (4 messages)")
    new_id = imported.split()[2]
    restore = f"perdure checkpoints restore s8 {new_id} --store {other}"
    assert hint == (
        "session 's8' was created empty (0 messages); to continue from the checkpoint, "
        f"restore it: {restore}"
    )
    assert history(other, "s8") == []
    ok(*restore.split()[1:])
    assert history(other, "s8") == ["one", "re: one", "two", "re: two"]
    # from standard input, into an existing session
    piped = ok("checkpoints", "import", "s1", "-", "-s", url, input=to_stdout).stdout
    assert piped.startswith("imported checkpoint ")
    assert piped.endswith(" into session 's1' (4 messages)\n")


def test_a_tampered_import_exits_4_and_writes_nothing(url: str, tmp_path: Path) -> None:
    checkpoint_id = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    export = ok("checkpoints", "export", "s1", checkpoint_id, "-s", url).stdout_bytes
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(export.replace(b"re: two", b"re: TWO"))
    before = as_json("checkpoints", "list", "s1", "-s", url)
    assert_error(
        invoke("checkpoints", "import", "s1", str(tampered), "-s", url),
        EXIT_CORRUPTED,
        "[checkpoint_import_invalid]",
    )
    assert as_json("checkpoints", "list", "s1", "-s", url) == before
    assert_error(
        invoke("checkpoints", "import", "s2", str(tampered), "--create", "-s", url),
        EXIT_CORRUPTED,
    )
    assert_error(invoke("sessions", "show", "s2", "-s", url), EXIT_NOT_FOUND)  # not created
    assert_error(
        invoke("checkpoints", "import", "s1", str(tmp_path / "absent.json"), "-s", url),
        EXIT_USAGE,
        "cannot read",
    )


def test_signed_export_and_verified_import(url: str, tmp_path: Path) -> None:
    key, wrong = tmp_path / "key", tmp_path / "wrong"
    key.write_bytes(b"a shared secret\n")
    wrong.write_bytes(b"another secret")
    checkpoint_id = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    signed = ok(
        "checkpoints", "export", "s1", checkpoint_id, "--signing-key-file", str(key), "-s", url
    ).stdout_bytes
    assert json.loads(signed)["hmac_sha256"]
    unsigned = ok("checkpoints", "export", "s1", checkpoint_id, "-s", url).stdout_bytes
    before = as_json("checkpoints", "list", "s1", "-s", url)
    for data, key_file, fragment in [
        (unsigned, key, "not signed"),
        (signed, wrong, "signature does not match"),
    ]:
        assert_error(
            invoke("checkpoints", "import", "s1", "-", "--verify-key-file", str(key_file),
                   "-s", url, input=data),
            EXIT_CORRUPTED,
            fragment,
        )  # fmt: skip
    assert as_json("checkpoints", "list", "s1", "-s", url) == before
    imported = ok(
        "checkpoints", "import", "s1", "-", "--verify-key-file", str(key), "-s", url, input=signed
    )
    assert imported.stdout.startswith("imported checkpoint ")
    assert_error(
        invoke("checkpoints", "export", "s1", checkpoint_id, "--signing-key-file",
               str(tmp_path / "absent"), "-s", url),
        EXIT_USAGE,
        "--signing-key-file",
    )  # fmt: skip


def test_fork_prints_the_new_session_and_leaves_the_source(url: str) -> None:
    checkpoint_id = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    talk(url, "s1", "three")
    new_id = ok("fork", "s1", checkpoint_id, "-s", url).stdout.strip()
    assert new_id != "s1"
    assert history(url, new_id) == ["one", "re: one", "two", "re: two"]
    assert len(history(url, "s1")) == 6
    data = as_json("fork", "s1", checkpoint_id, "-s", url)
    assert (data["source_session_id"], data["checkpoint_id"]) == ("s1", checkpoint_id)
    assert data["session_id"] not in ("s1", new_id)
    # a fork is a session like any other
    talk(url, new_id, "again")
    assert history(url, new_id)[-1] == "re: again"


def test_a_damaged_session_still_reaches_its_checkpoints(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'store'}"
    talk(url, "s1", "one", "two")
    checkpoint_id = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    journal = tmp_path / "store" / "sessions" / "s1" / "journal.jsonl"
    journal.write_bytes(journal.read_bytes().replace(b"re: one", b"re: One"))
    assert_error(invoke("sessions", "history", "s1", "-s", url), EXIT_CORRUPTED)

    listed = as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]
    assert [c["checkpoint_id"] for c in listed] == [checkpoint_id]
    assert ok("checkpoints", "export", "s1", checkpoint_id, "-s", url).stdout_bytes
    rescued = ok("fork", "s1", checkpoint_id, "-s", url).stdout.strip()
    assert history(url, rescued) == ["one", "re: one", "two", "re: two"]
    # restoring reads the current history first, so it reports the damage
    for extra in ((), ("--no-checkpoint",)):
        assert_error(
            invoke("checkpoints", "restore", "s1", checkpoint_id, *extra, "-s", url),
            EXIT_CORRUPTED,
            "is damaged",
        )


def test_a_damaged_checkpoint_is_listed_refused_and_deletable(tmp_path: Path) -> None:
    """ISSUE 14 items 5 and 12: an edited checkpoint file is marked, never used, deletable."""
    url = f"file:{tmp_path / 'store'}"
    talk(url, "s1", "pay 100 EUR")
    good = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    bad = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    path = tmp_path / "store" / "sessions" / "s1" / "checkpoints" / f"{bad}.json"
    path.write_bytes(path.read_bytes().replace(b"pay 100 EUR", b"pay 900 EUR"))

    listed = ok("checkpoints", "list", "s1", "-s", url)
    rows = {
        line.split()[0]: line.split()[1:] for line in listed.stdout.splitlines()[1:] if line.strip()
    }
    assert rows[good][0] == "manual"
    assert rows[bad] == ["DAMAGED", "bad", "checkpoint"]
    assert str(path) in listed.stderr
    assert "perdure checkpoints delete s1" in listed.stderr
    data = as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]
    assert [(c["checkpoint_id"], c["damaged"]) for c in data] == [
        (good, False),
        (bad, True),
    ]
    assert data[1]["error"]["code"] == "session_store_corrupted"
    assert "checkpoints\t2 (latest " in ok("sessions", "show", "s1", "-s", url).stdout
    assert ", 1 damaged" in ok("sessions", "show", "s1", "-s", url).stdout

    # never restored, exported or forked: exit 4 naming the file, nothing written
    for command in (("checkpoints", "restore"), ("checkpoints", "export"), ("fork",)):
        assert_error(invoke(*command, "s1", bad, "-s", url), EXIT_CORRUPTED, str(path))
    assert history(url, "s1") == ["pay 100 EUR", "re: pay 100 EUR"]
    assert len(as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]) == 2
    assert [s["session_id"] for s in as_json("sessions", "list", "-s", url)["sessions"]] == ["s1"]

    data = as_json("checkpoints", "delete", "s1", bad, "-s", url)
    assert data == {"session_id": "s1", "checkpoint_id": bad, "deleted": True}
    assert not path.exists()
    assert [
        c["checkpoint_id"] for c in as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]
    ] == [good]
    ok("checkpoints", "restore", "s1", good, "-s", url)


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


def test_a_session_locked_by_another_process_exits_5(url: str) -> None:
    checkpoint_id = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    with subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, url, "s1"], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "locked\n"
            for command in (["create", "s1"], ["restore", "s1", checkpoint_id]):
                assert_error(
                    invoke("checkpoints", *command, "-s", url), EXIT_LOCKED, "[session_locked]"
                )
            # reading is never blocked
            assert len(as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]) == 1
        finally:
            holder.kill()
            holder.wait()


def test_python_dash_m_perdure_forks(url: str) -> None:
    checkpoint_id = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "fork", "s1", checkpoint_id],
        capture_output=True,
        text=True,
        env={**os.environ, "PERDURE_STORE": url},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert history(url, proc.stdout.strip()) == ["one", "re: one", "two", "re: two"]


def test_an_unreadable_checkpoint_file_is_listed_damaged_never_a_traceback(
    tmp_path: Path,
) -> None:
    url = f"file:{tmp_path / 'store'}"
    talk(url, "s1", "one")
    good = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    bad = ok("checkpoints", "create", "s1", "-q", "-s", url).stdout.strip()
    path = tmp_path / "store" / "sessions" / "s1" / "checkpoints" / f"{bad}.json"
    path.unlink()
    path.mkdir()  # cannot be read at all (as EIO or EACCES would)
    listed = as_json("checkpoints", "list", "s1", "-s", url)["checkpoints"]
    assert [(c["checkpoint_id"], c.get("damaged", False)) for c in listed] == [
        (good, False),
        (bad, True),
    ]
    shown = as_json("sessions", "show", "s1", "-s", url)
    assert (shown["checkpoints"], shown["damaged_checkpoints"]) == (2, 1)
