"""``perdure migrate strands DIR --to STORE`` through the real entry points.

The source directories are written here in the Strands ``FileSessionManager`` and
``SnapshotSessionManager`` layouts; the imported sessions are then resumed by real
agents.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from helpers import assert_model_valid
from perdure import Agent
from perdure.cli._common import EXIT_NOT_FOUND, EXIT_PROBLEM, EXIT_USAGE
from perdure.cli.main import cli
from perdure.models import ScriptedModel
from perdure.session import Session, SessionStore, open_store
from perdure.types import Message

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def invoke(*args: str) -> Result:
    """Run ``perdure ARGS``; an unexpected exception fails the test with its traceback."""
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def message_log(
    root: Path,
    session_id: str,
    messages: list[Any],
    agent_id: str = "default",
    created_at: str = "",
) -> Path:
    """A Strands FileSessionManager session (messages already bytes-encoded)."""
    agent_dir = root / f"session_{session_id}" / "agents" / f"agent_{agent_id}"
    write_json(
        root / f"session_{session_id}" / "session.json",
        {
            "session_id": session_id,
            "session_type": "AGENT",
            "created_at": created_at,
            "updated_at": created_at,
        },
    )
    write_json(
        agent_dir / "agent.json",
        {
            "agent_id": agent_id,
            "state": {"n": len(messages)},
            "conversation_manager_state": {
                "__name__": "SlidingWindowConversationManager",
                "removed_message_count": 0,
            },
            "_internal_state": {
                "interrupt_state": {"interrupts": {}, "context": {}, "activated": False}
            },
        },
    )
    for index, message in enumerate(messages):
        write_json(
            agent_dir / "messages" / f"message_{index}.json",
            {"message": message, "message_id": index, "redact_message": None},
        )
    return agent_dir


def chat(count: int) -> list[Message]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"m{i}"}]}
        for i in range(count)
    ]


def clean_source(root: Path) -> Path:
    """Two good sessions: a long one (12 files) and one with a dangling toolUse + an image."""
    message_log(root, "long", chat(12))
    picture = {
        "role": "user",
        "content": [
            {"text": "look"},
            {
                "image": {
                    "format": "png",
                    "source": {
                        "bytes": {"__bytes_encoded__": True, "data": base64.b64encode(PNG).decode()}
                    },
                }
            },
        ],
    }
    dangling = {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t1", "name": "zoom", "input": {}}}],
    }
    message_log(
        root,
        "crashed",
        [picture, dangling, chat(1)[0], {"role": "assistant", "content": [{"text": "ok"}]}],
    )
    return root


def texts(messages: list[Message]) -> list[str]:
    return [b["text"] for m in messages for b in m["content"] if "text" in b]


def resume(store: SessionStore, session_id: str) -> Agent:
    return Agent(model=ScriptedModel(["sure"]), session_manager=Session.resume(store, session_id))


def test_import_into_a_file_store_then_resume(tmp_path: Path) -> None:
    source = clean_source(tmp_path / "strands")
    url = f"file:{tmp_path / 'store'}"
    result = invoke("migrate", "strands", str(source), "--to", url, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["counts"] == {"imported": 2, "would_import": 0, "skipped": 0, "failed": 0}
    entries = {e["session_id"]: e for e in report["sessions"]}
    assert entries["crashed"]["placeholders_added"] == 1
    assert entries["long"]["messages_imported"] == 12
    store = open_store(url)
    long = resume(store, "long")
    assert texts(long.messages) == [f"m{i}" for i in range(12)]
    assert long.state.get() == {"n": 12}
    crashed = resume(store, "crashed")
    assert crashed.messages[0]["content"][1]["image"]["source"]["bytes"] == PNG
    crashed("what now?")
    model = crashed.model
    assert isinstance(model, ScriptedModel)
    assert_model_valid(model.requests[-1]["messages"])


def test_a_migrated_session_keeps_its_strands_creation_time(tmp_path: Path) -> None:
    # As Strands writes it: datetime.now(timezone.utc).isoformat().
    message_log(tmp_path / "strands", "old", chat(2), created_at="2025-03-04T05:06:07.891011+00:00")
    url = f"sqlite:{tmp_path / 'perdure.db'}"
    done = invoke("migrate", "strands", str(tmp_path / "strands"), "--to", url, "--json")
    assert done.exit_code == 0, done.stderr
    listed = invoke("sessions", "list", "--store", url)
    assert listed.exit_code == 0, listed.stderr
    header, row = (line.split("\t") for line in listed.stdout.splitlines())
    assert dict(zip(header, row, strict=True))["created"] == "2025-03-04T05:06:07Z"
    as_json = json.loads(invoke("sessions", "list", "--store", url, "--json").stdout)
    assert as_json["sessions"][0]["created_at"] == "2025-03-04T05:06:07.891011Z"
    shown = invoke("sessions", "show", "old", "--store", url)
    fields = dict(line.split("\t", 1) for line in shown.stdout.splitlines())
    assert fields["created"] == "2025-03-04T05:06:07Z", shown.stdout
    assert fields["updated"] > fields["created"]


def test_text_output_dry_run_rerun_and_overwrite(tmp_path: Path) -> None:
    source = clean_source(tmp_path / "strands")
    target = tmp_path / "store"
    dry = invoke("migrate", "strands", str(source), "--to", f"file:{target}", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert "would import" in dry.stdout
    assert "dry run: nothing written" in dry.stderr  # the summary: on stderr when piped
    assert not target.exists()
    first = invoke("migrate", "strands", str(source), "--to", f"file:{target}")
    assert first.exit_code == 0, first.stderr
    assert "2 imported, 0 skipped, 0 failed" in first.stderr
    again = invoke("migrate", "strands", str(source), "--to", f"file:{target}")
    assert again.exit_code == 0, again.stderr
    assert "0 imported, 2 skipped" in again.stderr
    assert "already exists" in again.stderr
    replaced = invoke(
        "migrate", "strands", str(source), "--to", f"file:{target}", "--overwrite", "--json"
    )
    assert replaced.exit_code == 0, replaced.stderr
    assert json.loads(replaced.stdout)["counts"]["imported"] == 2


def test_malformed_files_are_listed_and_the_status_is_1(tmp_path: Path) -> None:
    source = clean_source(tmp_path / "strands")
    broken = message_log(source, "broken", chat(4))
    (broken / "messages" / "message_3.json").write_bytes(b"\xff\xfe not json")
    (source / "session_broken2").mkdir()
    write_json(source / "session_broken2" / "session.json", [])
    result = invoke("migrate", "strands", str(source), "--to", f"file:{tmp_path / 'store'}")
    assert result.exit_code == EXIT_PROBLEM, result.stderr
    assert "session_broken/agents/agent_default/messages/message_3.json: not UTF-8" in result.stderr
    assert "session_broken2/session.json: not a JSON object" in result.stderr
    assert "3 imported" in result.stderr
    assert "was not imported" in result.stderr


def test_the_snapshot_layout_through_a_subprocess_into_sqlite(tmp_path: Path) -> None:
    source = tmp_path / "strands"
    snapshots = source / "session" / "snap" / "scopes" / "agent" / "default" / "snapshots"
    blob = {
        "scope": "agent",
        "schema_version": "1.0",
        "created_at": "2025-06-02T09:00:00.000Z",
        "data": {"messages": chat(4), "state": {"k": "v"}, "system_prompt": None},
        "app_data": {},
    }
    write_json(snapshots / "snapshot_latest.json", blob)
    write_json(
        snapshots / "immutable_history" / f"snapshot_{1748854800000:013d}_{0:032x}.json", blob
    )
    database = tmp_path / "perdure.db"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "perdure",
            "migrate",
            "strands",
            str(source),
            "--to",
            f"sqlite:{database}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "1 imported" in completed.stderr
    assert completed.stdout.splitlines()[1].split("\t")[:2] == ["snap", "imported"]
    store = open_store(f"sqlite:{database}")
    agent = resume(store, "snap")
    assert texts(agent.messages) == ["m0", "m1", "m2", "m3"]
    assert agent.state.get() == {"k": "v"}
    assert [c.trigger for c in asyncio.run(store.checkpoints.list("snap"))] == ["import"]  # type: ignore[attr-defined]


def test_nothing_to_import_and_bad_arguments(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = invoke("migrate", "strands", str(empty), "--to", f"file:{tmp_path / 's'}")
    assert nothing.exit_code == EXIT_NOT_FOUND
    assert "no Strands sessions" in nothing.stderr
    missing = invoke("migrate", "strands", str(tmp_path / "nope"), "--to", f"file:{tmp_path}")
    assert missing.exit_code == EXIT_USAGE
    scheme = invoke("migrate", "strands", str(empty), "--to", "mongo://x")
    assert scheme.exit_code == EXIT_USAGE
    assert "Invalid value for --to" in scheme.stderr
    no_target = CliRunner(env={"PERDURE_STORE": None}).invoke(
        cli, ["migrate", "strands", str(empty)]
    )
    assert no_target.exit_code == EXIT_USAGE
    for args in (("migrate",), ("migrate", "strands")):
        helped = invoke(*args, "--help")
        assert helped.exit_code == 0
        assert "Usage:" in helped.stdout


def test_a_memory_target_is_refused_since_nothing_would_persist(tmp_path: Path) -> None:
    source = clean_source(tmp_path / "strands")
    for extra in ((), ("--dry-run",), ("--json",)):
        result = invoke("migrate", "strands", str(source), "--to", "memory:", *extra)
        assert result.exit_code == EXIT_USAGE
        assert result.stdout == ""  # never "2 imported"
        assert "Invalid value for --to" in result.stderr
        assert "nothing would be imported" in result.stderr
        assert result.stderr.count("\n") == 1
    from_env = CliRunner(env={"PERDURE_STORE": "memory:"}).invoke(
        cli, ["migrate", "strands", str(source)]
    )
    assert from_env.exit_code == EXIT_USAGE
    assert "imported" not in from_env.stdout


def test_strict_refuses_a_session_with_an_unreadable_message(tmp_path: Path) -> None:
    source = clean_source(tmp_path / "strands")
    broken = message_log(source, "broken", chat(4))
    (broken / "messages" / "message_2.json").write_bytes(b"{not json")
    url = f"file:{tmp_path / 'store'}"
    result = invoke("migrate", "strands", str(source), "--to", url, "--strict", "--json")
    assert result.exit_code == EXIT_PROBLEM, result.stderr
    entries = {e["session_id"]: e for e in json.loads(result.stdout)["sessions"]}
    assert entries["broken"]["status"] == "failed"
    assert "strict" in entries["broken"]["reason"]
    assert "message_2.json" in entries["broken"]["reason"]
    assert {entries["long"]["status"], entries["crashed"]["status"]} == {"imported"}
    store = open_store(url)
    assert sorted(m.session_id for m in asyncio.run(store.list())) == ["crashed", "long"]


def test_snapshots_list_on_a_strands_folder_points_to_migrate(tmp_path: Path) -> None:
    source = clean_source(tmp_path / "strands")
    result = invoke("snapshots", "list", "long", "--storage", f"file:{source}")
    assert result.exit_code == EXIT_NOT_FOUND
    assert result.stderr.count("\n") == 1
    assert f"perdure migrate strands {source} --to STORE" in result.stderr
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    plain = invoke("snapshots", "list", "long", "--storage", f"file:{elsewhere}")
    assert plain.exit_code == EXIT_NOT_FOUND
    assert "migrate strands" not in plain.stderr
