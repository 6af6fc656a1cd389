"""SIGKILL a BidiAgent mid-stream: under "message" it resumes at the last saved entry."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from perdure import Agent, NullConversationManager
from perdure.agent.conversation.pairing import INTERRUPTED_TOOL_RESULT_TEXT
from perdure.models import ScriptedModel
from perdure.session import SnapshotSessionManager
from perdure.storage import LocalFileStorage

TESTS = Path(__file__).parent.parent

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")


def run(where: Path, kill_after: int | str) -> subprocess.CompletedProcess[str]:
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


def test_a_tool_call_cut_off_by_a_kill_is_closed_before_the_next_connection_opens(
    tmp_path: Path,
) -> None:
    # The call is saved, the process dies inside the tool: the next start must not
    # hand the model a call without a result (a realtime API refuses it), nor run
    # the tool again behind its back.
    killed = run(tmp_path, "tool-kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (tmp_path / "tool-runs").read_text() == "a\n"
    resumed = run(tmp_path, "tool-resume")
    assert resumed.returncode == 0, resumed.stderr
    opened_with = json.loads(resumed.stdout)
    call = {"toolUseId": "t1", "name": "lookup", "input": {"key": "a"}}
    closed = {
        "toolResult": {
            "toolUseId": "t1",
            "status": "error",
            "content": [{"text": INTERRUPTED_TOOL_RESULT_TEXT}],
        }
    }
    assert opened_with == [
        {"role": "user", "content": [{"text": "find a"}]},
        {"role": "assistant", "content": [{"toolUse": call}]},
        {"role": "user", "content": [closed]},
    ]
    assert (tmp_path / "tool-runs").read_text() == "a\n"  # not run again
    # And stored so: a plain agent reading the session gets the closed pair.
    reader = Agent(
        ScriptedModel([]), agent_id="voice", conversation_manager=NullConversationManager()
    )
    manager = SnapshotSessionManager("call", storage=LocalFileStorage(tmp_path))
    asyncio.run(manager.restore_snapshot(reader))
    assert reader.messages == opened_with
