"""An orchestrator's run as records, and the scheduling rule of a graph (pure).

A run is stored as a list of JSON records, oldest first, each one small and written
once (a session manager appends the new ones; see :mod:`perdure.multiagent.persist`):

* ``{"t": "start", "v": RUN_FORMAT, "kind": "graph"|"swarm", "id": str, "task": str,
  "pending": [node, …], "shared": {…}}`` — the run begins; ``id`` is the
  orchestrator's (its ``graph_id`` / ``swarm_id``), so that a run is never taken for
  another orchestrator's (a ``Session`` holds one run, whoever wrote it); ``pending``
  holds the entry node (a swarm: the entry agent). A start record without ``id``
  (written before ids were recorded) is taken as the reader's.
* ``{"t": "node", "node": id, "result": str, "pending": [id, …]}`` — a node
  completed with ``result``; ``pending`` is what is to run next (a graph: every node
  activated and not yet run, in activation order; a swarm: the agent handed off to,
  or nothing). Optional keys: ``"shared"`` (the shared state, when the node changed
  it) and, in a swarm, ``"handoff": {"from", "to", "message"}``.
* ``{"t": "end", "status": "completed"|"failed", "error": str|None}`` — the run is
  over; the next invocation starts a new one.
* ``{"t": "agent", "agent": id, "from": int, "messages": [message, …], "fields":
  {…}}`` — a node agent's state, kept in the run (see :mod:`perdure.multiagent.persist`;
  a ``SnapshotSessionManager`` makes it with its ``node_agent_record``): the
  agent's history from index ``from`` on, in stored form (the messages before
  ``from`` are those it had already, in its own ``latest`` or in the run's earlier
  records of it), and its other fields as a snapshot without messages
  (``schema_version``, ``scope``, ``created_at``, ``data``, ``app_data``). Such
  records may stand anywhere after the start, after the end too (the agents saved
  when an invocation ends); :func:`replay` passes over them and :func:`fold_agent`
  folds them.

:func:`replay` folds them into a :class:`RunState`; anything malformed raises
:class:`~perdure.errors.SessionCorruptedError` rather than giving a wrong run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from perdure.errors import SessionCorruptedError
from perdure.types import decode_bytes_values

__all__ = [
    "RUN_FORMAT",
    "LazyReach",
    "RunState",
    "agent_records",
    "end_record",
    "fold_agent",
    "node_record",
    "reachable",
    "ready_nodes",
    "replay",
    "start_record",
]

RUN_FORMAT = "perdure-orchestrator/1"


@dataclass
class RunState:
    """Where a run stands, as its records say.

    Attributes:
        kind: ``"graph"`` or ``"swarm"``.
        task: the task the run was started with.
        status: ``"running"``, ``"completed"`` or ``"failed"``.
        order: the nodes (agent names, in a swarm) in the order they completed.
        results: each node's last result text.
        pending: what runs next (see the module docstring).
        shared: the shared state (graph) or shared context (swarm).
        handoffs: the hand-offs of a swarm, each ``{"from", "to", "message"}``.
        error: why a failed run failed.
        run_id: the id of the orchestrator whose run it is (``None``: not recorded).
    """

    kind: str
    task: str
    status: str = "running"
    order: list[str] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    handoffs: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    run_id: str | None = None


def start_record(
    kind: str,
    task: str,
    pending: list[str],
    shared: Mapping[str, Any],
    run_id: str | None = None,
) -> dict[str, Any]:
    """The first record of a run (``run_id``: the orchestrator's id, kept in it)."""
    record: dict[str, Any] = {"t": "start", "v": RUN_FORMAT, "kind": kind}
    if run_id is not None:
        record["id"] = run_id
    return record | {
        "task": task,
        "pending": list(pending),
        "shared": copy.deepcopy(dict(shared)),
    }


def node_record(
    node: str,
    result: str,
    pending: list[str],
    *,
    shared: Mapping[str, Any] | None = None,
    handoff: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The record of one completed node (``shared``: only when the node changed it)."""
    record: dict[str, Any] = {"t": "node", "node": node, "result": result, "pending": list(pending)}
    if shared is not None:
        record["shared"] = copy.deepcopy(dict(shared))
    if handoff is not None:
        record["handoff"] = dict(handoff)
    return record


def end_record(status: str, error: str | None = None) -> dict[str, Any]:
    """The last record of a run."""
    return {"t": "end", "status": status, "error": error}


def _agent_record_ok(record: Mapping[str, Any]) -> bool:
    start = record.get("from")
    return (
        isinstance(record.get("agent"), str)
        and isinstance(start, int)
        and not isinstance(start, bool)
        and start >= 0
        and isinstance(record.get("messages"), list)
        and isinstance(record.get("fields"), dict)
    )


def agent_records(
    records: Sequence[Mapping[str, Any]],
) -> dict[str, list[tuple[int, Mapping[str, Any]]]]:
    """Each node agent's records in the run, oldest first, with their indexes in it."""
    found: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for index, record in enumerate(records):
        if record.get("t") == "agent":
            found.setdefault(str(record.get("agent")), []).append((index, record))
    return found


def fold_agent(
    records: Sequence[tuple[int, Mapping[str, Any]]],
    agent_id: str,
    messages: list[Any],
    where: str,
) -> tuple[list[Any], dict[str, Any] | None]:
    """Fold an agent's records (from :func:`agent_records`) over the history it had.

    The records hold messages in their stored form (``bytes`` encoded); the history
    returned holds them decoded. Returns the history and the newest fields
    (``None``: there is no record, and ``messages`` is returned as it is). Each
    record keeps the history before its ``from`` and replaces the rest, so folding a
    record over a history that already holds it changes nothing.

    Raises:
        SessionCorruptedError: a record is malformed, or starts past the end of the
            history it follows (the message names ``where`` and its index in the run).
    """
    fields: dict[str, Any] | None = None
    for index, record in records:
        if not _agent_record_ok(record):
            raise _bad(where, index, "is a malformed agent record")
        start = record["from"]
        if start > len(messages):
            raise _bad(
                where,
                index,
                f"goes on from message {start} of agent {agent_id!r}, which has only "
                f"{len(messages)}",
            )
        try:
            added = decode_bytes_values(record["messages"])
        except (ValueError, RecursionError) as exc:
            why = f"holds a malformed message of agent {agent_id!r}: {exc}"
            raise _bad(where, index, why) from None
        messages = messages[:start] + added
        fields = record["fields"]
    return messages, fields


def _bad(where: str, index: int, why: str) -> SessionCorruptedError:
    return SessionCorruptedError(f"orchestrator run {where!r}: record {index} {why}")


def _strings(value: Any) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def replay(records: Sequence[Mapping[str, Any]], where: str) -> RunState:
    """Fold ``records`` into the state of the run they describe.

    Raises:
        SessionCorruptedError: a record is malformed, of an unknown format, or out
            of place (the message names ``where`` and the record's index).
    """
    if not records:
        raise _bad(where, 0, "is missing: a run starts with a start record")
    first = records[0]
    if first.get("t") != "start":
        raise _bad(where, 0, "is not a start record")
    if first.get("v") != RUN_FORMAT:
        raise _bad(where, 0, f"has format {first.get('v')!r}, expected {RUN_FORMAT!r}")
    kind, task, pending = first.get("kind"), first.get("task"), first.get("pending")
    shared, run_id = first.get("shared"), first.get("id")
    if kind not in ("graph", "swarm") or not isinstance(task, str) or not _strings(pending):
        raise _bad(where, 0, "is a malformed start record")
    if not (run_id is None or isinstance(run_id, str)):
        raise _bad(where, 0, f"has an orchestrator id that is not a string ({run_id!r})")
    if not isinstance(shared, dict):
        raise _bad(where, 0, "has no shared state object")
    state = RunState(
        kind=kind, task=task, pending=list(pending), shared=copy.deepcopy(shared), run_id=run_id
    )
    for index in range(1, len(records)):
        record = records[index]
        kind = record.get("t")
        if kind == "agent":  # a node agent's state: fold_agent's, not the run's
            if not _agent_record_ok(record):
                raise _bad(where, index, "is a malformed agent record")
            continue
        if state.status != "running":
            raise _bad(where, index, "follows the end of the run")
        if kind == "node":
            node, result, pending = record.get("node"), record.get("result"), record.get("pending")
            if not isinstance(node, str) or not isinstance(result, str) or not _strings(pending):
                raise _bad(where, index, "is a malformed node record")
            state.order.append(node)
            state.results[node] = result
            state.pending = list(pending)
            if "shared" in record:
                if not isinstance(record["shared"], dict):
                    raise _bad(where, index, "has a shared state that is not an object")
                state.shared = copy.deepcopy(record["shared"])
            if "handoff" in record:
                handoff = record["handoff"]
                if not isinstance(handoff, dict) or not all(
                    isinstance(handoff.get(k), str) for k in ("from", "to", "message")
                ):
                    raise _bad(where, index, "has a malformed handoff")
                state.handoffs.append(
                    {"from": handoff["from"], "to": handoff["to"], "message": handoff["message"]}
                )
        elif kind == "end":
            status, error = record.get("status"), record.get("error")
            if status not in ("completed", "failed") or not (
                error is None or isinstance(error, str)
            ):
                raise _bad(where, index, "is a malformed end record")
            state.status, state.error = status, error
        else:
            raise _bad(where, index, f"has an unknown type {kind!r}")
    return state


def reachable(successors: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    """For each node, the nodes reachable from it by one edge or more."""
    return {start: _reached(successors, start) for start in successors}


def _reached(successors: Mapping[str, Sequence[str]], start: str) -> frozenset[str]:
    seen: set[str] = set()
    stack = list(successors[start])
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(successors.get(node, ()))
    return frozenset(seen)


class LazyReach(Mapping[str, frozenset[str]]):
    """:func:`reachable` of ``successors``, each node's set made when first looked up.

    The scheduler only looks up nodes pending beside others (branches, joins), so a
    chain of n nodes makes none of the n sets that :func:`reachable` would (n² in all).
    """

    def __init__(self, successors: Mapping[str, Sequence[str]]) -> None:
        self._successors = successors
        self.made: dict[str, frozenset[str]] = {}

    def __getitem__(self, node: str) -> frozenset[str]:
        found = self.made.get(node)
        if found is None:
            if node not in self._successors:
                raise KeyError(node)
            found = self.made[node] = _reached(self._successors, node)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._successors)

    def __len__(self) -> int:
        return len(self._successors)


def ready_nodes(
    pending: Sequence[str],
    predecessors: Mapping[str, Sequence[str]],
    reach: Mapping[str, frozenset[str]],
    rank: Mapping[str, int],
) -> list[str]:
    """The pending nodes that may run now, in the order the nodes were added.

    A pending node waits while one of its predecessors may still complete: that
    predecessor is pending itself, or reachable from another pending node. So a join
    runs once every branch leading to it has run, and a branch not taken (its edge's
    condition was false, so it was never activated) is not waited for. When every
    pending node waits on another (a cycle), the first one added runs, so the run
    always moves on.
    """
    ready = []
    for node in pending:
        blockers: set[str] = set()
        for other in pending:
            if other != node:
                blockers.add(other)
                blockers |= reach.get(other, frozenset())
        if not blockers.intersection(predecessors.get(node, ())):
            ready.append(node)
    if not ready and pending:
        ready = [min(pending, key=lambda n: rank[n])]
    return sorted(ready, key=lambda n: rank[n])
