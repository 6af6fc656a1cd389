"""Node agents kept in their orchestrator's run by a SnapshotSessionManager.

A node agent without a session manager of its own goes into the run as an ``agent``
record before its node's record (one append a node), is carried into the next run,
and is saved as its own ``latest`` once it has grown past ``CARRY_MAX`` messages.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, MemoryStorage, NullConversationManager
from perdure.errors import SessionCorruptedError
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder, Swarm
from perdure.multiagent.persist import CARRY_MAX
from perdure.multiagent.run import agent_records, fold_agent, replay
from perdure.session import SnapshotSessionManager

IMAGE = {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n\x00\xff"}}}


def writer_graph(storage: MemoryStorage, answers: list[Any], **manager: Any) -> tuple[Any, Agent]:
    # The whole history kept (the default manager would trim it past 40 messages).
    writer = Agent(
        ScriptedModel(answers), agent_id="writer", conversation_manager=NullConversationManager()
    )
    b = GraphBuilder()
    b.add_node(lambda task, up: f"notes on {task}", "notes")
    b.add_node(writer, "write")
    b.add_edge("notes", "write")
    graph = b.build(session_manager=SnapshotSessionManager("s", storage=storage, **manager))
    return graph, writer


async def stored_run(storage: MemoryStorage) -> list[dict[str, Any]]:
    run = await SnapshotSessionManager("s", storage=storage).restore_multi_agent("graph")
    assert run is not None
    return run


def texts(agent: Agent) -> list[str]:
    return [m["content"][0].get("text", "") for m in agent.messages]


async def test_each_run_carries_the_agent_on_and_a_long_history_moves_to_its_own_latest() -> None:
    storage = MemoryStorage()
    moved_at = CARRY_MAX // 2 + 1  # two messages a turn: the first run past CARRY_MAX
    turns = moved_at + 2
    for turn in range(turns):
        graph, writer = writer_graph(storage, [f"draft {turn}"])
        result = await graph.invoke_async(f"task {turn}")
        assert result.status == "completed"
        assert len(writer.messages) == 2 * (turn + 1)  # restored, then one more turn
        run = await stored_run(storage)
        kinds = [r["t"] for r in run]
        agents = [(r["from"], len(r["messages"])) for r in run if r["t"] == "agent"]
        if turn == 0:
            assert kinds == ["start", "node", "agent", "node", "end"]
            assert agents == [(0, 2)]
        elif turn < moved_at:
            # Carried whole (it has no latest of its own yet), then this node's turn.
            assert kinds == ["start", "agent", "node", "agent", "node", "end"]
            assert agents == [(0, 2 * turn), (2 * turn, 2)]
        elif turn == moved_at:
            # Saved as its own latest when this run began: the run holds its new turn.
            assert kinds == ["start", "node", "agent", "node", "end"]
            assert agents == [(2 * turn, 2)]
        else:
            # Carried: what it has beyond its own latest.
            assert agents == [(2 * moved_at, 2 * (turn - moved_at)), (2 * turn, 2)]
    assert await storage.list("sessions/s/agents/writer/")  # it moved once
    graph, writer = writer_graph(storage, ["last"])
    await graph.invoke_async("last task")
    assert texts(writer)[-1] == "last"
    assert len(writer.messages) == 2 * turns + 2
    assert [t for t in texts(writer) if t.startswith("draft")] == [
        f"draft {turn}" for turn in range(turns)
    ]


async def test_records_fold_again_over_a_latest_that_already_holds_them() -> None:
    # A new run saves an agent as its own latest before its start replaces the old
    # run; killed in between, the old run's records fold over that latest again.
    storage = MemoryStorage()
    graph, writer = writer_graph(storage, ["drafted"])
    await graph.invoke_async("draft it")
    await SnapshotSessionManager("s", storage=storage).save_snapshot(writer, is_latest=True)
    graph, restored = writer_graph(storage, ["again"])
    await graph.invoke_async("again")
    answers = [m["content"][0]["text"] for m in restored.messages if m["role"] == "assistant"]
    assert answers == ["drafted", "again"]
    assert len(restored.messages) == 4


async def test_a_history_changed_other_than_by_appending_is_kept_whole() -> None:
    storage = MemoryStorage()
    graph, writer = writer_graph(storage, ["one", "two"])
    await graph.invoke_async("first")
    writer.messages = writer.messages[1:]  # trimmed, as a conversation manager may
    await graph.invoke_async("second")
    run = await stored_run(storage)
    # The new run carries it whole (from 0), then its node's record goes on from it.
    assert [(r["from"], len(r["messages"])) for r in run if r["t"] == "agent"] == [(0, 1), (1, 2)]
    folded, fields = fold_agent(agent_records(run)["writer"], "writer", [], "graph")
    assert fields is not None
    assert [m["content"][0]["text"] for m in folded] == texts(writer)
    graph, restored = writer_graph(storage, ["three"])
    await graph.invoke_async("third")
    assert texts(restored)[:-2] == texts(writer)


async def test_bytes_and_state_survive_the_run() -> None:
    storage = MemoryStorage()
    graph, writer = writer_graph(storage, ["seen"])
    writer.state.set("mood", "calm")
    writer.messages.append({"role": "user", "content": [{"text": "look"}, IMAGE]})
    writer.messages.append({"role": "assistant", "content": [{"text": "a png"}]})
    await graph.invoke_async("describe it")
    graph, restored = writer_graph(storage, ["again"])
    await graph.invoke_async("and again")
    assert restored.state.get("mood") == "calm"
    assert restored.messages[0]["content"][1] == IMAGE
    assert texts(restored)[-1] == "again"


async def test_an_agents_fields_are_captured_again_only_once_they_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage = MemoryStorage()
    graph, writer = writer_graph(storage, ["one", "two", "three", "four"])
    captured: list[str] = []
    take_snapshot = Agent.take_snapshot

    def counted(self: Agent, *args: Any, **kwargs: Any) -> Any:
        captured.append(self.agent_id)
        return take_snapshot(self, *args, **kwargs)

    monkeypatch.setattr(Agent, "take_snapshot", counted)
    writer.state.set("mood", "calm")
    await graph.invoke_async("a")
    before = captured.count("writer")
    await graph.invoke_async("b")  # only its messages changed: its fields are reused
    assert captured.count("writer") == before
    writer.state.set("mood", "bold")
    await graph.invoke_async("c")  # its state changed: captured again
    assert captured.count("writer") == before + 1
    graph, restored = writer_graph(storage, ["five"])
    await graph.invoke_async("d")
    assert restored.state.get("mood") == "bold"
    assert [text.split("\n")[0] for text in texts(restored)[-6:]] == [
        "b",
        "two",
        "c",
        "three",
        "d",
        "five",
    ]


async def test_the_managers_filters_see_node_agents_as_messages_and_state() -> None:
    from perdure.hygiene import PIIRedactor

    storage = MemoryStorage()
    graph, writer = writer_graph(storage, ["mail ana@example.com"], filters=[PIIRedactor()])
    writer.state.set("contact", "bo@example.com")
    await graph.invoke_async("write to ana")
    assert texts(writer)[-1] == "mail ana@example.com"  # the agent keeps the original
    blobs = [await storage.read(key) for key in await storage.list("")]
    assert not any(b"ana@example.com" in (blob or b"") for blob in blobs)
    assert not any(b"bo@example.com" in (blob or b"") for blob in blobs)
    graph, restored = writer_graph(storage, ["ok"], filters=[PIIRedactor()])
    await graph.invoke_async("next")
    assert "mail [email]" in texts(restored)
    assert restored.state.get("contact") == "[email]"


async def test_with_invocation_saves_the_agents_go_after_the_end() -> None:
    storage = MemoryStorage()
    graph, _ = writer_graph(storage, ["drafted"], multi_agent_save_latest_on="invocation")
    await graph.invoke_async("draft it")
    run = await stored_run(storage)
    assert [r["t"] for r in run] == ["start", "node", "node", "end", "agent"]
    assert replay(run, "graph").status == "completed"
    graph, restored = writer_graph(storage, ["again"], multi_agent_save_latest_on="invocation")
    await graph.invoke_async("again")
    assert texts(restored)[1] == "drafted"


async def test_a_swarm_keeps_its_agents_in_its_run() -> None:
    storage = MemoryStorage()

    def build(answer: str) -> tuple[Swarm, Agent]:
        solo = Agent(ScriptedModel([answer]), name="solo", agent_id="solo")
        return Swarm([solo], session_manager=SnapshotSessionManager("s", storage=storage)), solo

    swarm, _ = build("first")
    await swarm.invoke_async("one")
    assert await storage.list("sessions/s/agents/") == []
    swarm, solo = build("second")
    await swarm.invoke_async("two")
    assert [t for t in texts(solo) if t in ("first", "second")] == ["first", "second"]


START = {
    "t": "start",
    "v": "perdure-orchestrator/1",
    "kind": "graph",
    "task": "t",
    "pending": ["a"],
    "shared": {},
}


@pytest.mark.parametrize(
    "record",
    [
        {"t": "agent", "agent": "w", "from": -1, "messages": [], "fields": {}},
        {"t": "agent", "agent": "w", "from": True, "messages": [], "fields": {}},
        {"t": "agent", "agent": "w", "from": 0, "messages": {}, "fields": {}},
        {"t": "agent", "agent": "w", "from": 0, "messages": [], "fields": []},
        {"t": "agent", "agent": 3, "from": 0, "messages": [], "fields": {}},
    ],
)
def test_a_malformed_agent_record_is_corruption(record: dict[str, Any]) -> None:
    with pytest.raises(SessionCorruptedError, match="record 1 is a malformed agent record"):
        replay([START, record], "graph")


def test_an_agent_record_past_the_end_of_its_history_is_corruption() -> None:
    run = [START, {"t": "agent", "agent": "w", "from": 5, "messages": [], "fields": {}}]
    assert replay(run, "graph").status == "running"  # the run itself is fine
    with pytest.raises(
        SessionCorruptedError, match=r"from message 5 of agent 'w', which has only 2"
    ):
        fold_agent(agent_records(run)["w"], "w", [{"role": "user"}, {"role": "assistant"}], "graph")
    bad_bytes = {"t": "agent", "agent": "w", "from": 0, "fields": {}}
    bad_bytes["messages"] = [
        {"role": "user", "content": [{"__bytes_encoded__": True, "data": "not base64!"}]}
    ]
    with pytest.raises(SessionCorruptedError, match="malformed message of agent 'w'"):
        fold_agent(agent_records([START, bad_bytes])["w"], "w", [], "graph")


async def test_a_damaged_agent_state_raises_when_the_graph_restores_it() -> None:
    storage = MemoryStorage()
    graph, _ = writer_graph(storage, ["drafted"])
    await graph.invoke_async("draft it")
    run = await stored_run(storage)
    agent_at = next(i for i, r in enumerate(run) if r["t"] == "agent")
    run[agent_at] = {**run[agent_at], "fields": {**run[agent_at]["fields"], "scope": "planet"}}
    await SnapshotSessionManager("s", storage=storage).save_multi_agent("graph", run)
    graph, restored = writer_graph(storage, ["again"])
    with pytest.raises(SessionCorruptedError, match="state of agent 'writer' is damaged"):
        await graph.invoke_async("again")
    assert restored.messages == []


CARRY_WRITER = Path(__file__).parent.parent / "multiagent_carry_writer.py"


def carry_writer(store: Path, tasks: int, kill_at: int | str) -> subprocess.CompletedProcess[str]:
    tests = str(CARRY_WRITER.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path])}
    return subprocess.run(
        [sys.executable, str(CARRY_WRITER), str(store), str(tasks), str(kill_at)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_node_agents_killed_anywhere_across_many_runs_keep_each_turn_once(tmp_path: Path) -> None:
    # A graph of two agent nodes invoked for t0..t11 (CARRY_MAX 4: agents are carried
    # and moved into their own latest every few runs), its process SIGKILLed before or
    # after a storage write chosen at random, again and again until it finishes. Each
    # agent must hold every task's turn exactly once, in order: nothing lost (a node
    # whose record was saved never runs again) and nothing doubled (records folded
    # again over a latest that holds them).
    tasks, rng, kills = 12, random.Random(24), 0
    store = tmp_path / "store"
    while True:
        kill_at = rng.choice([-1, 1]) * rng.randint(1, 6)
        child = carry_writer(store, tasks, kill_at)
        if child.returncode == 0:
            assert child.stdout.strip() == "done"
            break
        assert child.returncode == -signal.SIGKILL, child.stderr
        kills += 1
        assert kills < 200, "the writer never finished"
    assert kills >= 10  # it was killed at many points, not once
    for name in ("w1", "w2"):  # and the agents moved into latests of their own
        assert (store / "sessions" / "run" / "agents" / name / "latest.blob").exists()
    checked = carry_writer(store, tasks, "check")
    assert checked.returncode == 0, checked.stderr
    histories = json.loads(checked.stdout)
    for name in ("w1", "w2"):
        history = histories[name]
        prompts = [text.split("\n")[0] for text in history[::2]]
        assert prompts == [f"t{k}" for k in range(tasks)] + ["check"], name
        assert history[1::2] == [f"ans:{p}" for p in prompts], name


async def test_an_agent_left_out_of_the_graph_for_a_run_comes_back_whole() -> None:
    storage = MemoryStorage()
    graph, _ = writer_graph(storage, ["drafted"])
    await graph.invoke_async("draft it")
    # A run of a graph without the writer: its records are carried as they are.
    b = GraphBuilder()
    b.add_node(lambda task, up: "no writer today", "notes")
    await b.build(session_manager=SnapshotSessionManager("s", storage=storage)).invoke_async("x")
    graph, writer = writer_graph(storage, ["again"])
    await graph.invoke_async("again")
    answers = [m["content"][0]["text"] for m in writer.messages if m["role"] == "assistant"]
    assert answers == ["drafted", "again"]
