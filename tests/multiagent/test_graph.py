"""Graph: scheduling, conditions, joins, limits, failures, and what is saved when."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from perdure import Agent, MemoryStorage
from perdure.errors import SessionCorruptedError, TurnRunningError
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder
from perdure.multiagent.run import LazyReach, reachable, ready_nodes, replay
from perdure.session import MemorySessionStore, Session, SnapshotSessionManager


def echo(name: str, ran: list[str]) -> Any:
    def run(task: str, upstream: dict[str, str]) -> str:
        ran.append(name)
        return f"{name}<{','.join(sorted(upstream))}>"

    return run


def diamond(ran: list[str], **build: Any) -> Any:
    b = GraphBuilder()
    for name in "abcde":
        b.add_node(echo(name, ran), name)
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    b.add_edge("b", "d")
    b.add_edge("c", "d")
    b.add_edge("d", "e")
    return b.build(**build)


async def test_a_join_waits_for_both_branches_and_gets_their_outputs() -> None:
    ran: list[str] = []
    result = await diamond(ran).invoke_async("t")
    assert result.status == "completed"
    assert result.execution_order == ran == ["a", "b", "c", "d", "e"]
    assert result.results["d"] == "d<b,c>"
    assert str(result) == "e<d>"


async def test_a_condition_sees_every_result_so_far_the_nodes_own_included() -> None:
    seen: list[tuple[list[str], dict[str, str]]] = []

    def look(state: dict[str, Any]) -> bool:
        seen.append((list(state["execution_order"]), dict(state["results"])))
        state["results"]["b"] = "changed by a condition"  # a copy: the run keeps its own
        return True

    ran: list[str] = []
    b = GraphBuilder()
    for name in ("a", "b", "c", "d"):
        b.add_node(echo(name, ran), name)
    b.add_edge("a", "b")  # no condition: nothing is copied for it
    b.add_edge("b", "c", condition=look)
    b.add_edge("b", "d")  # beside a conditional edge of the same node
    result = await b.build().invoke_async("t")
    assert result.execution_order == ["a", "b", "c", "d"]
    assert seen == [(["a", "b"], {"a": "a<>", "b": "b<a>"})]
    assert result.results["b"] == "b<a>"


async def test_a_false_condition_skips_its_branch_and_the_join_does_not_wait_for_it() -> None:
    ran: list[str] = []
    b = GraphBuilder()
    for name in ("route", "left", "right", "join"):
        b.add_node(echo(name, ran), name)
    b.add_edge("route", "left", condition=lambda s: s["task"] == "go left")
    b.add_edge("route", "right", condition=lambda s: s["task"] != "go left")
    b.add_edge("left", "join")
    b.add_edge("right", "join")
    graph = b.build()
    result = await graph.invoke_async("go left")
    assert result.execution_order == ["route", "left", "join"]
    assert result.results["join"] == "join<left>"


async def test_a_longer_branch_is_waited_for_whatever_the_order_nodes_were_added() -> None:
    ran: list[str] = []
    b = GraphBuilder()
    for name in ("a", "short", "long1", "long2", "join"):
        b.add_node(echo(name, ran), name)
    b.add_edge("a", "short")
    b.add_edge("a", "long1")
    b.add_edge("long1", "long2")
    b.add_edge("short", "join")
    b.add_edge("long2", "join")
    result = await b.build().invoke_async("t")
    assert result.execution_order == ["a", "short", "long1", "long2", "join"]
    assert result.results["join"] == "join<long2,short>"


async def test_function_nodes_share_state_that_conditions_see() -> None:
    def count(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        state["n"] = state.get("n", 0) + 1
        return str(state["n"])

    b = GraphBuilder()
    b.add_node(count, "count")
    b.add_edge("count", "count", condition=lambda s: s["shared"]["n"] < 3)
    result = await b.build().invoke_async("t")
    assert result.execution_order == ["count", "count", "count"]
    assert result.shared == {"n": 3}


async def test_max_steps_fails_a_run_that_loops() -> None:
    b = GraphBuilder()
    b.add_node(lambda task, up: "x", "loop")
    b.add_edge("loop", "loop")
    result = await b.build(max_steps=4).invoke_async("t")
    assert result.status == "failed"
    assert result.execution_order == ["loop"] * 4
    assert result.error is not None
    assert "max_steps (4)" in result.error


async def test_parallel_runs_ready_nodes_together() -> None:
    both = asyncio.Barrier(2)
    patience = {"seconds": 5.0}

    async def meet(task: str, upstream: dict[str, str]) -> str:
        # only returns once the other one runs too
        await asyncio.wait_for(both.wait(), patience["seconds"])
        return "met"

    b = GraphBuilder()
    b.add_node(lambda task, up: "start", "a")
    b.add_node(meet, "b")
    b.add_node(meet, "c")
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    result = await b.build(parallel=True).invoke_async("t")
    assert result.status == "completed"
    assert sorted(result.execution_order[1:]) == ["b", "c"]
    patience["seconds"] = 0.2
    sequential = GraphBuilder()
    sequential.add_node(meet, "b")
    one = await sequential.build().invoke_async("t")
    assert one.status == "failed"  # alone, it waits for a partner forever
    assert one.error is not None
    assert "TimeoutError" in one.error


async def test_a_failed_node_leaves_the_run_unfinished_and_a_new_call_retries_it() -> None:
    ran: list[str] = []
    attempts = {"n": 0}

    def flaky(task: str, upstream: dict[str, str]) -> str:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise RuntimeError("boom")
        return "ok"

    manager = SnapshotSessionManager("s", storage=MemoryStorage())
    b = GraphBuilder()
    b.add_node(echo("a", ran), "a")
    b.add_node(flaky, "flaky")
    b.add_node(echo("c", ran), "c")
    b.add_edge("a", "flaky")
    b.add_edge("flaky", "c")
    graph = b.build(session_manager=manager)
    first = await graph.invoke_async("t")
    assert first.status == "failed"
    assert first.error == "node 'flaky' failed: RuntimeError: boom"
    assert first.execution_order == ["a"]
    with pytest.raises(ValueError, match="unfinished run of the task 't'"):
        await graph.invoke_async("another task")
    second = await graph.invoke_async("t")
    assert second.status == "completed"
    assert second.execution_order == ["a", "flaky", "c"]
    assert ran == ["a", "c"]  # a did not run again


@pytest.mark.parametrize("strategy", ["node", "invocation"])
async def test_node_saves_after_every_node_and_invocation_only_at_the_end(strategy: str) -> None:
    storage = MemoryStorage()
    manager = SnapshotSessionManager(
        "s",
        storage=storage,
        multi_agent_save_latest_on=strategy,  # type: ignore[arg-type]
    )
    seen: list[list[str] | None] = []

    async def peek(task: str, upstream: dict[str, str]) -> str:
        stored = await SnapshotSessionManager("s", storage=storage).restore_multi_agent("graph")
        seen.append(None if stored is None else [r["node"] for r in stored if r["t"] == "node"])
        return "peeked"

    b = GraphBuilder()
    b.add_node(lambda task, up: "one", "a")
    b.add_node(lambda task, up: "two", "b")
    b.add_node(peek, "c")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    await b.build(session_manager=manager).invoke_async("t")
    assert seen == ([["a", "b"]] if strategy == "node" else [None])
    stored = await SnapshotSessionManager("s", storage=storage).restore_multi_agent("graph")
    assert stored is not None
    assert [r["t"] for r in stored] == ["start", "node", "node", "node", "end"]


async def test_a_completed_run_is_not_resumed_a_new_call_starts_afresh() -> None:
    ran: list[str] = []
    store = MemorySessionStore()
    graph = diamond(ran, session_manager=Session(store, "g"))
    await graph.invoke_async("t")
    again = diamond(ran, session_manager=Session(store, "g"))
    result = await again.invoke_async("t")
    assert result.execution_order == ["a", "b", "c", "d", "e"]
    assert ran == ["a", "b", "c", "d", "e"] * 2
    record = await store.get("g")
    assert len(record.messages) == 7  # the second run replaced the first: start, 5, end


async def test_node_agents_are_kept_in_the_run_and_restored_with_it() -> None:
    storage = MemoryStorage()

    def build(answer: str) -> tuple[Any, Agent]:
        writer = Agent(ScriptedModel([answer]), agent_id="writer")
        b = GraphBuilder()
        b.add_node(writer, "write")
        return b.build(session_manager=SnapshotSessionManager("s", storage=storage)), writer

    graph, _ = build("drafted")
    await graph.invoke_async("draft it")
    # One file for the whole run: the agent's state went into it, not into a latest
    # of its own (whose first save would create a file: three fsyncs a node).
    assert await storage.list("sessions/s/agents/") == []
    stored = await SnapshotSessionManager("s", storage=storage).restore_multi_agent("graph")
    assert stored is not None
    assert [r["t"] for r in stored] == ["start", "agent", "node", "end"]
    graph, restored = build("revised")
    await graph.invoke_async("revise it")
    texts = [m["content"][0]["text"] for m in restored.messages]
    assert texts == ["draft it", "drafted", "revise it", "revised"]


async def test_a_damaged_run_raises_instead_of_starting_empty() -> None:
    storage = MemoryStorage()
    manager = SnapshotSessionManager("s", storage=storage)
    await manager.save_multi_agent("graph", [{"t": "start", "v": "perdure-orchestrator/9"}])
    b = GraphBuilder()
    b.add_node(lambda task, up: "x", "a")
    graph = b.build(session_manager=SnapshotSessionManager("s", storage=storage))
    with pytest.raises(SessionCorruptedError, match="perdure-orchestrator/9"):
        await graph.invoke_async("t")


async def test_one_invocation_at_a_time() -> None:
    gate = asyncio.Event()

    async def wait(task: str, upstream: dict[str, str]) -> str:
        await gate.wait()
        return "done"

    b = GraphBuilder()
    b.add_node(wait, "w")
    graph = b.build()
    first = asyncio.ensure_future(graph.invoke_async("t"))
    await asyncio.sleep(0.01)
    with pytest.raises(TurnRunningError):
        await graph.invoke_async("t")
    gate.set()
    assert (await first).status == "completed"


def test_bad_graphs_are_refused_with_the_reason() -> None:
    b = GraphBuilder()
    b.add_node(lambda task, up: "x", "a")
    with pytest.raises(ValueError, match="'a' is already a node"):
        b.add_node(lambda task, up: "y", "a")
    with pytest.raises(ValueError, match="target 'zz' is not a node"):
        b.add_edge("a", "zz")
    with pytest.raises(ValueError, match="entry point 'zz'"):
        b.set_entry_point("zz")
    with pytest.raises(TypeError, match="an Agent or a function"):
        b.add_node(42, "n")  # type: ignore[arg-type]

    def shared_by_another_name(task: str, upstream: dict[str, str], shared: dict[str, Any]) -> str:
        return "x"

    with pytest.raises(TypeError, match=r"node 'n': .*a parameter named state.*shared"):
        b.add_node(shared_by_another_name, "n")  # it would be called with two arguments
    with pytest.raises(TypeError, match="node 'n': a node function is called as"):
        b.add_node(lambda task: "x", "n")
    assert b.add_node(lambda task, up: "x", "n") == "n"  # the refused ones were not added
    with pytest.raises(ValueError, match="node_id 'x/y' is invalid: it contains '/'"):
        b.add_node(lambda task, up: "x", "x/y")  # ids name files: the session-id rules
    b.add_node(lambda task, up: "x", "b")
    with pytest.raises(ValueError, match="set_entry_point"):
        b.build()
    b.set_entry_point("a")
    with pytest.raises(ValueError, match="max_steps"):
        b.build(max_steps=0)
    with pytest.raises(ValueError, match=r"graph_id '\.hidden' is invalid"):
        b.build(graph_id=".hidden")
    with pytest.raises(TypeError, match="session_manager"):
        b.build(session_manager=object())
    twins = GraphBuilder()
    twins.add_node(Agent(ScriptedModel([])), "one")
    twins.add_node(Agent(ScriptedModel([])), "two")
    twins.set_entry_point("one")
    with pytest.raises(ValueError, match="agent_id 'default'"):
        twins.build(session_manager=SnapshotSessionManager("s", storage=MemoryStorage()))
    twins.build()  # without a manager nothing is saved under their ids


def test_one_agent_is_one_node_and_one_edge_is_added_once() -> None:
    b = GraphBuilder()
    agent = Agent(ScriptedModel([]), agent_id="writer")
    b.add_node(agent, "first")
    with pytest.raises(ValueError, match="'writer' is already a node"):
        b.add_node(agent, "second")
    b.add_node(Agent(ScriptedModel([]), agent_id="writer"), "other")  # an equal one is not it
    b.add_edge("first", "other")
    with pytest.raises(ValueError, match="'first' -> 'other' exists already"):
        b.add_edge("first", "other", condition=lambda state: True)
    b.add_edge("other", "first")  # the other way round is another edge
    b.set_entry_point("first")
    assert b.build().node_ids == ["first", "other"]


def test_the_ready_rule() -> None:
    succ = {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}
    pred = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    reach = reachable(succ)
    rank = {n: i for i, n in enumerate("abcd")}
    assert reach["a"] == {"b", "c", "d"}
    assert ready_nodes(["b", "c"], pred, reach, rank) == ["b", "c"]
    assert ready_nodes(["c", "d"], pred, reach, rank) == ["c"]
    assert ready_nodes(["d"], pred, reach, rank) == ["d"]
    # every pending node waits on another: the first added runs
    cyc = {"x": ["y"], "y": ["x"]}
    assert ready_nodes(["y", "x"], {"x": ["y"], "y": ["x"]}, reachable(cyc), {"x": 0, "y": 1}) == [
        "x"
    ]


def test_lazy_reach_is_reachable_made_only_where_looked_up() -> None:
    succ = {"a": ["b", "c"], "b": ["d"], "c": ["d", "a"], "d": [], "e": ["e"]}
    lazy = LazyReach(succ)
    assert lazy.made == {}
    assert dict(lazy) == reachable(succ)  # a cycle through a, and a self-loop
    assert lazy.get("nowhere") is None
    assert len(lazy) == 5


async def test_a_long_chain_makes_no_reach_set_and_a_branch_only_its_own() -> None:
    # A node's reach is looked up only while it is pending beside another: a chain
    # never (the full closure would be n² sets' worth), a diamond's branches and join.
    async def step(task: str, upstream: dict[str, str]) -> str:
        return "x"

    chain = GraphBuilder()
    for i in range(2000):
        chain.add_node(step, f"n{i}")
        if i:
            chain.add_edge(f"n{i - 1}", f"n{i}")
    chain.set_entry_point("n0")
    long = chain.build(max_steps=2001)
    assert (await long.invoke_async("t")).status == "completed"
    assert long._reach.made == {}
    diamond = GraphBuilder()
    for name in "abcd":
        diamond.add_node(step, name)
    for source, target in ("ab", "ac", "bd", "cd"):
        diamond.add_edge(source, target)
    diamond.set_entry_point("a")
    graph = diamond.build()
    result = await graph.invoke_async("t")
    assert result.status == "completed"
    assert result.execution_order == ["a", "b", "c", "d"]
    assert "a" not in graph._reach.made  # never pending beside another node
    assert graph._reach.made  # the branches' were looked up: the join waited for both


def test_replay_refuses_records_out_of_place() -> None:
    start = {"t": "start", "v": "perdure-orchestrator/1", "kind": "graph", "task": "t",
             "pending": ["a"], "shared": {}}  # fmt: skip
    end = {"t": "end", "status": "completed", "error": None}
    assert replay([start, end], "g").status == "completed"
    with pytest.raises(SessionCorruptedError, match="record 2 follows the end"):
        replay([start, end, end], "g")
    with pytest.raises(SessionCorruptedError, match="record 1 has an unknown type"):
        replay([start, {"t": "what"}], "g")
    with pytest.raises(SessionCorruptedError, match="malformed node record"):
        replay([start, {"t": "node", "node": "a", "result": 3, "pending": []}], "g")


async def test_a_stored_run_that_goes_on_at_an_unknown_node_is_refused() -> None:
    storage = MemoryStorage()
    b = GraphBuilder()
    b.add_node(lambda task, up: "x", "a")
    b.add_node(lambda task, up: (_ for _ in ()).throw(RuntimeError("down")), "gone")
    b.add_edge("a", "gone")
    first = await b.build(
        session_manager=SnapshotSessionManager("s", storage=storage)
    ).invoke_async("t")
    assert first.status == "failed"
    other = GraphBuilder()
    other.add_node(lambda task, up: "x", "a")
    graph = other.build(session_manager=SnapshotSessionManager("s", storage=storage))
    with pytest.raises(ValueError, match=r"goes on at \['gone'\], which are not nodes"):
        await graph.invoke_async("t")


async def test_a_save_that_fails_raises_and_the_next_call_goes_on_from_what_is_stored() -> None:
    class Flaky(MemoryStorage):
        fail = False

        async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
            if self.fail and "multi_agents" in key:
                raise OSError("disk full")
            await super().append(key, data, size=size, tail=tail)

    storage = Flaky()
    ran: list[str] = []

    def stop_saving(task: str, upstream: dict[str, str]) -> str:
        ran.append("b")
        storage.fail = ran.count("b") == 1  # the first save of b's record fails
        return "b"

    b = GraphBuilder()
    b.add_node(echo("a", ran), "a")
    b.add_node(stop_saving, "b")
    b.add_node(echo("c", ran), "c")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    graph = b.build(session_manager=SnapshotSessionManager("s", storage=storage))
    with pytest.raises(OSError, match="disk full"):
        await graph.invoke_async("t")
    result = await graph.invoke_async("t")
    # b's record never landed: b runs again (it never completed), a does not.
    assert result.execution_order == ["a", "b", "c"]
    assert ran == ["a", "b", "b", "c"]


async def test_the_managers_filters_redact_node_results_and_the_run_stays_readable() -> None:
    from perdure.hygiene import PIIRedactor

    storage = MemoryStorage()

    def first(task: str, upstream: dict[str, str], state: dict[str, Any]) -> str:
        state["card_number_as_int"] = 4111111111111111  # card-shaped digits, outside a string
        return "write to ana@example.com"

    def build() -> Any:
        b = GraphBuilder()
        b.add_node(first, "a")
        b.add_node(lambda task, up: (_ for _ in ()).throw(RuntimeError("down")), "b")
        b.add_edge("a", "b")
        manager = SnapshotSessionManager("s", storage=storage, filters=[PIIRedactor()])
        return b.build(session_manager=manager)

    assert (await build().invoke_async("t")).status == "failed"
    stored = await SnapshotSessionManager("s", storage=storage).restore_multi_agent("graph")
    assert stored is not None
    assert stored[1]["result"] == "write to [email]"
    # Filtered as values, not as JSON text ({"n":[card]} would not parse).
    assert stored[1]["shared"] == {"card_number_as_int": 4111111111111111}
    blobs = [await storage.read(key) for key in await storage.list("")]
    assert blobs
    assert not any(b"ana@example.com" in (blob or b"") for blob in blobs)


async def test_a_sessions_filters_redact_the_records_it_stores() -> None:
    from perdure.hygiene import PIIRedactor

    store = MemorySessionStore()
    b = GraphBuilder()
    b.add_node(lambda task, up: "mail ana@example.com", "a")
    graph = b.build(session_manager=Session(store, "g", filters=[PIIRedactor()]))
    result = await graph.invoke_async("t")
    assert result.results == {"a": "mail ana@example.com"}  # the run keeps the original
    texts = [m["content"][0]["text"] for m in (await store.get("g")).messages]
    assert any('"result":"mail [email]"' in text for text in texts)
    assert not any("ana@example.com" in text for text in texts)
