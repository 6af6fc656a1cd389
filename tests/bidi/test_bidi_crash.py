"""SIGKILL a BidiAgent mid-stream: under "message" it resumes at the last saved entry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent.parent

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")


def run(where: Path, kill_after: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    return subprocess.run(
        [sys.executable, str(TESTS / "bidi_writer.py"), str(where), str(kill_after)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("kill_after", [1, 2, 3, 4, 5])
def test_a_bidi_agent_killed_after_a_message_comes_back_with_every_saved_entry(
    tmp_path: Path, kill_after: int
) -> None:
    killed = run(tmp_path, kill_after)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == "restored []\n"
    resumed = run(tmp_path, 0)
    assert resumed.returncode == 0, resumed.stderr
    entries = [f"turn-{i // 2}" if i % 2 == 0 else f"answer-{i // 2}" for i in range(6)]
    # Saved after every message: the k-th save held the first k entries, all of them.
    assert resumed.stdout.splitlines()[0] == f"restored {entries[:kill_after]}"
