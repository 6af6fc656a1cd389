"""``perdure demo`` through its real entry points."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from perdure._runtime.loop import run_sync
from perdure.cli.demo import run_demo
from perdure.cli.main import cli, main
from perdure.cli.output import BOX_CHARACTERS


def test_demo_kills_its_worker_and_resumes_without_rerunning_a_tool(tmp_path: Path) -> None:
    out = io.StringIO()
    demo = run_demo(out, color=False, data_dir=tmp_path / "data")
    snapshot = run_sync(demo, async_name="run_demo()")
    text = out.getvalue()
    pause = r"(worker \d) \| ⏸  (checkpoint|interrupt) #(\d+): (\w+)(?:, cycle (\d+))?"
    pauses = re.findall(pause, text)
    assert [(w, kind, int(n), where, cycle) for w, kind, n, where, cycle in pauses] == [
        ("worker 1", "checkpoint", 1, "after_model", "0"),
        ("worker 1", "checkpoint", 2, "after_tools", "0"),
        ("worker 1", "checkpoint", 3, "after_model", "1"),
        ("worker 1", "checkpoint", 4, "after_tools", "1"),
        ("worker 1", "checkpoint", 5, "after_model", "2"),
        ("worker 2", "checkpoint", 6, "after_tools", "2"),
        ("worker 2", "checkpoint", 7, "after_model", "3"),
        ("worker 2", "interrupt", 8, "confirm_gift", ""),
        ("worker 2", "checkpoint", 9, "after_tools", "3"),
    ]
    assert "killed worker 1" in text
    assert "SIGKILL" in text
    # the graph part: killed between plan and draft, resumed at draft, each node once
    assert "worker 1 | · plan ran\n💥 killed worker 1" in text
    assert "worker 2 | ▶ resumed: done ['plan'], next ['draft']" in text
    assert "node runs across both processes: ✔ plan 1×, ✔ draft 1×, ✔ review 1×" in text
    graph_runs = (tmp_path / "data" / "graph" / "node-runs.log").read_text().split()
    assert graph_runs == ["plan", "draft", "review"]
    # The command it prints to look at the run works, and says the run completed.
    (hint,) = re.findall(r"where the run stands: perdure (snapshots runs .*)", text)
    shown = CliRunner().invoke(cli, [*shlex.split(hint), "--json"])
    assert shown.exit_code == 0, shown.stderr
    run = json.loads(shown.stdout)
    assert (run["status"], run["completed"]) == ("completed", ["plan", "draft", "review"])
    assert "resume from after_model (cycle 2) — 6 messages restored from the session" in text
    assert "stop_reason=end_turn" in text
    # time travel: a checkpoint, a compaction, a restore, and the table of checkpoints
    assert re.search(r"◆ compact compacted: messages 0–9 folded into one summary \(12 → 3", text)
    assert "◆ restore restored: 3 → 12 messages" in text
    table = re.findall(r"^  ([0-9A-Z]{26})   (\w+)", text, flags=re.M)
    assert [trigger for _, trigger in table] == ["manual", "pre_compaction", "pre_restore"]
    assert "\x1b[" not in text  # colour off when asked
    runs = (tmp_path / "data" / "tool-runs.log").read_text().split()[::2]
    assert sorted(runs) == sorted(
        ["save_profile", "generate_candidates", "filter_candidates", "confirm_choice"]
    )
    state = snapshot.data["state"]["gift_session"]
    assert state["step"] == "final_choice_made"
    assert state["selected_gift_id"] == "g6"
    assert state["candidate_ids"] == ["g1", "g2", "g6"]  # mugs, notebooks, >$50 filtered out
    results = [
        b["toolResult"]
        for m in snapshot.data["messages"]
        for b in m["content"]
        if "toolResult" in b
    ]
    assert [r["toolUseId"] for r in results] == ["t1", "t2", "t3", "t4"]
    assert all(r["status"] == "success" for r in results)


def test_demo_colours_when_forced(tmp_path: Path) -> None:
    out = io.StringIO()
    run_sync(run_demo(out, color=True, data_dir=tmp_path / "d"), async_name="run_demo()")
    assert "\x1b[33;1m⏸" in out.getvalue()
    assert "worker 1 │ " in out.getvalue()  # in colour (a terminal): the drawn bar


def test_console_script_entry_point_runs_the_demo(tmp_path: Path) -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "finished: stop_reason=end_turn" in proc.stdout
    assert not BOX_CHARACTERS & set(proc.stdout)  # piped: no box-drawing characters
    assert (tmp_path / "demo" / "store" / "sessions" / "gift-finder" / "journal.jsonl").exists()


def test_cli_without_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err  # usage errors go to stderr
