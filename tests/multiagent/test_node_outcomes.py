"""What a node's outcome leaves in the run: completed, failed, killed, paused, or refused.

* Only completed nodes' changes reach the shared state, with ``parallel=True`` too: a
  node that raises or is SIGKILLed in flight leaves nothing its retry would apply
  twice, and two parallel nodes changing one key is refused, not a lost update.
* A node agent that pauses (an interrupt, a checkpoint) has not completed: the
  invocation is ``"interrupted"``, nothing downstream runs, and calling again (with
  the answers) goes on with that agent, in another process too.
* A hand-off past ``max_handoffs`` is refused, and said to be, not reported as made.

Run as ``python test_node_outcomes.py killed-parallel DIR kill|resume`` it is the child
process of the SIGKILL test (see :func:`killed_parallel_child`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, tool
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder, Swarm
from perdure.multiagent.run import replay
from perdure.session import FileSessionStore, Session, SnapshotSessionManager
from perdure.storage import LocalFileStorage
from perdure.tools import ToolContext
from perdure.types import Message

HERE = Path(__file__)
TESTS = HERE.parent.parent

RAN: list[str] = []  # the tools' calls, in order


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@tool
def approve(amount: int, context: ToolContext) -> str:
    """Ask a human to approve a payment."""
    answer = context.interrupt("approval", f"pay {amount}?")
    RAN.append(f"approve:{answer}")
    return f"approved: {answer}"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    RAN.append(f"lookup:{key}")
    return f"value of {key}"


def call(name: str, **given: Any) -> Message:
    return {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": f"t-{name}", "name": name, "input": given}}],
    }


def manager(root: Path) -> SnapshotSessionManager:
    return SnapshotSessionManager("run", storage=LocalFileStorage(str(root)))


def fan_out(b_node: Any, c_node: Any, seen_by_d: list[dict[str, Any]]) -> GraphBuilder:
    """``a -> {b, c} -> d``; d records the shared state it is given."""

    def a(task: str, upstream: dict[str, str]) -> str:
        return "A"

    def d(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        seen_by_d.append(dict(state))
        return "D"

    g = GraphBuilder()
    for name, fn in (("a", a), ("b", b_node), ("c", c_node), ("d", d)):
        g.add_node(fn, name)
    g.add_edge("a", "b")
    g.add_edge("a", "c")
    g.add_edge("b", "d")
    g.add_edge("c", "d")
    return g


# --------------------------------------------------------- shared state, parallel=True


async def test_a_parallel_node_that_fails_leaves_no_change_in_the_saved_or_returned_state(
    tmp_path: Path,
) -> None:
    attempts: list[int] = []

    async def b(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        attempts.append(1)
        state["b_count"] = state.get("b_count", 0) + 1
        await asyncio.sleep(0.05)  # c completes, and is saved, while b's change is made
        if len(attempts) == 1:
            raise RuntimeError("b's transient failure")
        return "B"

    async def c(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        await asyncio.sleep(0.01)
        state["c"] = "done"
        return "C"

    seen: list[dict[str, Any]] = []
    build = fan_out(b, c, seen)
    first = await build.build(session_manager=manager(tmp_path), parallel=True).invoke_async("t")
    assert first.status == "failed"
    assert first.error == "node 'b' failed: RuntimeError: b's transient failure"
    assert first.execution_order == ["a", "c"]
    assert first.shared == {"c": "done"}  # b failed: none of its change
    # A rebuilt graph (as a new process would) retries b on the state the run saved.
    second = await build.build(session_manager=manager(tmp_path), parallel=True).invoke_async("t")
    assert second.status == "completed"
    assert second.execution_order == ["a", "c", "b", "d"]
    assert second.shared == {"b_count": 1, "c": "done"}  # b completed once: counted once
    assert seen == [{"b_count": 1, "c": "done"}]


def killed_parallel_child(where: str, mode: str) -> None:
    """``a -> {b, c} -> d`` with ``parallel=True``: b changes the shared state, then waits
    for c's record to be durable; in ``kill`` mode the process SIGKILLs itself then,
    b still in flight. Prints the result as JSON (``resume`` mode)."""
    c_saved = asyncio.Event()

    class Storage(LocalFileStorage):
        saves = 0

        def saved(self, key: str) -> None:
            if key.endswith("multi_agents/graph/latest"):
                Storage.saves += 1
                if Storage.saves == 2:  # a's record, then c's
                    c_saved.set()

        async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
            await super().append(key, data, size=size, tail=tail)
            self.saved(key)

        async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
            await super().replace(key, data, size=size, tail=tail)
            self.saved(key)

    async def b(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        state["b_count"] = state.get("b_count", 0) + 1
        if mode == "kill":
            await c_saved.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return "B"

    def c(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        state["c"] = "done"
        return "C"

    seen: list[dict[str, Any]] = []
    sm = SnapshotSessionManager("run", storage=Storage(where))
    result = fan_out(b, c, seen).build(session_manager=sm, parallel=True)("t")
    out = {"status": result.status, "order": result.execution_order, "shared": result.shared}
    print(json.dumps({**out, "seen_by_d": seen}), flush=True)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_a_parallel_node_killed_in_flight_leaves_no_change_its_rerun_would_repeat(
    tmp_path: Path,
) -> None:
    def child(mode: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
        return subprocess.run(
            [sys.executable, str(HERE), "killed-parallel", str(tmp_path / "store"), mode],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

    killed = child("kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == ""
    resumed = child("resume")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "completed"
    assert out["order"] == ["a", "c", "b", "d"]  # c was saved before the kill, b was not
    assert out["shared"] == {"b_count": 1, "c": "done"}
    assert out["seen_by_d"] == [{"b_count": 1, "c": "done"}]


async def test_two_parallel_nodes_changing_one_key_is_refused_and_the_retry_keeps_both(
    tmp_path: Path,
) -> None:
    def counting(name: str, delay: float) -> Any:
        async def run(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
            state["n"] = state.get("n", 0) + 1
            await asyncio.sleep(delay)
            return name

        return run

    seen: list[dict[str, Any]] = []
    session = Session(FileSessionStore(str(tmp_path)), "run")
    graph = fan_out(counting("B", 0.01), counting("C", 0.1), seen).build(
        session_manager=session, parallel=True
    )
    first = await graph.invoke_async("t")
    assert first.status == "failed"
    assert first.error is not None
    assert "node 'c' changed the shared state's key 'n'" in first.error
    assert "node 'b'" in first.error
    assert "calling again runs it" in first.error
    assert first.execution_order == ["a", "b"]
    assert first.shared == {"n": 1}
    # c runs again on the state b left: both counted, as if one ran after the other.
    second = await graph.invoke_async("t")
    assert second.status == "completed"
    assert second.execution_order == ["a", "b", "c", "d"]
    assert second.shared == {"n": 2}
    assert seen == [{"n": 2}]


async def test_parallel_nodes_changes_to_other_keys_merge_deletions_included() -> None:
    def start(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        state.update(old=1, kept=2)
        return "A"

    async def b(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        del state["old"]
        state["b"] = "B"
        await asyncio.sleep(0.01)
        return "B"

    async def c(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        assert "b" not in state  # each node starts from the state as its batch began
        state["c"] = "C"
        await asyncio.sleep(0.05)
        return "C"

    seen: list[dict[str, Any]] = []
    g = fan_out(b, c, seen)
    g.add_node(start, "start")
    g.add_edge("start", "a")
    g.set_entry_point("start")
    result = await g.build(parallel=True).invoke_async("t")
    assert result.status == "completed", result.error
    assert result.shared == {"kept": 2, "b": "B", "c": "C"}
    assert seen == [result.shared]


# ------------------------------------------------------------------- paused node agents


def payer(agent_id: str, *responses: Any, checkpointing: bool = False) -> Agent:
    return Agent(
        ScriptedModel(list(responses)),
        tools=[approve, lookup],
        agent_id=agent_id,
        name=agent_id,
        checkpointing=checkpointing,
    )


def pay_then_after(agent: Agent, upstreams: list[dict[str, str]]) -> GraphBuilder:
    def after(task: str, upstream: dict[str, str]) -> str:
        upstreams.append(dict(upstream))
        return "after ran"

    b = GraphBuilder()
    b.add_node(agent, "pay")
    b.add_node(after, "after")
    b.add_edge("pay", "after")
    return b


async def test_a_node_agent_interrupted_is_not_completed_and_resumes_with_the_answer(
    tmp_path: Path,
) -> None:
    upstreams: list[dict[str, str]] = []
    agent = payer("payer", call("approve", amount=5))
    graph = pay_then_after(agent, upstreams).build(session_manager=manager(tmp_path))
    first = await graph.invoke_async("pay the bill")
    assert first.status == "interrupted"
    assert first.execution_order == []
    assert first.results == {}
    assert upstreams == []  # nothing downstream ran on an empty result
    assert first.paused["pay"].stop_reason == "interrupt"
    [asked] = first.interrupts
    assert (asked.name, asked.reason) == ("approval", "pay 5?")
    stored = await manager(tmp_path).restore_multi_agent("graph")
    assert stored is not None
    assert not [r for r in stored if r.get("t") == "node"]  # "pay" was not recorded

    # Another process: the agent comes back paused; the answer goes to it.
    agent2 = payer("payer", "paid")
    graph2 = pay_then_after(agent2, upstreams).build(session_manager=manager(tmp_path))
    answer = [{"interruptResponse": {"interruptId": asked.id, "response": "yes"}}]
    second = await graph2.invoke_async("pay the bill", responses=answer)
    assert second.status == "completed", second.error
    assert second.execution_order == ["pay", "after"]
    assert second.results["pay"] == "paid"
    assert upstreams == [{"pay": "paid"}]
    assert RAN == ["approve:yes"]  # the approval was run once, answered
    assert isinstance(agent2.model, ScriptedModel)
    assert len(agent2.model.requests) == 1  # the paused turn went on; no new prompt
    assert [m["role"] for m in agent2.messages] == ["user", "assistant", "user", "assistant"]


async def test_an_unanswered_interrupt_stays_pending_and_wrong_answers_are_refused(
    tmp_path: Path,
) -> None:
    upstreams: list[dict[str, str]] = []
    agent = payer("payer", call("approve", amount=5), "paid")
    graph = pay_then_after(agent, upstreams).build(session_manager=manager(tmp_path))
    first = await graph.invoke_async("pay the bill")
    assert first.status == "interrupted"
    again = await graph.invoke_async("pay the bill")  # no answer: the agent is not run
    assert again.status == "interrupted"
    assert [i.id for i in again.interrupts] == [i.id for i in first.interrupts]
    assert isinstance(agent.model, ScriptedModel)
    assert len(agent.model.requests) == 1
    assert upstreams == []
    wrong = [{"interruptResponse": {"interruptId": "nobody-asked", "response": "yes"}}]
    with pytest.raises(ValueError, match=r"interrupt ids \['nobody-asked'\].*approval"):
        await graph.invoke_async("pay the bill", responses=wrong)
    with pytest.raises(ValueError, match=r"responses\[0\] must be"):
        await graph.invoke_async("pay the bill", responses=[{"interruptId": "x"}])
    answer = [{"interruptResponse": {"interruptId": first.interrupts[0].id, "response": "ok"}}]
    done = graph("pay the bill", responses=answer)  # the sync face takes them too
    assert done.status == "completed"
    assert RAN == ["approve:ok"]


async def test_a_node_agent_at_a_checkpoint_is_not_completed_and_calling_again_goes_on(
    tmp_path: Path,
) -> None:
    upstreams: list[dict[str, str]] = []
    agent = payer("payer", call("lookup", key="k"), "looked up", checkpointing=True)
    graph = pay_then_after(agent, upstreams).build(session_manager=manager(tmp_path))
    first = await graph.invoke_async("pay the bill")
    assert first.status == "interrupted"
    assert first.execution_order == []
    checkpoint = first.paused["pay"].checkpoint
    assert checkpoint is not None
    assert checkpoint.position == "after_model"
    assert RAN == []
    # A rebuilt graph and agent (another process) go on from the saved history.
    agent2 = payer("payer", "looked up", checkpointing=True)
    graph2 = pay_then_after(agent2, upstreams).build(session_manager=manager(tmp_path))
    second = await graph2.invoke_async("pay the bill")
    assert second.status == "interrupted"
    checkpoint = second.paused["pay"].checkpoint
    assert checkpoint is not None
    assert checkpoint.position == "after_tools"
    assert RAN == ["lookup:k"]
    third = await graph2.invoke_async("pay the bill")
    assert third.status == "completed", third.error
    assert third.results["pay"] == "looked up"
    assert upstreams == [{"pay": "looked up"}]
    assert RAN == ["lookup:k"]  # the tool ran once over the three invocations


async def test_a_swarm_agent_interrupted_is_not_a_finished_turn_and_resumes_with_the_answer(
    tmp_path: Path,
) -> None:
    swarm = Swarm(
        [payer("payer", call("approve", amount=7)), payer("other", "x")],
        session_manager=manager(tmp_path),
    )
    first = await swarm.invoke_async("pay")
    assert first.status == "interrupted"
    assert first.node_history == []
    assert first.results == {}
    [asked] = first.interrupts
    assert first.paused["payer"].interrupts == [asked]
    again = Swarm([payer("payer", "paid"), payer("other", "x")], session_manager=manager(tmp_path))
    answer = [{"interruptResponse": {"interruptId": asked.id, "response": "fine"}}]
    second = await again.invoke_async("pay", responses=answer)
    assert second.status == "completed", second.error
    assert second.node_history == ["payer"]
    assert second.results == {"payer": "paid"}
    assert RAN == ["approve:fine"]


# ---------------------------------------------------------------- refused hand-offs


def handoff(to: str, uid: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {
                "toolUse": {
                    "toolUseId": uid,
                    "name": "handoff",
                    "input": {"agent": to, "message": "go"},
                }
            }
        ],
    }


def tool_answer(agent: Agent) -> tuple[str, str]:
    result = agent.messages[-1]["content"][0]["toolResult"]
    return result["status"], result["content"][0]["text"]


async def test_a_handoff_past_max_handoffs_is_refused_said_so_and_not_reported_made(
    tmp_path: Path,
) -> None:
    a = Agent(ScriptedModel([handoff("b", "h1")]), name="a", agent_id="a")
    b = Agent(ScriptedModel([handoff("a", "h2")]), name="b", agent_id="b")
    result = await Swarm([a, b], max_handoffs=1, session_manager=manager(tmp_path)).invoke_async(
        "task"
    )
    assert result.status == "failed"
    assert result.node_history == ["a", "b"]
    assert result.handoffs == [{"from": "a", "to": "b", "message": "go"}]
    assert result.error == "max_handoffs (1) reached: 'b' tried to hand off to 'a' after 1 hand-off"
    status, text = tool_answer(b)
    assert status == "error"
    assert text.startswith("Hand-off to a refused: this swarm allows 1 hand-off (max_handoffs)")
    assert "the swarm stops here" in text
    stored = await manager(tmp_path).restore_multi_agent("swarm")
    assert stored is not None
    assert replay(stored, "swarm").handoffs == result.handoffs  # the refused one not saved


async def test_max_handoffs_zero_refuses_the_first_handoff_and_says_no_handoff_is_allowed() -> None:
    a = Agent(ScriptedModel([handoff("b", "h1")]), name="a", agent_id="a")
    b = Agent(ScriptedModel(["B"]), name="b", agent_id="b")
    result = await Swarm([a, b], max_handoffs=0).invoke_async("task")
    assert result.status == "failed"
    assert result.node_history == ["a"]
    assert result.handoffs == []
    assert result.error == (
        "max_handoffs (0): 'a' tried to hand off to 'b', but this swarm allows no hand-off"
    )
    assert tool_answer(a) == (
        "error",
        "Hand-off to b refused: this swarm allows no hand-off (max_handoffs=0); the swarm "
        "stops here",
    )
    assert isinstance(b.model, ScriptedModel)
    assert b.model.requests == []


if __name__ == "__main__" and sys.argv[1:2] == ["killed-parallel"]:
    killed_parallel_child(sys.argv[2], sys.argv[3])
