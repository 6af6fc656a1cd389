"""``perdure demo`` through its real entry points."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from perdure._runner import run_sync
from perdure.cli.demo import run_demo
from perdure.cli.main import main


def test_demo_walks_every_pause_and_ends_with_a_snapshot() -> None:
    out = io.StringIO()
    snapshot = run_sync(run_demo(out, color=False), async_name="run_demo()")
    text = out.getvalue()
    pauses = re.findall(r"⏸  (checkpoint|interrupt) #\d+: (\w+)(?:, cycle (\d+))?", text)
    assert pauses == [
        ("checkpoint", "after_model", "0"),
        ("checkpoint", "after_tools", "0"),
        ("checkpoint", "after_model", "1"),
        ("checkpoint", "after_tools", "1"),
        ("checkpoint", "after_model", "2"),
        ("checkpoint", "after_tools", "2"),
        ("checkpoint", "after_model", "3"),
        ("interrupt", "confirm_gift", ""),
        ("checkpoint", "after_tools", "3"),
    ]
    assert "simulated restart" in text
    assert "stop_reason=end_turn" in text
    assert "Snapshot summary" in text
    assert "\x1b[" not in text  # colour off when asked
    state = snapshot.data["state"]["gift_session"]
    assert state["step"] == "final_choice_made"
    assert state["selected_gift_id"] == "g6"
    assert state["candidate_ids"] == ["g1", "g2", "g6"]  # mugs, notebooks, >$50 filtered out
    # every tool ran exactly once: one result per call in the history
    results = [
        b["toolResult"]["toolUseId"]
        for m in snapshot.data["messages"]
        for b in m["content"]
        if "toolResult" in b
    ]
    assert results == ["t1", "t2", "t3", "t4"]


def test_demo_colours_when_forced() -> None:
    out = io.StringIO()
    run_sync(run_demo(out, color=True), async_name="run_demo()")
    assert "\x1b[33;1m⏸" in out.getvalue()


def test_console_script_entry_point_runs_the_demo() -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "finished: stop_reason=end_turn" in proc.stdout


def test_cli_without_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out
