"""Whose run a store holds, and what a Session keeps of it.

A run's start record names the orchestrator (kind and id): a graph never resumes or
overwrites a run that another graph, or a swarm, began in its session. A ``Session``
holds one run and keeps its node agents' histories in it, as a snapshot manager does;
a session that holds something else (an agent's chat) is refused as such, not as
damage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent
from perdure.errors import SessionCorruptedError, SessionMismatchError
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder, Swarm
from perdure.multiagent.run import replay
from perdure.session import FileSessionStore, Session, SnapshotSessionManager, SQLiteSessionStore
from perdure.storage import LocalFileStorage
from perdure.types import Message


def chain(graph_id: str, ran: list[str], *, fail_at: str | None = None, **build: Any) -> Any:
    """A graph a -> b -> c whose nodes answer ``<graph_id>:<node>``."""
    b = GraphBuilder()
    for name in "abc":

        def run(task: str, upstream: dict[str, str], name: str = name) -> str:
            ran.append(f"{graph_id}:{name}")
            if name == fail_at:
                raise RuntimeError(f"{name} is down")
            return f"{graph_id}:{name}"

        b.add_node(run, name)
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    return b.build(graph_id=graph_id, **build)


def stored_records(messages: list[Message]) -> list[dict[str, Any]]:
    return [json.loads(m["content"][0]["text"]) for m in messages]


def writer(agent_id: str, *answers: str) -> Agent:
    return Agent(ScriptedModel(list(answers)), agent_id=agent_id, name=agent_id)


def agent_then_failing(agent: Agent, fails: bool, **build: Any) -> Any:
    b = GraphBuilder()
    b.add_node(agent, "write")

    def check(task: str, upstream: dict[str, str]) -> str:
        if fails:
            raise RuntimeError("check is down")
        return "checked"

    b.add_node(check, "check")
    b.add_edge("write", "check")
    return b.build(**build)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SQLiteSessionStore]:
    store = SQLiteSessionStore(tmp_path / "sessions.db")
    yield store
    store.close()


# --- 1. a Session's run belongs to one graph_id / swarm_id


async def test_another_graph_id_is_refused_a_sessions_unfinished_run(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "store")
    ran: list[str] = []
    first = await chain("g1", ran, fail_at="c", session_manager=Session(store, "S")).invoke_async(
        "task"
    )
    assert first.status == "failed"
    before = (await store.get("S")).messages
    with pytest.raises(SessionMismatchError) as caught:
        await chain("g2", ran, session_manager=Session(store, "S")).invoke_async("task")
    assert caught.value.code == "session_mismatch"
    message = str(caught.value)
    assert "session 'S'" in message
    assert "unfinished run of graph 'g1'" in message
    assert "not of graph 'g2'" in message
    assert caught.value.details["found"] == {"kind": "graph", "id": "g1", "status": "running"}
    assert ran == ["g1:a", "g1:b", "g1:c"]  # g2 ran nothing
    assert (await store.get("S")).messages == before  # and wrote nothing
    # g1's run is still there for g1: it resumes at c, with its own results.
    again = await chain("g1", ran, session_manager=Session(store, "S")).invoke_async("task")
    assert again.status == "completed"
    assert again.results == {"a": "g1:a", "b": "g1:b", "c": "g1:c"}
    assert ran == ["g1:a", "g1:b", "g1:c", "g1:c"]


async def test_another_graph_id_does_not_overwrite_a_sessions_finished_run(
    sqlite_store: SQLiteSessionStore,
) -> None:
    ran: list[str] = []
    await chain("g1", ran, session_manager=Session(sqlite_store, "S")).invoke_async("task")
    before = (await sqlite_store.get("S")).messages
    with pytest.raises(
        SessionMismatchError, match="completed run of graph 'g1', not of graph 'g2'"
    ):
        await chain("g2", ran, session_manager=Session(sqlite_store, "S")).invoke_async("task")
    assert (await sqlite_store.get("S")).messages == before
    assert stored_records(before)[0]["id"] == "g1"


async def test_a_start_record_names_its_orchestrator(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "store")
    await chain("g1", [], session_manager=Session(store, "S")).invoke_async("task")
    first = stored_records((await store.get("S")).messages)[0]
    assert (first["kind"], first["id"]) == ("graph", "g1")
    manager = SnapshotSessionManager("S", storage=LocalFileStorage(tmp_path / "snap"))
    await chain("g1", [], session_manager=manager).invoke_async("task")
    records = await SnapshotSessionManager(
        "S", storage=LocalFileStorage(tmp_path / "snap")
    ).restore_multi_agent("g1")
    assert records is not None
    assert (records[0]["kind"], records[0]["id"]) == ("graph", "g1")
    assert replay(records, "g1").run_id == "g1"


def test_a_start_record_whose_id_is_not_a_string_is_damage() -> None:
    start = {"t": "start", "v": "perdure-orchestrator/1", "kind": "graph", "id": 7,
             "task": "t", "pending": ["a"], "shared": {}}  # fmt: skip
    with pytest.raises(SessionCorruptedError, match="record 0 has an orchestrator id"):
        replay([start], "g")


async def test_a_refused_run_changes_none_of_the_node_agents(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "store")
    kept = writer("w", "g1 draft")
    failing = agent_then_failing(kept, True, graph_id="g1", session_manager=Session(store, "S"))
    assert (await failing.invoke_async("task")).status == "failed"
    other = writer("w")
    mine: list[Message] = [{"role": "user", "content": [{"text": "my own history"}]}]
    other.messages = list(mine)
    graph = agent_then_failing(other, False, graph_id="g2", session_manager=Session(store, "S"))
    with pytest.raises(SessionMismatchError, match="run of graph 'g1', not of graph 'g2'"):
        await graph.invoke_async("task")
    assert other.messages == mine  # g1's record of agent "w" was not put into it


# --- 2. a swarm never takes a graph's run (nor a graph a swarm's)


def two_agents() -> list[Agent]:
    return [
        Agent(ScriptedModel(["swarm agent x here"]), name="x", agent_id="x"),
        Agent(ScriptedModel(["I am b, a swarm agent"]), name="b", agent_id="b"),
    ]


def failing_graph(**build: Any) -> Any:
    b = GraphBuilder()
    b.add_node(lambda task, up: "A", "a")
    b.add_node(lambda task, up: (_ for _ in ()).throw(RuntimeError("down")), "b")
    b.add_edge("a", "b")
    return b.build(**build)


@pytest.mark.parametrize("backend", ["session", "snapshot"])
async def test_a_swarm_does_not_resume_a_graphs_unfinished_run(
    tmp_path: Path, backend: str
) -> None:
    def manager() -> object:
        if backend == "session":
            return Session(FileSessionStore(tmp_path / "store"), "S")
        return SnapshotSessionManager("S", storage=LocalFileStorage(tmp_path / "snap"))

    result = await failing_graph(session_manager=manager(), graph_id="team").invoke_async("task")
    assert result.status == "failed"
    agents = two_agents()
    swarm = Swarm(agents, session_manager=manager(), swarm_id="team")
    with pytest.raises(SessionMismatchError) as caught:
        await swarm.invoke_async("task")
    assert "unfinished run of graph 'team', not of swarm 'team'" in str(caught.value)
    advice = "a Session of its own" if backend == "session" else "another swarm_id"
    assert advice in str(caught.value)
    assert all(not agent.messages for agent in agents)  # no agent ran


async def test_a_graph_with_default_ids_does_not_take_a_swarms_run_in_a_session(
    tmp_path: Path,
) -> None:
    store = FileSessionStore(tmp_path / "store")
    await Swarm(two_agents(), session_manager=Session(store, "S")).invoke_async("task")
    with pytest.raises(SessionMismatchError, match="completed run of swarm 'swarm', not of graph"):
        await failing_graph(session_manager=Session(store, "S")).invoke_async("task")


# --- 3. a Session keeps the node agents' histories


async def test_a_rebuilt_graph_on_a_session_resumes_with_its_agents_history(
    tmp_path: Path,
) -> None:
    store = FileSessionStore(tmp_path / "store")
    first = writer("w", "draft one")
    result = await agent_then_failing(
        first, True, session_manager=Session(store, "S")
    ).invoke_async("task")
    assert result.status == "failed"
    saved = list(first.messages)
    assert len(saved) == 2
    # The agent's record goes before the record of its node, in the run.
    kinds = [(r["t"], r.get("node")) for r in stored_records((await store.get("S")).messages)]
    assert kinds == [("start", None), ("agent", None), ("node", "write")]
    again = writer("w", "never called")
    resumed = agent_then_failing(again, False, session_manager=Session(store, "S"))
    result = await resumed.invoke_async("task")
    assert result.status == "completed"
    assert result.results == {"write": "draft one", "check": "checked"}
    assert again.messages == saved  # restored, and its node not run again
    assert isinstance(again.model, ScriptedModel)
    assert again.model.requests == []


async def test_a_new_run_on_a_session_carries_the_agents_history(
    sqlite_store: SQLiteSessionStore,
) -> None:
    agent = writer("w", "draft one")
    graph = agent_then_failing(agent, False, session_manager=Session(sqlite_store, "S"))
    await graph.invoke_async("first task")
    rebuilt = writer("w", "draft two")
    graph = agent_then_failing(rebuilt, False, session_manager=Session(sqlite_store, "S"))
    result = await graph.invoke_async("second task")
    assert result.results["write"] == "draft two"
    texts = [block["text"] for m in rebuilt.messages for block in m["content"]]
    assert texts[:2] == ["first task", "draft one"]  # the first run's turn, restored
    assert "draft two" in texts
    # And a third graph starts from both turns (the second run carried the first's).
    third = writer("w", "draft three")
    graph = agent_then_failing(third, False, session_manager=Session(sqlite_store, "S"))
    await graph.invoke_async("third task")
    assert third.messages[: len(rebuilt.messages)] == rebuilt.messages
    assert len(third.messages) == len(rebuilt.messages) + 2


async def test_a_sessions_filters_see_the_node_agents_messages(tmp_path: Path) -> None:
    from perdure.hygiene import PIIRedactor

    store = FileSessionStore(tmp_path / "store")
    agent = writer("w", "mail ana@example.com")
    session = Session(store, "S", filters=[PIIRedactor()])
    await agent_then_failing(agent, False, session_manager=session).invoke_async("task")
    records = stored_records((await store.get("S")).messages)
    kept = [r for r in records if r["t"] == "agent"]
    assert kept
    assert kept[0]["messages"][-1]["content"][0]["text"] == "mail [email]"
    assert not any("ana@example.com" in json.dumps(r) for r in records)


def test_node_agents_sharing_an_agent_id_are_refused_with_a_session(tmp_path: Path) -> None:
    b = GraphBuilder()
    b.add_node(Agent(ScriptedModel(["one"])), "a")
    b.add_node(Agent(ScriptedModel(["two"])), "b")
    b.add_edge("a", "b")
    with pytest.raises(ValueError, match="agent_id 'default': with a Session"):
        b.build(session_manager=Session(FileSessionStore(tmp_path / "store"), "S"))


CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from perdure import Agent
    from perdure.models import ScriptedModel
    from perdure.multiagent import Swarm
    from perdure.session import FileSessionStore, Session

    where = sys.argv[1]

    def hand_off(messages):
        return {"role": "assistant", "content": [
            {"text": "over to billing"},
            {"toolUse": {"toolUseId": "h1", "name": "handoff",
                         "input": {"agent": "billing", "message": "refund 42"}}}]}

    def refund(messages):
        if not os.path.exists(os.path.join(where, "killed")):
            open(os.path.join(where, "killed"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # in billing's turn, triage's saved
        return "Refunded."

    triage = Agent(ScriptedModel([hand_off]), name="triage", agent_id="triage")
    billing = Agent(ScriptedModel([refund]), name="billing", agent_id="billing")
    session = Session(FileSessionStore(os.path.join(where, "store")), "ticket-9")
    result = Swarm([triage, billing], session_manager=session)("my order arrived broken")
    print(json.dumps({
        "status": result.status,
        "history": result.node_history,
        "triage": triage.messages,
        "triage_calls": len(triage.model.requests),
    }))
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_a_swarm_on_a_session_killed_mid_turn_resumes_with_its_agents_histories(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def child() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

    killed = child()
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = child()
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["status"] == "completed"
    assert out["history"] == ["triage", "billing"]
    # triage's turn (task, hand-off, tool result) came back from the session; its
    # model was not called again.
    assert len(out["triage"]) == 3
    assert out["triage"][0]["content"][0]["text"] == "my order arrived broken"
    assert out["triage_calls"] == 0


# --- 4. a session that holds an agent's chat is not a damaged run


async def test_a_session_holding_a_chat_is_refused_as_no_run_not_as_damage(
    tmp_path: Path,
) -> None:
    store = FileSessionStore(tmp_path / "store")
    await Agent(
        ScriptedModel(["hello back"]), session_manager=Session(store, "chat-1")
    ).invoke_async("hello")
    chat = (await store.get("chat-1")).messages
    b = GraphBuilder()
    b.add_node(lambda task, up: "A", "a")
    with pytest.raises(SessionMismatchError) as caught:
        await b.build(session_manager=Session(store, "chat-1")).invoke_async("task")
    assert caught.value.code == "session_mismatch"
    assert "session 'chat-1' holds no graph or swarm run" in str(caught.value)
    assert (await store.get("chat-1")).messages == chat  # the chat is untouched


async def test_a_chat_without_agent_state_is_refused_by_its_first_message(
    sqlite_store: SQLiteSessionStore,
) -> None:
    await sqlite_store.create("chat-2")
    hello: Message = {"role": "user", "content": [{"text": "hello"}]}
    await sqlite_store.commit("chat-2", [hello])
    b = GraphBuilder()
    b.add_node(lambda task, up: "A", "a")
    with pytest.raises(SessionMismatchError, match="first message is not a run's start record"):
        await b.build(session_manager=Session(sqlite_store, "chat-2")).invoke_async("task")


async def test_a_damaged_record_after_the_start_is_still_corruption(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "store")
    await chain("g1", [], fail_at="c", session_manager=Session(store, "S")).invoke_async("task")
    messages = list((await store.get("S")).messages)
    messages.append({"role": "user", "content": [{"text": "{not json"}]})
    await store.commit("S", messages)
    with pytest.raises(SessionCorruptedError, match="message 3 is not a run record"):
        await chain("g1", [], session_manager=Session(store, "S")).invoke_async("task")
