"""SIGKILL a graph and a swarm after each node in turn: the resumed run misses and repeats nothing.

The child (``tests/multiagent_writer.py``) kills itself right after the k-th save of
its run returned, i.e. once node k's record is durable; each node appends its name to
a counter file when it runs. A second child, the same program, resumes the run. Over
both processes every node must have run exactly once, the result must list them all,
and the node agents must hold one turn each (not a replayed one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent.parent
WRITER = TESTS / "multiagent_writer.py"

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")


def run(
    tmp_path: Path, kind: str, backend: str, kill_after: int
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    return subprocess.run(
        [
            sys.executable,
            str(WRITER),
            kind,
            backend,
            str(tmp_path / "store"),
            str(tmp_path / "counter"),
            str(kill_after),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def crash_and_resume(tmp_path: Path, kind: str, backend: str, kill_after: int) -> dict[str, Any]:
    killed = run(tmp_path, kind, backend, kill_after)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == ""  # it died before finishing
    ran_before = Counter((tmp_path / "counter").read_text().split())
    if kind != "graph-parallel":
        assert sum(ran_before.values()) == kill_after  # the k nodes saved, and no other yet
    resumed = run(tmp_path, kind, backend, 0)
    assert resumed.returncode == 0, resumed.stderr
    out: dict[str, Any] = json.loads(resumed.stdout)
    out["ran"] = Counter((tmp_path / "counter").read_text().split())
    return out


@pytest.mark.parametrize("backend", ["snapshot", "session"])
@pytest.mark.parametrize("kill_after", [1, 2, 3, 4, 5])
def test_a_graph_killed_after_each_node_resumes_running_every_node_once(
    tmp_path: Path, backend: str, kill_after: int
) -> None:
    out = crash_and_resume(tmp_path, "graph", backend, kill_after)
    assert out["status"] == "completed"
    assert out["ran"] == Counter({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1})
    assert out["order"] == ["a", "b", "c", "d", "e"]  # the join d waited for b and c
    assert out["results"]["d"] == "d-says"
    assert out["results"]["e"] == "e(d)"
    assert "skipped" not in out["results"]
    # The agent node holds its one turn, restored (or run) exactly once.
    assert [m["role"] for m in out["d_messages"]] == ["user", "assistant"]
    assert "[b]\nb(a)" in out["d_messages"][0]["content"][0]["text"]


@pytest.mark.parametrize("backend", ["snapshot", "session"])
@pytest.mark.parametrize("kill_after", [1, 2])
def test_a_swarm_killed_mid_way_resumes_with_the_right_agent_and_context(
    tmp_path: Path, backend: str, kill_after: int
) -> None:
    out = crash_and_resume(tmp_path, "swarm", backend, kill_after)
    assert out["status"] == "completed"
    assert out["ran"] == Counter({"a": 1, "b": 1, "c": 1})
    assert out["order"] == ["a", "b", "c"]
    assert out["results"]["c"] == "the final report"
    assert out["context"] == {"budget": 100}
    prompt = out["c_prompt"]["content"][0]["text"]
    assert "b handed this task to you (c): write it up" in prompt
    assert '"budget": 100' in prompt
    # Each agent's history is its one turn: a and b handed off (prompt, toolUse,
    # toolResult), c answered (prompt, answer); nothing was run twice.
    assert out["messages"] == {"a": 3, "b": 3, "c": 2}


@pytest.mark.parametrize("kill_after", [1, 2, 3])
def test_a_parallel_graph_killed_mid_way_runs_every_node_at_least_once(
    tmp_path: Path, kill_after: int
) -> None:
    out = crash_and_resume(tmp_path, "graph-parallel", "snapshot", kill_after)
    assert out["status"] == "completed"
    assert sorted(out["order"]) == ["a", "b", "c", "d", "e"]
    ran = out["ran"]
    # Saved nodes never run again; b and c ran together, so one in flight at the kill
    # may have run twice (at least once, SPEC 8.1). a, d and e never run beside another.
    assert ran["a"] == ran["d"] == ran["e"] == 1
    assert 1 <= ran["b"] <= 2
    assert 1 <= ran["c"] <= 2
    assert ran["b"] + ran["c"] <= 3
    assert out["order"][0] == "a"
    assert out["order"][3:] == ["d", "e"]
