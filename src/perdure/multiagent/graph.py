"""Graph: agents and functions as nodes, conditional edges, and runs that resume (SPEC §8.1).

Build one with :class:`GraphBuilder`::

    b = GraphBuilder()
    b.add_node(researcher, "research")
    b.add_node(write, "write")             # fn(task, upstream) -> str, sync or async
    b.add_edge("research", "write", condition=lambda s: "ok" in s["results"]["research"])
    b.set_entry_point("research")
    graph = b.build(session_manager=manager, max_steps=50)
    result = graph("task")                 # GraphResult

Scheduling (:func:`~perdure.multiagent.run.ready_nodes`): when a node completes, each
of its outgoing edges whose condition holds activates its target. An activated node
runs once none of its predecessors may still complete, so a join waits for every
branch that was taken. Ready nodes run one at a time in the order they were added,
each starting only after the previous node's record is saved: across a crash every
node runs exactly once (one in flight at the crash runs again, as it never
completed). ``parallel=True`` runs the ready nodes together; then every node in
flight at a crash runs again (at least once).

With a session manager the run is saved after every node (``"node"``) or at the end
(``"invocation"``), and the first invocation of a rebuilt graph (same session, same
``graph_id``) resumes an unfinished run at its next node. A node that raises fails
the invocation (``status="failed"``) and leaves the run unfinished: calling again
retries that node. Past ``max_steps`` nodes the run ends as failed.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from perdure.agent import Agent
from perdure.multiagent.orchestrator import Orchestrator
from perdure.multiagent.persist import RunStore, check_agent_ids, run_store
from perdure.multiagent.run import (
    LazyReach,
    RunState,
    end_record,
    node_record,
    ready_nodes,
)
from perdure.session.ids import validate_session_id
from perdure.types.json import validate_storable

__all__ = ["Graph", "GraphBuilder", "GraphResult", "NodeFunction"]

NodeFunction = Callable[..., str | Awaitable[str]]
"""``fn(task, upstream)`` or ``fn(task, upstream, state)`` returning the node's text.

``upstream`` maps each completed predecessor's id to its output; ``state`` (when the
function has a parameter of that name) is the graph's shared state, a dict the
function may change (it must stay JSON-storable) and that edge conditions see.
"""

Condition = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class GraphResult:
    """What a graph invocation returns.

    Attributes:
        status: ``"completed"`` or ``"failed"``.
        execution_order: node ids in the order they completed (across a resume too).
        results: each completed node's output text.
        shared: the shared state at the end.
        error: why it failed (``None`` when completed).
    """

    status: Literal["completed", "failed"]
    execution_order: list[str]
    results: dict[str, str]
    shared: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __str__(self) -> str:
        return self.results.get(self.execution_order[-1], "") if self.execution_order else ""


@dataclass(frozen=True)
class _Node:
    node_id: str
    executor: Agent | NodeFunction
    takes_state: bool


@dataclass(frozen=True)
class _Edge:
    source: str
    target: str
    condition: Condition | None


def _takes_state(fn: Callable[..., Any]) -> bool:
    try:
        return "state" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _check_callable_as_node(fn: Callable[..., Any], takes_state: bool, node_id: str) -> None:
    """Refuse, when it is added, a function a node could not call.

    Raises:
        TypeError: its parameters do not take ``(task, upstream)`` (with ``state``
            third, by that name, when it wants the shared state).
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call will tell
        return
    args: tuple[None, ...] = (None, None, None) if takes_state else (None, None)
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise TypeError(
            f"node {node_id!r}: a node function is called as fn(task, upstream), or "
            f"fn(task, upstream, state) to read and change the shared state (a "
            f"parameter named state); {getattr(fn, '__name__', fn)!r}{signature} "
            f"cannot be ({exc})"
        ) from None


class GraphBuilder:
    """Collects nodes and edges; :meth:`build` checks them and makes a :class:`Graph`."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._edges: list[_Edge] = []
        # What the checks look up, so that building a graph of n nodes is not n²:
        self._agent_ids: set[int] = set()  # id() of each Agent node (they are held)
        self._edge_ends: set[tuple[str, str]] = set()
        self._entry: str | None = None

    def add_node(self, executor: Agent | NodeFunction, node_id: str | None = None) -> str:
        """Add a node and return its id (default: the agent's name, or the function's).

        Raises:
            TypeError: ``executor`` is neither an Agent nor callable, or a function
                that cannot be called as ``fn(task, upstream)`` (or ``fn(task,
                upstream, state)``, its third parameter named ``state``).
            ValueError: the id is taken or invalid, or the agent is already a node.
        """
        if isinstance(executor, Agent):
            default = executor.name
            if id(executor) in self._agent_ids:
                raise ValueError(f"agent {executor.name!r} is already a node of this graph")
        elif callable(executor):
            default = getattr(executor, "__name__", "")
        else:
            raise TypeError(f"a node must be an Agent or a function, got {type(executor).__name__}")
        node_id = default if node_id is None else node_id
        if not isinstance(node_id, str):
            raise TypeError(f"node_id must be a str, got {type(node_id).__name__}")
        validate_session_id(node_id, "node_id")  # the same rules: non-empty, no separators
        if node_id in self._nodes:
            raise ValueError(f"node_id {node_id!r} is already a node of this graph")
        takes_state = not isinstance(executor, Agent) and _takes_state(executor)
        if not isinstance(executor, Agent):
            _check_callable_as_node(executor, takes_state, node_id)
        self._nodes[node_id] = _Node(node_id, executor, takes_state)
        if isinstance(executor, Agent):
            self._agent_ids.add(id(executor))
        return node_id

    def add_edge(self, source: str, target: str, condition: Condition | None = None) -> None:
        """Add an edge; ``condition(state) -> bool`` decides whether it is taken.

        ``state`` is ``{"task", "results", "execution_order", "shared"}``.

        Raises:
            ValueError: ``source`` or ``target`` is not a node, or the edge exists.
            TypeError: ``condition`` is not callable.
        """
        for name, node_id in (("source", source), ("target", target)):
            if node_id not in self._nodes:
                raise ValueError(f"add_edge {name} {node_id!r} is not a node (add_node first)")
        if condition is not None and not callable(condition):
            raise TypeError(f"condition must be callable or None, got {condition!r}")
        if (source, target) in self._edge_ends:
            raise ValueError(f"the edge {source!r} -> {target!r} exists already")
        self._edges.append(_Edge(source, target, condition))
        self._edge_ends.add((source, target))

    def set_entry_point(self, node_id: str) -> None:
        """Name the node the run starts at.

        Raises:
            ValueError: ``node_id`` is not a node.
        """
        if node_id not in self._nodes:
            raise ValueError(f"entry point {node_id!r} is not a node (add_node first)")
        self._entry = node_id

    def build(
        self,
        session_manager: object = None,
        max_steps: int = 50,
        *,
        parallel: bool = False,
        graph_id: str = "graph",
    ) -> Graph:
        """Make the graph.

        Args:
            session_manager: a :class:`~perdure.session.SnapshotSessionManager`, a
                :class:`~perdure.session.Session`, or ``None`` (nothing persisted).
            max_steps: at most this many nodes run in one run.
            parallel: run ready nodes together (at-least-once across a crash).
            graph_id: names the graph's run inside the session.

        Raises:
            ValueError: no node; no entry point, more than one node and not
                exactly one of them without incoming edges; a bad ``max_steps`` or
                ``graph_id``; node agents that would be saved under one id.
            TypeError: an unsupported ``session_manager``.
        """
        if not self._nodes:
            raise ValueError("the graph has no node")
        entry = self._entry
        if entry is None:
            targets = {e.target for e in self._edges}
            roots = [n for n in self._nodes if n not in targets]
            if len(self._nodes) == 1:
                roots = list(self._nodes)
            if len(roots) != 1:
                raise ValueError(
                    "set_entry_point(...) is needed: the graph has "
                    f"{len(roots)} nodes without incoming edges ({roots})"
                )
            entry = roots[0]
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        if not isinstance(parallel, bool):
            raise TypeError(f"parallel must be a bool, got {type(parallel).__name__}")
        validate_session_id(graph_id, "graph_id")
        store = run_store(session_manager, graph_id)
        agents = [n.executor for n in self._nodes.values() if isinstance(n.executor, Agent)]
        check_agent_ids(agents, store, "node")
        return Graph(
            dict(self._nodes), list(self._edges), entry, store, max_steps, parallel, graph_id
        )


class Graph(Orchestrator[GraphResult]):
    """A built graph; call it with a task (see the module docstring)."""

    kind = "graph"

    def __init__(
        self,
        nodes: dict[str, _Node],
        edges: list[_Edge],
        entry: str,
        store: RunStore,
        max_steps: int,
        parallel: bool,
        graph_id: str,
    ) -> None:
        super().__init__(store, graph_id)
        self.graph_id = graph_id
        self.entry_point = entry
        self.max_steps = max_steps
        self.parallel = parallel
        self._nodes = nodes
        self._edges = edges
        self._rank = {node_id: i for i, node_id in enumerate(nodes)}
        successors: dict[str, list[str]] = {n: [] for n in nodes}
        self._predecessors: dict[str, list[str]] = {n: [] for n in nodes}
        self._out: dict[str, list[_Edge]] = {n: [] for n in nodes}  # each node's edges
        for edge in edges:
            successors[edge.source].append(edge.target)
            self._predecessors[edge.target].append(edge.source)
            self._out[edge.source].append(edge)
        self._reach = LazyReach(successors)
        self._save_lock = asyncio.Lock()

    @property
    def node_ids(self) -> list[str]:
        """The node ids, in the order they were added."""
        return list(self._nodes)

    def _node_agents(self) -> list[Agent]:
        return [n.executor for n in self._nodes.values() if isinstance(n.executor, Agent)]

    def _check_resumable(self, state: RunState) -> None:
        unknown = sorted(set(state.pending) - set(self._nodes))
        if unknown:
            raise ValueError(
                f"the unfinished run of graph {self.graph_id!r} goes on at {unknown}, "
                f"which are not nodes of this graph ({self.node_ids})"
            )

    async def _invoke(self, task: str) -> GraphResult:
        records, state, fresh = await self._begin(task, self.entry_point)
        store = self._store
        steps = len(state.order)
        error: str | None = None
        while state.pending:
            if steps >= self.max_steps:
                error = f"max_steps ({self.max_steps}) reached with {state.pending} still to run"
                records.append(end_record("failed", error))
                state.status, state.error = "failed", error
                await self._save(records, fresh=fresh, final=True)
                return self._result(state)
            ready = ready_nodes(state.pending, self._predecessors, self._reach, self._rank)
            batch = ready if self.parallel else ready[:1]
            batch = batch[: self.max_steps - steps]
            outcomes = await asyncio.gather(
                *(self._run_node(state, node_id, records, fresh) for node_id in batch),
                return_exceptions=True,
            )
            fresh = False
            steps += len(batch)
            failures = [
                (node_id, out)
                for node_id, out in zip(batch, outcomes, strict=True)
                if isinstance(out, BaseException)
            ]
            if failures:
                for _, out in failures:
                    if not isinstance(out, Exception):
                        raise out  # a cancellation or KeyboardInterrupt goes on up
                for _, out in failures:
                    if isinstance(out, _SaveFailed):
                        # Not a node's failure: the run could not be saved.
                        assert out.__cause__ is not None
                        raise out.__cause__
                node_id, exc = failures[0]
                error = f"node {node_id!r} failed: {type(exc).__name__}: {exc}"
                if store.strategy == "invocation":
                    await self._save(records, fresh=False, final=True)
                return self._result(state, status="failed", error=error)
        records.append(end_record("completed"))
        state.status = "completed"
        await self._save(records, fresh=fresh, final=True)
        return self._result(state)

    async def _run_node(
        self, state: RunState, node_id: str, records: list[dict[str, Any]], fresh: bool
    ) -> None:
        node = self._nodes[node_id]
        upstream = {p: state.results[p] for p in self._predecessors[node_id] if p in state.results}
        before = copy.deepcopy(state.shared)
        try:
            if isinstance(node.executor, Agent):
                result = await node.executor.invoke_async(_agent_prompt(state.task, upstream))
                text = str(result)
            else:
                text = await _call(node, state.task, upstream, state.shared)
            if not isinstance(text, str):
                raise TypeError(f"node {node_id!r} returned {type(text).__name__}, not a str")
            validate_storable(state.shared, f"the shared state after node {node_id!r}")
        except BaseException:
            if not self.parallel:  # the retry starts from the state the run recorded
                state.shared.clear()
                state.shared.update(before)
            raise
        # The edges it activates, decided before anything changes: a condition that
        # raises fails the node, and the run stays as it was recorded. Only this node's
        # edges are looked at, and the state a condition sees (a copy of every result
        # so far) is made only for a condition: a node costs the same however many
        # nodes the graph has and however many have run.
        out = self._out[node_id]
        if any(e.condition is not None for e in out):
            view = self._condition_state(state)
            view["results"][node_id] = text
            view["execution_order"].append(node_id)
            activated = [e.target for e in out if e.condition is None or _holds(e, view)]
        else:
            activated = [e.target for e in out]
        kept: dict[str, Any] | None = None
        if isinstance(node.executor, Agent) and self._store.strategy == "node":
            # The agent before the record that says its node completed.
            try:
                kept = await self._store.save_agent(node.executor)
            except Exception as exc:
                raise _SaveFailed() from exc
        # No await from here to the append: with parallel=True another node's save may
        # write this record at once, and it must find the run as this record says.
        if kept is not None:
            records.append(kept)
        state.order.append(node_id)
        state.results[node_id] = text
        pending = [p for p in state.pending if p != node_id]
        pending += [t for t in activated if t not in pending]
        state.pending = pending
        changed = state.shared != before
        records.append(
            node_record(node_id, text, pending, shared=state.shared if changed else None)
        )
        try:
            await self._save(records, fresh=fresh, final=False)
        except Exception as exc:
            raise _SaveFailed() from exc

    def _condition_state(self, state: RunState) -> dict[str, Any]:
        return {
            "task": state.task,
            "results": dict(state.results),
            "execution_order": list(state.order),
            "shared": state.shared,
        }

    async def _save(self, records: list[dict[str, Any]], *, fresh: bool, final: bool) -> None:
        store = self._store
        if store.strategy == "invocation" and not final:
            return
        async with self._save_lock:
            if final and store.strategy == "invocation":
                for node in self._nodes.values():
                    if isinstance(node.executor, Agent):
                        kept = await store.save_agent(node.executor)
                        if kept is not None:
                            records.append(kept)
            await store.save(records, fresh=fresh)

    def _result(
        self, state: RunState, *, status: str | None = None, error: str | None = None
    ) -> GraphResult:
        final = cast(Literal["completed", "failed"], status or state.status)
        return GraphResult(
            status=final,
            execution_order=list(state.order),
            results=dict(state.results),
            shared=copy.deepcopy(state.shared),
            error=error if error is not None else state.error,
        )


class _SaveFailed(Exception):
    """A save after a node failed (its cause): the invocation raises it."""


def _holds(edge: _Edge, view: dict[str, Any]) -> bool:
    assert edge.condition is not None
    decision = edge.condition(view)
    if not isinstance(decision, bool):
        raise TypeError(
            f"the condition of edge {edge.source!r} -> {edge.target!r} returned "
            f"{type(decision).__name__}, not a bool"
        )
    return decision


def _agent_prompt(task: str, upstream: Mapping[str, str]) -> str:
    if not upstream:
        return task
    inputs = "\n\n".join(f"[{node_id}]\n{text}" for node_id, text in upstream.items())
    return f"{task}\n\nResults of the steps before this one:\n\n{inputs}"


async def _call(node: _Node, task: str, upstream: dict[str, str], shared: dict[str, Any]) -> Any:
    fn = cast(Callable[..., Any], node.executor)
    args: tuple[Any, ...] = (task, upstream, shared) if node.takes_state else (task, upstream)
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    # A sync node may block (a model call, a file): it runs beside the loop, not on it.
    out = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(out):
        return await out
    return out
