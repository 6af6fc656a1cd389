"""Crash and resume across processes: a worker is SIGKILLed mid-task, a new one finishes.

An order goes through three tools (reserve stock, charge the card, ship). The agent
runs with ``checkpointing=True`` on a stored session: the loop pauses after the model
asks for a tool and after the tool ran, and at every pause the worker stores the
checkpoint in the agent's state and saves the session. The parent process kills the
first worker with SIGKILL while the card charge is requested but not yet run, then
starts a fresh worker, which resumes from the stored session and the last checkpoint.
A durable log of tool runs shows that every tool ran exactly once.

Run (a scripted model: no key, no network)::

    python examples/crash_and_resume.py --data-dir ./orders
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from perdure import Agent, tool
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session

SESSION_ID = "order-42"
STEPS = ("reserve_stock", "charge_card", "ship_order")
KILL_AT_PAUSE = 3
"""Pauses: 1 reserve asked, 2 reserve ran, 3 charge asked — the worker dies there."""
RUN_LOG = "tool-runs.log"


def _call(index: int) -> dict:
    use = {"toolUseId": f"t{index}", "name": STEPS[index], "input": {"order_id": "42"}}
    return {"role": "assistant", "content": [{"toolUse": use}]}


SCRIPT: list = [_call(0), _call(1), _call(2), "Order 42 is reserved, paid and shipped."]


def _record(data_dir: Path, name: str) -> str:
    """Log a completed tool run durably: the proof that nothing runs twice."""
    with open(data_dir / RUN_LOG, "a", encoding="utf-8") as log:
        log.write(name + "\n")
        log.flush()
        os.fsync(log.fileno())
    return f"{name}: done"


def _tools(data_dir: Path) -> list:
    @tool
    def reserve_stock(order_id: str) -> str:
        """Reserve the order's items.

        Args:
            order_id: the order.
        """
        return _record(data_dir, "reserve_stock")

    @tool
    def charge_card(order_id: str) -> str:
        """Charge the customer's card for the order.

        Args:
            order_id: the order.
        """
        return _record(data_dir, "charge_card")

    @tool
    def ship_order(order_id: str) -> str:
        """Hand the order to the carrier.

        Args:
            order_id: the order.
        """
        return _record(data_dir, "ship_order")

    return [reserve_stock, charge_card, ship_order]


def worker(data_dir: Path) -> int:
    """Run the order to its end, pausing at every checkpoint until stdin says ``go``."""
    session = Session(FileSessionStore(data_dir / "store"), SESSION_ID)
    agent = Agent(
        model=ScriptedModel([]), tools=_tools(data_dir), session_manager=session, checkpointing=True
    )
    answered = sum(1 for m in agent.messages if m["role"] == "assistant")
    agent.model = ScriptedModel(SCRIPT[answered:])
    saved = agent.state.get("run") or {}
    pauses = int(saved.get("pauses", 0))
    if saved.get("checkpoint"):
        print(f"resumed at pause {pauses} ({saved['checkpoint']['position']})", flush=True)
        prompt: object = [{"checkpointResume": {"checkpoint": saved["checkpoint"]}}]
    else:
        prompt = "Process order 42."
    while True:
        result = agent(prompt)
        if result.stop_reason != "checkpoint":
            break
        pauses += 1
        checkpoint = result.checkpoint.to_dict()
        agent.state.set("run", {"pauses": pauses, "checkpoint": checkpoint})
        asyncio.run(session.save())  # the pause point is durable before we say so
        print(f"pause {pauses} {checkpoint['position']}", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 0
        prompt = [{"checkpointResume": {"checkpoint": checkpoint}}]
    print(f"agent: {result}", flush=True)
    return 0


def _start(data_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--data-dir", str(data_dir), "worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("crash-resume-data"))
    parser.add_argument("role", nargs="?", choices=["worker"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.role == "worker":
        return worker(args.data_dir)

    first = _start(args.data_dir)
    assert first.stdin is not None
    assert first.stdout is not None
    for line in first.stdout:
        print(f"worker 1: {line.rstrip()}")
        if line.startswith(f"pause {KILL_AT_PAUSE} "):
            first.send_signal(signal.SIGKILL)
            break
        first.stdin.write("go\n")
        first.stdin.flush()
    first.wait()
    print(f"killed worker 1 (pid {first.pid}) with SIGKILL: exit {first.returncode}")

    second = _start(args.data_dir)
    out, _ = second.communicate("go\n" * 20, timeout=120)
    for line in out.splitlines():
        print(f"worker 2: {line}")

    runs = Counter((args.data_dir / RUN_LOG).read_text(encoding="utf-8").split())
    print("tool runs: " + ", ".join(f"{name} x{runs[name]}" for name in STEPS))
    if second.returncode != 0 or any(runs[name] != 1 for name in STEPS):
        print("FAILED: a tool ran twice or never", file=sys.stderr)
        return 1
    print("every tool ran exactly once across the crash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
