"""A checkpoint taken in one process resumes in another; no tool runs twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from perdure import Agent, Snapshot, tool
    from perdure.models import ScriptedModel

    work = Path(sys.argv[1])
    phase = sys.argv[2]

    @tool
    def charge(amount: int) -> str:
        '''Charge a card (a side effect that must happen once).

        Args:
            amount: dollars.
        '''
        with open(work / "charges.log", "a") as log:
            log.write(f"{amount}\\n")
        return "charged"

    script = [
        {"role": "assistant", "content": [
            {"toolUse": {"toolUseId": "c1", "name": "charge", "input": {"amount": 30}}}]},
        "Charged $30.",
    ]
    if phase == "first":
        agent = Agent(model=ScriptedModel(script), tools=[charge], checkpointing=True)
        result = agent("charge me")
        result = agent([{"checkpointResume": {"checkpoint": result.checkpoint.to_dict()}}])
        (work / "snapshot.json").write_text(agent.take_snapshot().to_json())
        (work / "checkpoint.json").write_text(json.dumps(result.checkpoint.to_dict()))
    else:
        agent = Agent(model=ScriptedModel(script[1:]), tools=[charge], checkpointing=True)
        agent.load_snapshot(Snapshot.from_json((work / "snapshot.json").read_text()))
        checkpoint = json.loads((work / "checkpoint.json").read_text())
        result = agent([{"checkpointResume": {"checkpoint": checkpoint}}])
        print(result.stop_reason, str(result))
    """
)


def test_after_tools_checkpoint_resumes_in_a_new_process(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    first = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "first"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "checkpoint.json").read_text())["position"] == "after_tools"
    second = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "second"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "end_turn Charged $30."
    assert (tmp_path / "charges.log").read_text().splitlines() == ["30"]
