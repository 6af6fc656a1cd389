"""Compacted messages never come back, even when the writer dies mid-compaction."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import assert_model_valid
from perdure.session import FileSessionStore

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from perdure import Agent
    from perdure.models import ScriptedModel
    from perdure.session import FileSessionStore, Segmentation, Session

    def respond(messages):
        first = messages[0]["content"][0].get("text", "")
        return "summary" if first.startswith("Transcript:") else "answer"

    store = FileSessionStore(sys.argv[1], segmentation=Segmentation(max_records=5))
    session = Session(store, "c")
    agent = Agent(model=ScriptedModel([respond] * 100000), session_manager=session)
    n = agent.state.get("n") or 0
    print(f"start {n}", flush=True)
    while True:
        n += 1
        agent(f"q{n}")
        agent.state.set("n", n)
        asyncio.run(session.save())
        if n % 3 == 0:
            result = asyncio.run(session.compact())
            assert result.status == "compacted", result
            print(f"compacted {n}", flush=True)
    """
)


def test_sigkill_during_compaction_never_brings_messages_back(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = tmp_path / "store"
    rng = random.Random(7)
    folded_before = 0
    compactions = 0
    for _ in range(int(os.environ.get("PERDURE_COMPACTION_KILLS", "20"))):
        with subprocess.Popen(
            [sys.executable, str(script), str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            # The clock starts once the writer has opened the session: importing
            # perdure alone can take a second on a loaded machine.
            assert proc.stdout is not None
            started = proc.stdout.readline()
            assert started.startswith("start "), (started, proc.stderr.read())
            lifetime = rng.uniform(0.05, 0.5)
            try:
                proc.wait(timeout=lifetime)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=30)
            stdout = started + stdout
        assert proc.returncode == -signal.SIGKILL, stderr
        acked = [
            int(line.split()[1]) for line in stdout.splitlines() if line.startswith("compacted ")
        ]
        compactions += len(acked)
        if acked:
            folded_before = max(folded_before, acked[-1])
        record = asyncio.run(FileSessionStore(root).get("c"))  # always reopens
        assert_model_valid(record.messages)
        questions = [
            int(block["text"][1:])
            for message in record.messages
            for block in message["content"]
            if block.get("text", "").startswith("q")
        ]
        assert all(q >= folded_before for q in questions), (folded_before, questions)
    assert compactions >= 3
