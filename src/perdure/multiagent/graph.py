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

The shared state (``fn(task, upstream, state)``) holds only what completed nodes did.
A node works on its own copy of it; what the node set, changed or deleted is merged
into the run's state when, and only when, the node completes, so a node that fails
or is in flight at a crash leaves nothing behind and its retry starts from the state
the run recorded. With ``parallel=True`` the nodes of a batch all start from the
state as it was when the batch began. Two of them changing the same key is refused
rather than letting one change silently overwrite the other (a lost update): the
node that completes later fails, naming the key and the other node, without its
record; calling again runs it once more, on the state the other one left, as if the
two had run one after the other. Changes to different keys merge.

A node agent that pauses (its turn ends with ``stop_reason`` ``"interrupt"`` or
``"checkpoint"``, SPEC §3, §3.1) has not completed: the invocation stops once the
nodes running beside it are done, with ``status="interrupted"`` and the paused
agents' results in :attr:`GraphResult.paused` (their questions in
:attr:`GraphResult.interrupts`); the node is not recorded, and nothing downstream
runs. Call the graph again with the same task to go on: pass the answers as
``responses=[{"interruptResponse": {"interruptId": ..., "response": ...}}]`` (the
blocks an :class:`~perdure.agent.Agent` takes), and each goes to the agent that asked;
an agent paused at a checkpoint goes on from it. An agent whose interrupts are not
answered is not run again: the invocation stays ``"interrupted"``. The paused agent
is saved with the run, so the answer may come from another process.

With a session manager the run is saved after every node (``"node"``) or at the end
(``"invocation"``), and the first invocation of a rebuilt graph (same session, same
``graph_id``) resumes an unfinished run at its next node. A node that raises fails
the invocation (``status="failed"``) and leaves the run unfinished: calling again
retries that node. Past ``max_steps`` nodes the run ends as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from perdure._runtime.loop import run_sync
from perdure.agent import Agent, AgentResult, Checkpoint
from perdure.agent.event_loop import pending_tool_uses
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
from perdure.tools import Interrupt
from perdure.types import Message
from perdure.types.json import validate_storable

__all__ = ["Graph", "GraphBuilder", "GraphResult", "NodeFunction"]

NodeFunction = Callable[..., str | Awaitable[str]]
"""``fn(task, upstream)`` or ``fn(task, upstream, state)`` returning the node's text.

``upstream`` maps each completed predecessor's id to its output; ``state`` (when the
function has a parameter of that name) is the graph's shared state, a dict the
function may change (it must stay JSON-storable) and that edge conditions see.
"""

Condition = Callable[[dict[str, Any]], bool]

Status = Literal["completed", "failed", "interrupted"]

# The stop reasons with which a node agent's turn pauses rather than ends (SPEC §3.1).
PAUSED_STOP_REASONS = frozenset({"interrupt", "checkpoint"})


@dataclass(frozen=True)
class GraphResult:
    """What a graph invocation returns.

    Attributes:
        status: ``"completed"``, ``"failed"``, or ``"interrupted"`` (a node agent
            paused: see :attr:`paused`; the run goes on when called again).
        execution_order: node ids in the order they completed (across a resume too).
        results: each completed node's output text.
        shared: the shared state at the end (only completed nodes' changes).
        error: why it failed (``None`` unless failed).
        paused: each node whose agent paused in this invocation, with the agent's
            result (its ``stop_reason``, ``interrupts`` and ``checkpoint``); such a
            node has not completed.
    """

    status: Status
    execution_order: list[str]
    results: dict[str, str]
    shared: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    paused: dict[str, AgentResult] = field(default_factory=dict)

    @property
    def interrupts(self) -> list[Interrupt]:
        """The questions the paused node agents wait on, to answer with ``responses=``."""
        return [i for result in self.paused.values() for i in result.interrupts]

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
            parallel: run ready nodes together (at-least-once across a crash). Each
                starts from the shared state as the batch began; its changes are
                merged when it completes, and a node changing a key another node of
                its batch changed first fails (calling again reruns it on the
                state the other left): see the module docstring.
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

    def __call__(
        self, task: str, *, responses: Sequence[Mapping[str, Any]] | None = None
    ) -> GraphResult:
        """Run (or resume) on ``task``; the sync face of :meth:`invoke_async`."""
        return run_sync(
            self.invoke_async(task, responses=responses), async_name="graph.invoke_async(task)"
        )

    async def invoke_async(
        self, task: str, *, responses: Sequence[Mapping[str, Any]] | None = None
    ) -> GraphResult:
        """Run on ``task``, or resume the unfinished run of that task.

        Args:
            task: the task.
            responses: ``interruptResponse`` blocks answering the interrupts of
                paused node agents (:attr:`GraphResult.interrupts`); each goes to
                the node agent that asked.

        Raises:
            ValueError: ``responses`` is malformed, or names an interrupt no paused
                node agent of the run waits on; and see
                :meth:`Orchestrator.invoke_async
                <perdure.multiagent.orchestrator.Orchestrator.invoke_async>`.
        """
        with answering(responses):
            return await super().invoke_async(task)

    async def _invoke(self, task: str) -> GraphResult:
        records, state, fresh = await self._begin(task, self.entry_point)
        check_answered(
            invocation_answers(),
            [self._nodes[n].executor for n in state.pending],
            f"graph {self.graph_id!r}",
        )
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
            # Taken before any node of the batch runs (one may complete before another
            # starts): each starts from it, and a change made since is another's.
            began = (
                copy.deepcopy(state.shared)
                if any(self._nodes[n].takes_state for n in batch)
                else {}
            )
            changed_by: dict[str, str] = {}  # shared key -> the node of the batch that set it
            outcomes = await asyncio.gather(
                *(
                    self._run_node(state, node_id, records, fresh, began, changed_by)
                    for node_id in batch
                ),
                return_exceptions=True,
            )
            steps += len(batch)
            failures = [
                (node_id, out)
                for node_id, out in zip(batch, outcomes, strict=True)
                if isinstance(out, BaseException)
            ]
            for _, out in failures:
                if not isinstance(out, Exception):
                    raise out  # a cancellation or KeyboardInterrupt goes on up
            for _, out in failures:
                if isinstance(out, _SaveFailed):
                    # Not a node's failure: the run could not be saved.
                    assert out.__cause__ is not None
                    raise out.__cause__
            paused = {
                node_id: out
                for node_id, out in zip(batch, outcomes, strict=True)
                if isinstance(out, AgentResult)
            }
            if paused and store.strategy == "node":
                # The paused agents (their pending interrupts) go with the run, without
                # a node record: the node has not completed, and runs on next time.
                for node_id in paused:
                    kept = await store.save_agent(cast(Agent, self._nodes[node_id].executor))
                    if kept is not None:
                        records.append(kept)
                await self._save(records, fresh=fresh, final=False)
            fresh = False
            if failures or paused:
                if store.strategy == "invocation":
                    await self._save(records, fresh=False, final=True)
                if failures:
                    node_id, exc = failures[0]
                    error = (
                        str(exc)
                        if isinstance(exc, _SharedConflict)
                        else f"node {node_id!r} failed: {type(exc).__name__}: {exc}"
                    )
                    return self._result(state, status="failed", error=error, paused=paused)
                return self._result(state, status="interrupted", paused=paused)
        records.append(end_record("completed"))
        state.status = "completed"
        await self._save(records, fresh=fresh, final=True)
        return self._result(state)

    async def _run_node(
        self,
        state: RunState,
        node_id: str,
        records: list[dict[str, Any]],
        fresh: bool,
        began: Mapping[str, Any],
        changed_by: dict[str, str],
    ) -> AgentResult | None:
        """Run one node; record it and return ``None``, or return the paused agent's result.

        The node works on a copy of the shared state as its batch ``began``; only its
        own changes (the keys it set, changed or deleted) are merged into the run's,
        in the same step as its record, so a node that raises, pauses or dies leaves
        the run's state as the completed nodes made it.
        """
        node = self._nodes[node_id]
        upstream = {p: state.results[p] for p in self._predecessors[node_id] if p in state.results}
        changes: dict[str, Any] = {}
        if isinstance(node.executor, Agent):
            prompt = _agent_prompt(state.task, upstream)
            result = await run_node_agent(node.executor, prompt, invocation_answers())
            if result.stop_reason in PAUSED_STOP_REASONS:
                return result
            text: Any = str(result)
        else:
            own = copy.deepcopy(dict(began)) if node.takes_state else {}
            text = await _call(node, state.task, upstream, own)
            if node.takes_state:
                validate_storable(own, f"the shared state after node {node_id!r}")
                changes = _changes(began, own)
        if not isinstance(text, str):
            raise TypeError(f"node {node_id!r} returned {type(text).__name__}, not a str")
        _check_conflicts(node_id, state.shared, began, changes, changed_by)
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
            if changes:
                view["shared"] = _merged(state.shared, changes)
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
        for key, value in changes.items():
            if value is _ABSENT:
                state.shared.pop(key, None)
            else:
                state.shared[key] = value
            changed_by[key] = node_id
        state.order.append(node_id)
        state.results[node_id] = text
        pending = [p for p in state.pending if p != node_id]
        pending += [t for t in activated if t not in pending]
        state.pending = pending
        records.append(
            node_record(node_id, text, pending, shared=state.shared if changes else None)
        )
        try:
            await self._save(records, fresh=fresh, final=False)
        except Exception as exc:
            raise _SaveFailed() from exc
        return None

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
        self,
        state: RunState,
        *,
        status: Status | None = None,
        error: str | None = None,
        paused: Mapping[str, AgentResult] | None = None,
    ) -> GraphResult:
        final = status or cast(Status, state.status)
        return GraphResult(
            status=final,
            execution_order=list(state.order),
            results=dict(state.results),
            shared=copy.deepcopy(state.shared),
            error=error if error is not None else state.error,
            paused=dict(paused or {}),
        )


class _SaveFailed(Exception):
    """A save after a node failed (its cause): the invocation raises it."""


class _SharedConflict(Exception):
    """Two nodes of a parallel batch changed one shared key: the later one fails."""


class _Absent:
    """A key a node deleted, or one a state does not hold."""

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Any = _Absent()


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a node set, changed or deleted (``_ABSENT``), with their new values."""
    changes = {k: v for k, v in after.items() if k not in before or before[k] != v}
    changes.update((k, _ABSENT) for k in before if k not in after)
    return changes


def _merged(shared: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(shared)
    for key, value in changes.items():
        if value is _ABSENT:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _check_conflicts(
    node_id: str,
    shared: Mapping[str, Any],
    before: Mapping[str, Any],
    changes: Mapping[str, Any],
    changed_by: Mapping[str, str],
) -> None:
    """Refuse changes to keys another node changed since this one started.

    Merging one over the other would lose an update (two nodes counting into one
    key would count once, even though both write the same value); refused, the node
    runs again on the other's state.

    Raises:
        _SharedConflict: naming the key, both nodes, and what calling again does.
    """
    for key in changes:
        if shared.get(key, _ABSENT) != before.get(key, _ABSENT):
            other = changed_by.get(key, "another node")
            raise _SharedConflict(
                f"node {node_id!r} changed the shared state's key {key!r}, which node "
                f"{other!r} running beside it (parallel=True) changed first; refused, so "
                f"that neither change is lost: node {node_id!r} is not recorded, and "
                "calling again runs it on the state the other left"
            )


_ANSWERS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "perdure_multiagent_answers", default=None
)
"""The interrupt answers (interrupt id -> response) of the running invocation: a
context variable, so that an invocation refused as already running (another task's
call) cannot change the answers of the one that runs."""


def invocation_answers() -> Mapping[str, Any]:
    """The interrupt answers given to the running invocation (see :func:`answering`)."""
    return _ANSWERS.get() or {}


@contextlib.contextmanager
def answering(responses: Sequence[Mapping[str, Any]] | None) -> Iterator[None]:
    """Give ``responses`` (checked by :func:`interrupt_answers`) to the invocation inside."""
    token = _ANSWERS.set(interrupt_answers(responses))
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def interrupt_answers(responses: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """Interrupt id -> response, from ``interruptResponse`` blocks (as an Agent takes them).

    Raises:
        ValueError: a block is not ``{"interruptResponse": {"interruptId": str,
            "response": ...}}`` (the message names its index), or is not storable.
    """
    if responses is None:
        return {}
    if isinstance(responses, (str, bytes, Mapping)) or not isinstance(responses, Sequence):
        raise ValueError(
            'responses must be a list of {"interruptResponse": {"interruptId": ..., '
            f'"response": ...}}}} blocks, got {type(responses).__name__}'
        )
    answers: dict[str, Any] = {}
    for i, item in enumerate(responses):
        body = item.get("interruptResponse") if isinstance(item, Mapping) else None
        if (
            not isinstance(item, Mapping)
            or set(item) != {"interruptResponse"}
            or not isinstance(body, Mapping)
            or not isinstance(body.get("interruptId"), str)
            or "response" not in body
        ):
            raise ValueError(
                f"responses[{i}] must be {{'interruptResponse': {{'interruptId': str, "
                f"'response': ...}}}}, got {item!r}"
            )
        validate_storable(body["response"], f"responses[{i}].interruptResponse.response")
        answers[body["interruptId"]] = copy.deepcopy(body["response"])
    return answers


def check_answered(answers: Mapping[str, Any], executors: Iterable[object], where: str) -> None:
    """Refuse answers to interrupts that no agent about to run waits on.

    Raises:
        ValueError: naming the unknown ids and the interrupts that are pending.
    """
    if not answers:
        return
    asked = {
        iid: interrupt
        for executor in executors
        if isinstance(executor, Agent) and executor.interrupt_state.activated
        for iid, interrupt in executor.interrupt_state.interrupts.items()
    }
    unknown = sorted(set(answers) - set(asked))
    if unknown:
        waiting = ", ".join(f"{i.id!r} ({i.name})" for i in asked.values()) or "none"
        raise ValueError(
            f"responses answer interrupt ids {unknown}, which no paused agent of {where} "
            f"waits on (pending: {waiting})"
        )


def _mid_turn_checkpoint(agent: Agent) -> Checkpoint | None:
    """Where an agent with checkpointing stands when its history stops mid-turn."""
    if not agent.checkpointing or not agent.messages:
        return None
    if pending_tool_uses(agent.messages):
        return Checkpoint(position="after_model", cycle_index=0)
    last = agent.messages[-1]
    if last["role"] == "user" and any("toolResult" in block for block in last["content"]):
        return Checkpoint(position="after_tools", cycle_index=0)
    return None


async def run_node_agent(agent: Agent, prompt: str, answers: Mapping[str, Any]) -> AgentResult:
    """Run a node agent's turn: resumed where it paused, else on ``prompt``.

    A new prompt over a paused agent would close its pending calls unanswered (the
    approval it waits for silently dropped), so: an agent waiting on interrupts
    gets the answers meant for it, or, without any, is not run (its pause is
    returned again); an agent with checkpointing whose history stops mid-turn (a
    checkpoint, or a crash during the turn) goes on from that point.
    """
    interrupts = agent.interrupt_state
    if interrupts.activated:
        mine = {iid: answers[iid] for iid in interrupts.interrupts if iid in answers}
        if not mine and not interrupts.pending:  # answered before, never gone on (a crash)
            mine = {i.id: i.response for i in interrupts.interrupts.values()}
        if not mine:
            return AgentResult(
                stop_reason="interrupt",
                message=_last_assistant(agent.messages),
                interrupts=list(interrupts.pending),
            )
        # Resume blocks are prompts the Agent takes, though not of its Prompt type.
        blocks: Any = [
            {"interruptResponse": {"interruptId": k, "response": v}} for k, v in mine.items()
        ]
        return await agent.invoke_async(blocks)
    checkpoint = _mid_turn_checkpoint(agent)
    if checkpoint is not None:
        resume: Any = [{"checkpointResume": {"checkpoint": checkpoint.to_dict()}}]
        return await agent.invoke_async(resume)
    return await agent.invoke_async(prompt)


def _last_assistant(messages: Sequence[Message]) -> Message:
    for message in reversed(messages):
        if message["role"] == "assistant":
            found: Message = message
            return found
    return {"role": "assistant", "content": []}


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
