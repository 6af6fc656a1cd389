"""The graph part of ``perdure demo``: a three-node graph killed between two nodes, resumed.

``plan`` (a function) → ``draft`` (a function) → ``review`` (a perdure Agent on a
scripted model) runs in a worker process with a ``SnapshotSessionManager`` on local
files, saving the run after every node. The first worker is killed with SIGKILL
once ``plan`` is saved and before ``draft`` starts; a second worker, built afresh,
resumes at ``draft``. A log of node runs shows that each node ran exactly once.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

from perdure._runtime.fs import append_all
from perdure.agent import Agent
from perdure.cli.style import Style
from perdure.models import ScriptedModel
from perdure.multiagent import Graph, GraphBuilder
from perdure.multiagent.run import replay
from perdure.session import SnapshotSessionManager
from perdure.storage import LocalFileStorage

__all__ = ["NODES", "run_graph_demo"]

NODES = ("plan", "draft", "review")
GRAPH_ID = "report"
TASK = "a one-line status report"


def _log(data_dir: Path, node: str) -> None:
    fd = os.open(data_dir / "node-runs.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        append_all(fd, f"{node}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    print(f"· {node} ran", flush=True)


def build_graph(data_dir: Path, *, pause_before_draft: bool) -> Graph:
    """The demo's graph, persisted under ``data_dir / "store"``."""

    def plan(task: str, upstream: dict[str, str]) -> str:
        _log(data_dir, "plan")
        return "outline: done, doing, next"

    def draft(task: str, upstream: dict[str, str]) -> str:
        if pause_before_draft:
            # plan's record is saved before draft starts: the parent kills us here.
            print("BETWEEN plan draft", flush=True)
            sys.stdin.readline()
        _log(data_dir, "draft")
        return f"draft from ({upstream['plan']})"

    def review(messages: object) -> str:
        _log(data_dir, "review")
        return "approved: shipped the parser, writing tests, docs next"

    reviewer = Agent(ScriptedModel([review]), agent_id="reviewer")
    manager = SnapshotSessionManager("demo", storage=LocalFileStorage(data_dir / "store"))
    b = GraphBuilder()
    b.add_node(plan, "plan")
    b.add_node(draft, "draft")
    b.add_node(reviewer, "review")
    b.add_edge("plan", "draft")
    b.add_edge("draft", "review")
    return b.build(session_manager=manager, graph_id=GRAPH_ID)


async def run_worker(data_dir: Path, *, pause: bool) -> None:
    """One worker: say where the stored run stands, then run (or resume) the graph."""
    manager = SnapshotSessionManager("demo", storage=LocalFileStorage(data_dir / "store"))
    records = await manager.restore_multi_agent(GRAPH_ID)
    if records:
        state = replay(records, GRAPH_ID)
        print(f"▶ resumed: done {state.order}, next {state.pending}", flush=True)
    graph = build_graph(data_dir, pause_before_draft=pause)
    result = await graph.invoke_async(TASK)
    print(f"✔ {result.status}: {' → '.join(result.execution_order)} — {result}", flush=True)


def _worker(data_dir: Path, pause: bool) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "perdure.cli.demo_graph", str(data_dir)]
    return subprocess.Popen(
        [*argv, "--pause"] if pause else argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _relay(worker: subprocess.Popen[str], out: TextIO, s: Style, label: str) -> bool:
    """Copy the worker's output; SIGKILL it between plan and draft. True if killed."""
    assert worker.stdout is not None
    assert worker.stdin is not None
    with worker.stdout, worker.stdin:
        for line in worker.stdout:
            if line.startswith("BETWEEN "):
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                return True
            out.write(s(f"{label} {s.bar} ", "dim") + line)
    worker.wait()
    return False


async def run_graph_demo(out: TextIO, style: Style, data_dir: Path) -> Counter[str]:
    """Run the graph demo (see the module docstring); return how often each node ran."""
    s = style
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    out.write("\n" + s("perdure demo — a graph killed between two nodes", "bold") + "\n")
    out.write(s("  plan → draft → review(agent), saved after every node", "dim") + "\n")
    first = _worker(data_dir, pause=True)
    if not await asyncio.to_thread(_relay, first, out, s, "worker 1"):
        raise RuntimeError(f"the graph worker ended before draft (exit {first.returncode})")
    out.write(s(f"💥 killed worker 1 (pid {first.pid}) between plan and draft", "red") + "\n")
    second = _worker(data_dir, pause=False)
    await asyncio.to_thread(_relay, second, out, s, "worker 2")
    if second.returncode != 0:
        raise RuntimeError(f"the second graph worker failed (exit {second.returncode})")
    runs = Counter((data_dir / "node-runs.log").read_text().split())
    marks = [
        (s("✔", "green") if runs[n] == 1 else s("✘", "red")) + f" {n} {runs[n]}×" for n in NODES
    ]
    out.write("  node runs across both processes: " + ", ".join(marks) + "\n")
    store = shlex.quote(f"file:{data_dir / 'store'}")
    out.write(
        s(
            f"  where the run stands: perdure snapshots runs demo {GRAPH_ID} --storage {store}",
            "dim",
        )
        + "\n"
    )
    out.flush()
    return runs


if __name__ == "__main__":
    asyncio.run(run_worker(Path(sys.argv[1]), pause="--pause" in sys.argv[2:]))
