"""The output rules every ``perdure`` command shares (issue 23), through the real CLI.

One table style; times in UTC with ``Z``; plural forms; ``--store`` before or after
the command; whole descriptions in ``--help``; every error one ``error: …`` line;
tab-separated tables when piped, or what ``--format`` asks for. (``conftest.py``
also checks, for every command any CLI test runs, that no traceback is printed and
that piped output holds no box-drawing character.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from perdure import Agent
from perdure.cli._common import EXIT_NOT_FOUND, EXIT_USAGE
from perdure.cli.main import cli
from perdure.cli.output import BOX_CHARACTERS, format_time, plural
from perdure.cli.sessions import select_sessions
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionMeta, open_store
from perdure.session.expiry import epoch_of

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def talk(url: str, session_id: str, turns: int = 1) -> None:
    store = open_store(url)
    agent = Agent(
        model=ScriptedModel([f"answer {i}" for i in range(turns)]),
        session_manager=Session(store, session_id),
    )
    for i in range(turns):
        agent(f"question {i}")
    getattr(store, "close", lambda: None)()


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"file:{tmp_path / 'store'}"
    for session_id, turns in (("user-b", 2), ("user-a", 1), ("bot-c", 3)):
        talk(url, session_id, turns)
    return url


def test_plural_and_utc_times() -> None:
    assert [plural(n, "key") for n in (0, 1, 2)] == ["0 keys", "1 key", "2 keys"]
    assert plural(1, "entry", "entries") == "1 entry"
    assert plural(3, "entry", "entries") == "3 entries"
    assert format_time("2025-01-02T03:04:05.999+00:00") == "2025-01-02T03:04:05Z"
    assert format_time("2025-01-02T05:04:05+02:00") == "2025-01-02T03:04:05Z"
    assert format_time("2025-01-02T03:04:05") == "2025-01-02T03:04:05Z"  # naive: UTC
    assert format_time("not a time") == "not a time"
    assert format_time(None) == ""


ERROR_CASES = [
    (["sessions", "list", "--bogus"], EXIT_USAGE, "--bogus"),
    (["sessoins"], EXIT_USAGE, "sessoins"),
    (["sessions", "show"], EXIT_USAGE, "ID"),
    (["sessions", "list", "--format", "xml"], EXIT_USAGE, "xml"),
    (["sessions", "list", "--sort", "size"], EXIT_USAGE, "size"),
    (["sessions", "list", "--limit", "many"], EXIT_USAGE, "many"),
    (["sessions", "list", "--store", "ftp://x"], EXIT_USAGE, "ftp"),
    (["--store", "ftp://x", "sessions", "list"], EXIT_USAGE, "ftp"),
    (["sessions", "show", "nobody"], EXIT_NOT_FOUND, "nobody"),
    (["sessions", "list", "--sort", "updated", "--after", "nobody"], EXIT_USAGE, "nobody"),
    (["checkpoints", "list", "nobody"], EXIT_NOT_FOUND, "nobody"),
]


@pytest.mark.parametrize(("args", "code", "named"), ERROR_CASES)
def test_every_error_is_one_line(url: str, args: list[str], code: int, named: str) -> None:
    if "--store" not in args:
        args = [*args, "--store", url]
    result = invoke(*args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert named in result.stderr
    assert "Usage:" not in result.stderr
    assert "Traceback" not in result.stderr


def test_a_usage_error_in_a_real_process_is_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "sessions", "list", "--bogus"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: No such option '--bogus' (see 'perdure sessions list --help')"
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["copy", "--from", "file:{tmp}/a", "--to", "file:{tmp}/b"],
        ["migrate-schema", "--store", "postgresql://nobody@127.0.0.1:1/x"],
        ["snapshots", "list", "s1"],
        ["demo", "--data-dir", "{tmp}/demo"],
    ],
)
def test_a_store_before_a_command_that_would_ignore_it_is_refused(
    url: str, command: list[str], tmp_path: Path
) -> None:
    command = [arg.replace("{tmp}", str(tmp_path)) for arg in command]
    done = invoke("--store", url, *command)
    assert done.exit_code == EXIT_USAGE
    assert f"--store before {command[1] if command[0] == 'snapshots' else command[0]!r}" in (
        done.stderr
    )
    assert not (tmp_path / "b").exists()
    assert invoke("--store", url, command[0], "--help").exit_code == 0  # help still shows


def test_store_before_or_after_the_command(url: str, tmp_path: Path) -> None:
    after = invoke("sessions", "list", "--store", url, "--json")
    before = invoke("--store", url, "sessions", "list", "--json")
    assert after.exit_code == before.exit_code == 0, (after.stderr, before.stderr)
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert len(json.loads(before.stdout)["sessions"]) == 3
    # After the command wins over before it.
    other = f"file:{tmp_path / 'other'}"
    talk(other, "only")
    both = invoke("-s", url, "sessions", "list", "-s", other, "--json")
    assert [s["session_id"] for s in json.loads(both.stdout)["sessions"]] == ["only"]


def test_piped_tables_are_tab_separated_with_a_header(url: str) -> None:
    piped = invoke("sessions", "list", "--store", url)
    assert piped.exit_code == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert lines[0].split("\t") == ["id", "created", "updated", "messages"]
    rows = [line.split("\t") for line in lines[1:]]
    assert [(row[0], row[3]) for row in rows] == [("bot-c", "6"), ("user-a", "2"), ("user-b", "4")]
    assert all(row[1].endswith("Z") and row[2].endswith("Z") for row in rows)
    assert not BOX_CHARACTERS & set(piped.stdout)

    assert invoke("sessions", "list", "--store", url, "--format", "tsv").stdout == piped.stdout
    as_json = invoke("sessions", "list", "--store", url, "--format", "json").stdout
    assert json.loads(as_json) == json.loads(invoke("sessions", "list", "-s", url, "--json").stdout)
    drawn = invoke("sessions", "list", "--store", url, "--format", "table").stdout
    assert "─" in drawn
    assert "\t" not in drawn
    assert "bot-c" in drawn
    # --format before the command works too.
    assert invoke("--format", "json", "sessions", "list", "-s", url).stdout == as_json


def test_top_level_help_shows_whole_descriptions() -> None:
    shown = " ".join(invoke("--help").stdout.split())
    assert "Copy sessions with their checkpoints from one store to another, verified." in shown
    assert "..." not in shown.split("Commands:")[1]  # no summary cut short
    sub = " ".join(invoke("sessions", "--help").stdout.split())
    assert "Show a session: metadata, state, checkpoints." in sub


def ids(result: Result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return [s["session_id"] for s in json.loads(result.stdout)["sessions"]]


def newest_first(sessions: list[dict[str, Any]], field: str) -> list[str]:
    """Session ids by ``field`` (an ISO time), newest first, ties by id."""
    in_id_order = sorted(sessions, key=lambda s: s["session_id"])
    return [
        s["session_id"]
        for s in sorted(in_id_order, key=lambda s: epoch_of(s[field]) or 0.0, reverse=True)
    ]


def test_select_sessions_orders_by_time_newest_first() -> None:
    def meta(session_id: str, created: str, updated: str) -> SessionMeta:
        return SessionMeta(session_id, created, updated, 1)

    metas = [
        meta("a", "2025-01-01T10:00:00Z", "2025-01-03T10:00:00Z"),
        meta("b", "2025-01-02T10:00:00Z", "2025-01-02T10:00:00Z"),
        meta("c", "2025-01-02T10:00:00+00:00", "2025-01-04T09:00:00+02:00"),  # 07:00Z
        meta("d", "", ""),  # unreadable times sort last
    ]
    names = lambda found: [m.session_id for m in found]  # noqa: E731
    select = select_sessions
    assert names(select(metas, sort="updated", after=None, match=None)) == ["c", "a", "b", "d"]
    assert names(select(metas, sort="created", after=None, match=None)) == ["b", "c", "a", "d"]
    assert names(select(metas, sort="id", after="b", match=None)) == ["c", "d"]
    assert names(select(metas, sort="updated", after="a", match=None)) == ["b", "d"]
    assert names(select(metas, sort="updated", after=None, match="[ab]")) == ["a", "b"]
    with pytest.raises(ValueError, match="--after"):
        select(metas, sort="created", after="zz", match=None)
    with pytest.raises(ValueError, match="--sort"):
        select(metas, sort="size", after=None, match=None)


def test_sessions_list_sorts_filters_and_pages(url: str) -> None:
    talk(url, "user-b", 1)  # touched last
    listed = invoke("sessions", "list", "-s", url, "--json")
    sessions = json.loads(listed.stdout)["sessions"]
    assert ids(listed) == ["bot-c", "user-a", "user-b"]
    by_update = newest_first(sessions, "updated_at")
    by_creation = newest_first(sessions, "created_at")
    assert ids(invoke("sessions", "list", "-s", url, "--sort", "updated", "--json")) == by_update
    assert ids(invoke("sessions", "list", "-s", url, "--sort", "created", "--json")) == by_creation
    assert ids(invoke("sessions", "list", "-s", url, "--match", "user-*", "--json")) == [
        "user-a",
        "user-b",
    ]
    first, second = by_update[:2]
    page = invoke("sessions", "list", "-s", url, "--sort", "updated", "--limit", "1", "--json")
    assert (ids(page), json.loads(page.stdout)["next_after"]) == ([first], first)
    rest = invoke("sessions", "list", "-s", url, "--sort", "updated", "--after", first, "--json")
    assert ids(rest) == by_update[1:]
    human = invoke("sessions", "list", "-s", url, "--sort", "updated", "--limit", "1")
    assert f"more: --after {first} --sort updated" in human.stderr
    assert human.stdout.splitlines()[1].split("\t")[:1] == [first]
    assert second != first


def test_sessions_list_shows_time_to_expiry_with_a_ttl(url: str) -> None:
    with_ttl = f"{url}?ttl=3600"
    talk(with_ttl, "fresh")
    result = invoke("sessions", "list", "-s", with_ttl)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == ["id", "created", "updated", "messages", "expires in"]
    rows = {line.split("\t")[0]: line.split("\t")[4] for line in lines[1:]}
    assert rows["fresh"].startswith(("59m", "1h")), rows


@pytest.mark.parametrize("args", [[], ["sessions"], ["memory"]])
def test_a_bare_group_shows_its_help_not_an_error(args: list[str]) -> None:
    result = invoke(*args)
    shown = result.stdout + result.stderr
    assert shown.startswith(
        (f"Usage: {' '.join(['cli', *args])} ", f"Usage: {' '.join(['perdure', *args])} ")
    ), shown
    assert "error:" not in shown
    assert "Commands:" in shown


def test_store_before_the_command_is_the_target_of_a_migration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PERDURE_STORE", raising=False)
    source = tmp_path / "strands" / "session_trip" / "agents" / "agent_default"
    (source / "messages").mkdir(parents=True)
    (source / "agent.json").write_text(json.dumps({"agent_id": "default", "state": {}}))
    record = {"message": {"role": "user", "content": [{"text": "hi"}]}, "message_id": 0}
    (source / "messages" / "message_0.json").write_text(json.dumps(record))
    target = f"file:{tmp_path / 'store'}"
    done = invoke("--store", target, "migrate", "strands", str(tmp_path / "strands"), "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["counts"]["imported"] == 1
    listed = invoke("sessions", "list", "-s", target, "--json")
    assert [s["session_id"] for s in json.loads(listed.stdout)["sessions"]] == ["trip"]
    missing = invoke("migrate", "strands", str(tmp_path / "strands"))
    assert missing.exit_code == EXIT_USAGE
    assert missing.stderr.startswith("error: Missing option '--to'")
    assert missing.stderr.count("\n") == 1


def pure_tsv(stdout: str) -> list[dict[str, str]]:
    """``stdout`` as the rows of one tab-separated table; fail on anything else."""
    lines = stdout.splitlines()
    assert lines, "no header: piped output must be a table"
    header = lines[0].split("\t")
    assert all(header), f"an empty column name in the header {header}"
    assert len(set(header)) == len(header), header
    rows = [line.split("\t") for line in lines[1:]]
    for row in rows:
        assert len(row) == len(header), f"not a row of {header}: {row}\n{stdout}"
    assert not BOX_CHARACTERS & set(stdout)
    return [dict(zip(header, row, strict=True)) for row in rows]


def strands_folder(root: Path, *ids: str) -> Path:
    for session_id in ids:
        agent = root / f"session_{session_id}" / "agents" / "agent_default"
        (agent / "messages").mkdir(parents=True)
        (agent / "agent.json").write_text(json.dumps({"agent_id": "default", "state": {}}))
        record = {"message": {"role": "user", "content": [{"text": "hi"}]}, "message_id": 0}
        (agent / "messages" / "message_0.json").write_text(json.dumps(record))
    return root


def snapshot_folder(root: Path) -> str:
    from perdure.session import SnapshotSessionManager
    from perdure.storage import LocalFileStorage

    manager = SnapshotSessionManager(
        "s1", storage=LocalFileStorage(root), snapshot_trigger=lambda **_: True
    )
    agent = Agent(model=ScriptedModel(["one", "two"]), session_manager=manager)
    agent("hello")
    agent("again")
    return f"file:{root}"


# Each command: its arguments ({url}: a file store of three sessions, {tmp}: a folder),
# a column its table has, and a piece of its summary (on stderr when piped).
PIPED = {
    "verify": (["verify", "--store", "{url}"], "damage", "verified: no damage"),
    "repair": (["repair", "--store", "{url}"], "kind", "nothing to repair"),
    "gc": (["gc", "--store", "{url}", "--ttl", "30d"], "kind", "would delete 0 of 3 sessions"),
    "copy": (
        ["copy", "--from", "{url}", "--to", "file:{tmp}/copy"],
        "status",
        "3 copied, 0 skipped, 0 failed",
    ),
    "copy --dry-run": (
        ["copy", "--from", "{url}", "--to", "file:{tmp}/copy", "--dry-run"],
        "status",
        "(dry run: nothing written)",
    ),
    "migrate strands": (
        ["migrate", "strands", "{tmp}/strands", "--to", "file:{tmp}/migrated"],
        "status",
        "2 imported, 0 skipped, 0 failed",
    ),
    "migrate strands --dry-run": (
        ["migrate", "strands", "{tmp}/strands", "--to", "file:{tmp}/migrated", "--dry-run"],
        "status",
        "2 would import",
    ),
    "snapshots list": (
        ["snapshots", "list", "s1", "--storage", "{snapshots}"],
        "snapshot id",
        "snapshot_latest: 4 messages",
    ),
    "snapshots show": (
        ["snapshots", "show", "s1", "--storage", "{snapshots}"],
        "value",
        "",
    ),
}


@pytest.mark.parametrize("name", sorted(PIPED))
def test_piped_output_is_one_table_and_the_summary_goes_to_stderr(
    url: str, tmp_path: Path, name: str
) -> None:
    args, column, summary = PIPED[name]
    strands_folder(tmp_path / "strands", "trip", "walk")
    places = {
        "{url}": url,
        "{tmp}": str(tmp_path),
        "{snapshots}": snapshot_folder(tmp_path / "snapshots"),
    }
    words = list(args)
    for key, value in places.items():
        words = [word.replace(key, value) for word in words]
    for fmt in ([], ["--format", "tsv"]):  # piped, or asked for
        for written in ("copy", "migrated"):  # each run starts from an empty target
            shutil.rmtree(tmp_path / written, ignore_errors=True)
        result = invoke(*words, *fmt)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        pure_tsv(result.stdout)
        assert column in result.stdout.splitlines()[0].split("\t")
        assert summary in result.stderr, result.stderr
        assert "error:" not in result.stderr
    for written in ("copy", "migrated"):
        shutil.rmtree(tmp_path / written, ignore_errors=True)
    # On a terminal (--format table) the summary is printed under the table, on stdout.
    drawn = invoke(*words, "--format", "table")
    if summary:
        assert summary in drawn.stdout, drawn.stdout
    assert "\t" not in drawn.stdout


def test_piped_repair_and_gc_put_every_finding_in_one_table(url: str, tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "store")
    journal = store.session_dir("user-a") / "journal.jsonl"
    data = bytearray(journal.read_bytes())
    data[data.index(b"answer 0")] ^= 0x01
    journal.write_bytes(bytes(data))
    verify = invoke("verify", "--store", url)
    assert verify.exit_code == 1
    assert [(r["session"], r["damage"]) for r in pure_tsv(verify.stdout)] == [
        ("user-a", "bad_hash")
    ]
    assert "1 of 3 sessions damaged" in verify.stderr
    repair = invoke("repair", "--store", url)
    assert repair.exit_code == 1
    [row] = pure_tsv(repair.stdout)
    assert (row["kind"], row["session"], row["status"]) == ("session", "user-a", "would repair")
    assert repair.stderr.startswith("dry run: nothing was changed")
    assert "would move 1 record of 1 session" in repair.stderr
