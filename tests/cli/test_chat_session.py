"""``perdure chat --session``: the conversation survives the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def chat(cwd: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", "chat", "--model", "scripted", "--session", "s1"],
        input=text,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=60,
        check=False,
    )


def test_chat_session_is_stored_and_resumed_by_a_new_process(tmp_path: Path) -> None:
    first = chat(tmp_path, "hello there\n")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / ".perdure" / "sessions" / "s1" / "journal.jsonl").exists()
    second = chat(tmp_path, "second visit\n")
    assert second.returncode == 0, second.stderr
    assert "resumed a conversation of 4 messages" in second.stdout + second.stderr
    assert "You said: second visit" in second.stdout
