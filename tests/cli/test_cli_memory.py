"""``perdure memory list|search|show|delete|export`` over real memory stores.

Memories are written by the library (LocalMemoryStore on a SQLite file, and
PostgresMemoryStore on a fresh schema), then read, exported and erased through the
click group. Two users share each store: every command must see one user only.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import postgres_server
from perdure.cli._common import EXIT_NOT_FOUND, EXIT_USAGE
from perdure.cli.main import cli
from perdure.memory.urls import open_memory_store

FACTS = ["likes trains", "lives in Lyon", "is vegetarian"]


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def open_memory(url: str, user: str) -> object:
    return open_memory_store(url, namespace=user)


async def _fill(store: object, user: str) -> None:
    for fact in FACTS:
        await store.add(f"{user} {fact}", metadata={"source": "test"})  # type: ignore[attr-defined]


def fill(url: str) -> None:
    for user in ("alice", "bob"):
        store = open_memory(url, user)
        asyncio.run(_fill(store, user))
        store.close()  # type: ignore[attr-defined]


def count(url: str, user: str) -> int:
    store = open_memory(url, user)
    try:
        return int(asyncio.run(store.count()))  # type: ignore[attr-defined]
    finally:
        store.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url = postgres_server.store_url(request)
    else:
        url = f"sqlite:{tmp_path / 'memory.sqlite'}"
    fill(url)
    return url


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def test_list_shows_one_users_memories(url: str) -> None:
    lines = ok("memory", "list", "--store", url, "--user", "alice").stdout.splitlines()
    assert lines[0].split("\t") == ["id", "created", "content"]
    rows = [line.split("\t") for line in lines[1:]]
    assert [row[2] for row in rows] == [f"alice {fact}" for fact in FACTS]
    assert all(row[1].endswith("Z") for row in rows)
    data = json.loads(ok("memory", "list", "-s", url, "-u", "bob", "--json").stdout)
    assert data["total"] == 3
    assert [m["content"] for m in data["memories"]] == [f"bob {fact}" for fact in FACTS]
    assert data["memories"][0]["metadata"] == {"source": "test"}
    # --store before the command, like every other command.
    assert ok("--store", url, "memory", "list", "-u", "alice").stdout == "\n".join(lines) + "\n"


def test_search_show_and_export(url: str, tmp_path: Path) -> None:
    found = json.loads(ok("memory", "search", "trains", "-s", url, "-u", "alice", "--json").stdout)
    assert [m["content"] for m in found["memories"]] == ["alice likes trains"]
    memory_id = found["memories"][0]["memory_id"]
    shown = ok("memory", "show", str(memory_id), "-s", url, "-u", "alice").stdout
    assert "content\talice likes trains" in shown.splitlines()
    # Another user's memory id is not found for this user.
    bob = json.loads(ok("memory", "list", "-s", url, "-u", "bob", "--json").stdout)
    other = invoke("memory", "show", str(bob["memories"][0]["memory_id"]), "-s", url, "-u", "alice")
    assert other.exit_code == EXIT_NOT_FOUND
    assert other.stderr.startswith("error: user 'alice' has no memory")

    exported = ok("memory", "export", "-s", url, "-u", "alice").stdout.splitlines()
    assert [json.loads(line)["content"] for line in exported] == [f"alice {f}" for f in FACTS]
    out = tmp_path / "alice.jsonl"
    to_file = ok("memory", "export", "-s", url, "-u", "alice", "-o", str(out))
    assert to_file.stderr == f"exported 3 memories of user 'alice' to {out}\n"
    assert out.read_text().splitlines() == exported


def test_delete_all_forgets_one_user_and_proves_it(url: str) -> None:
    refused = invoke("memory", "delete", "--all", "-s", url, "-u", "alice", input="n\n")
    assert refused.exit_code != 0
    assert count(url, "alice") == 3
    done = ok("memory", "delete", "--all", "--yes", "-s", url, "-u", "alice")
    assert done.stdout == "deleted 3 memories of user 'alice'; 0 memories left\n"
    assert count(url, "alice") == 0
    assert count(url, "bob") == 3  # the other user keeps everything
    listed = ok("memory", "list", "-s", url, "-u", "alice")
    assert listed.stdout == "id\tcreated\tcontent\n"  # piped: the header alone
    assert listed.stderr == "no memories for user 'alice'\n"
    bob = json.loads(ok("memory", "list", "-s", url, "-u", "bob", "--json").stdout)
    first = str(bob["memories"][0]["memory_id"])
    one = json.loads(ok("memory", "delete", first, "-y", "-s", url, "-u", "bob", "--json").stdout)
    assert one == {"user": "bob", "deleted": 1, "remaining": 2}


def test_bad_input_is_one_error_line(tmp_path: Path) -> None:
    missing = invoke("memory", "list", "-s", f"sqlite:{tmp_path / 'none.sqlite'}", "-u", "a")
    assert missing.exit_code == EXIT_NOT_FOUND
    assert not (tmp_path / "none.sqlite").exists()  # a read never creates a store
    for args in (
        ["memory", "list", "-u", "a"],  # no --store
        ["memory", "list", "-s", "file:x", "-u", "a"],
        ["memory", "list", "-s", f"sqlite:{tmp_path / 'none.sqlite'}"],  # no --user
        ["memory", "delete", "-y", "-s", f"sqlite:{tmp_path / 'x'}", "-u", "a"],  # nothing named
    ):
        result = invoke(*args)
        assert result.exit_code in (EXIT_USAGE, EXIT_NOT_FOUND), (args, result.stderr)
        assert result.stderr.startswith("error: ")
        assert result.stderr.count("\n") == 1


READS = [
    ["list"],
    ["search", "trains"],
    ["show", "1"],
    ["export"],
    ["delete", "--all", "--yes"],
    ["delete", "1", "--yes", "--json"],
]


def no_store_here(url: str, where: str) -> None:
    """Every memory command on ``url``: one ``error:`` line, exit 3, nothing created."""
    for command in READS:
        result = invoke("memory", *command, "--store", url, "--user", "alice")
        assert result.exit_code == EXIT_NOT_FOUND, (command, result.stdout, result.stderr)
        assert result.stdout == ""
        assert result.stderr.startswith(f"error: no memory store at {where} ("), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr


def test_an_empty_postgres_schema_is_no_memory_store_and_stays_empty(
    request: pytest.FixtureRequest,
) -> None:
    url = postgres_server.store_url(request)
    schema = url.rsplit("schema=", 1)[1]
    postgres_server.execute(f'CREATE SCHEMA "{schema}"')
    no_store_here(url, url)
    tables = postgres_server.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    )
    assert tables == []  # no table was made by a read
    # A schema that is not there at all: the same, and it is not made either.
    absent = url.replace(schema, postgres_server.new_schema_name())
    no_store_here(absent, absent)
    made = postgres_server.execute(
        "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
        (absent.rsplit("schema=", 1)[1],),
    )
    assert made == []


def test_a_sqlite_path_with_no_memory_store_is_reported_and_left_alone(tmp_path: Path) -> None:
    missing = tmp_path / "deep" / "memory.sqlite"
    no_store_here(f"sqlite:{missing}", str(missing))
    assert not (tmp_path / "deep").exists()  # neither the file nor its folder
    folder = tmp_path / "a-folder"
    folder.mkdir()
    no_store_here(f"sqlite:{folder}", str(folder))
    assert list(folder.iterdir()) == []
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    no_store_here(f"sqlite:{empty}", str(empty))
    assert empty.read_bytes() == b""
    # A database of something else (a session store): no memory tables are added.
    import sqlite3

    from perdure.stores.sqlite import SQLiteSessionStore

    sessions = SQLiteSessionStore(tmp_path / "sessions.db")
    asyncio.run(sessions.create("s"))
    sessions.close()
    no_store_here(f"sqlite:{tmp_path / 'sessions.db'}", str(tmp_path / "sessions.db"))
    conn = sqlite3.connect(tmp_path / "sessions.db")
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert not {"memories", "memories_fts"} & names, names


def test_a_damaged_memory_file_is_damage_not_absence(tmp_path: Path) -> None:
    broken = tmp_path / "memory.sqlite"
    broken.write_bytes(b"not a database at all" * 100)
    result = invoke("memory", "list", "--store", f"sqlite:{broken}", "--user", "alice")
    assert result.exit_code not in (0, EXIT_NOT_FOUND), result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    assert "no memory store" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert broken.read_bytes() == b"not a database at all" * 100


@pytest.fixture(params=["sqlite", "postgres"])
def encrypted_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A memory store whose memories (alice's and bob's) are under key k1."""
    from crypto_keys import cipher

    if request.param == "postgres":
        url = postgres_server.store_url(request)
    else:
        url = f"sqlite:{tmp_path / 'memory.sqlite'}"
    for user in ("alice", "bob"):
        store = open_memory_store(url, namespace=user, cipher=cipher("k1"))
        asyncio.run(_fill(store, user))
        store.close()
    return url


def _keys_file(tmp_path: Path, *names: str) -> Path:
    import base64

    from crypto_keys import K1, K2

    known = {"k1": K1, "k2": K2}
    path = tmp_path / f"keys-{'-'.join(names)}.json"
    keys = {name: base64.b64encode(known[name]).decode() for name in names}
    path.write_text(json.dumps({"keys": keys, "active": names[-1]}))
    return path


def test_an_encrypted_memory_store_reads_with_the_keys_and_rotates_to_a_new_one(
    encrypted_url: str, tmp_path: Path
) -> None:
    url, runner = encrypted_url, CliRunner()
    both = {"PERDURE_KEYS_FILE": str(_keys_file(tmp_path, "k1", "k2")), "PERDURE_KEYS": ""}
    no_keys = runner.invoke(
        cli,
        ["memory", "list", "-s", url, "-u", "alice"],
        env={"PERDURE_KEYS": "", "PERDURE_KEYS_FILE": ""},
    )
    assert no_keys.exit_code == 6  # decryption
    assert no_keys.stderr.startswith("error: ")
    assert "[decryption]" in no_keys.stderr
    listed = runner.invoke(cli, ["memory", "list", "-s", url, "-u", "alice", "--json"], env=both)
    assert listed.exit_code == 0, listed.stderr
    contents = [m["content"] for m in json.loads(listed.stdout)["memories"]]
    assert contents == [f"alice {fact}" for fact in FACTS]
    found = runner.invoke(
        cli, ["memory", "search", "trains", "-s", url, "-u", "bob", "--json"], env=both
    )
    assert [m["content"] for m in json.loads(found.stdout)["memories"]] == ["bob likes trains"]

    rotate = ["rotate-keys", "--memory", url, "--to", "k2", "--json"]
    done = runner.invoke(cli, rotate, env=both)
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout) == {"to": "k2", "memories_rotated": 6}  # both users
    only_k2 = {"PERDURE_KEYS_FILE": str(_keys_file(tmp_path, "k2")), "PERDURE_KEYS": ""}
    for user in ("alice", "bob"):
        read = runner.invoke(cli, ["memory", "export", "-s", url, "-u", user], env=only_k2)
        assert read.exit_code == 0, read.stderr
        assert [json.loads(line)["content"] for line in read.stdout.splitlines()] == [
            f"{user} {fact}" for fact in FACTS
        ]
    again = runner.invoke(cli, rotate, env=both)
    assert json.loads(again.stdout)["memories_rotated"] == 0  # nothing left to do
    clash = runner.invoke(
        cli, [*rotate[:3], "--storage", f"file:{tmp_path}", "--to", "k2"], env=both
    )
    assert clash.exit_code == EXIT_USAGE
    assert "give one of --store, --storage and --memory" in clash.stderr
