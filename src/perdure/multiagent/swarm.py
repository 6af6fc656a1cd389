"""Swarm: agents that hand a task to each other, with a shared context (SPEC §8.1).

Each agent (told apart by ``Agent(name=...)``) gets a ``handoff`` tool whose input is
``{"agent": <name>, "message": <text>}``, optionally with ``"context": {…}`` merged
into the swarm's shared context. A ``handoff`` call ends the active agent's turn at
once (its model is not called again) and makes the named agent active; the swarm
ends when the active agent answers without one. A hand-off past ``max_handoffs`` is
refused: the agent's ``handoff`` call gets an error result saying so, its turn ends,
and the run ends as failed; the refused hand-off is not one of
:attr:`SwarmResult.handoffs`.

An active agent that pauses (its turn ends with ``stop_reason`` ``"interrupt"`` or
``"checkpoint"``) has not finished its turn: the invocation returns
``status="interrupted"`` with its result in :attr:`SwarmResult.paused`, the turn is
not recorded, and calling again with the same task goes on with that agent, as in a
graph (:mod:`perdure.multiagent.graph`): answers as ``responses=[{"interruptResponse":
…}]``, a checkpoint resumed. A turn that both hands off and pauses is taken as a
hand-off (the handoff tool's result is already in the agent's history).

With a session manager the run is saved after every agent's turn (``"node"``) or at
the end (``"invocation"``); a rebuilt swarm resumes an unfinished run with the agent
that was handed the task last, the shared context and every agent's history as they
were saved. An agent's turn that was in flight at a crash runs again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from perdure._runtime.loop import run_sync
from perdure.agent import Agent, AgentResult
from perdure.multiagent.graph import (
    PAUSED_STOP_REASONS,
    Status,
    answering,
    check_answered,
    invocation_answers,
    run_node_agent,
)
from perdure.multiagent.orchestrator import Orchestrator
from perdure.multiagent.persist import RunStore, check_agent_ids, run_store
from perdure.multiagent.run import RunState, end_record, node_record
from perdure.session.ids import validate_session_id
from perdure.tools import Interrupt, ToolContext
from perdure.types import ToolResult, ToolSpec, ToolUse
from perdure.types.json import validate_storable

__all__ = ["HANDOFF_TOOL", "Swarm", "SwarmResult"]

HANDOFF_TOOL = "handoff"


@dataclass(frozen=True)
class SwarmResult:
    """What a swarm invocation returns.

    Attributes:
        status: ``"completed"``, ``"failed"``, or ``"interrupted"`` (the active
            agent paused: see :attr:`paused`; the run goes on when called again).
        node_history: the names of the agents in the order their turns ended.
        results: each agent's last output text.
        context: the shared context at the end.
        handoffs: every hand-off made, ``{"from", "to", "message"}`` (not one
            refused by ``max_handoffs``).
        error: why it failed (``None`` unless failed).
        paused: the active agent's name and its paused result (``stop_reason``,
            ``interrupts``, ``checkpoint``), when it paused.
    """

    status: Status
    node_history: list[str]
    results: dict[str, str]
    context: dict[str, Any] = field(default_factory=dict)
    handoffs: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    paused: dict[str, AgentResult] = field(default_factory=dict)

    @property
    def interrupts(self) -> list[Interrupt]:
        """The questions the paused agent waits on, to answer with ``responses=``."""
        return [i for result in self.paused.values() for i in result.interrupts]

    def __str__(self) -> str:
        return self.results.get(self.node_history[-1], "") if self.node_history else ""


class _HandoffTool:
    """The ``handoff`` tool of one agent of a swarm."""

    def __init__(self, swarm: Swarm, owner: str) -> None:
        self._swarm = swarm
        self._owner = owner

    @property
    def tool_name(self) -> str:
        return HANDOFF_TOOL

    @property
    def tool_spec(self) -> ToolSpec:
        others = [name for name in self._swarm.agent_names if name != self._owner]
        return {
            "name": HANDOFF_TOOL,
            "description": (
                "Hand the task off to another agent of the team, who goes on from here; "
                f"your turn ends at once. Agents: {', '.join(others)}."
            ),
            "inputSchema": {
                "json": {
                    "type": "object",
                    "properties": {
                        "agent": {"type": "string", "enum": others},
                        "message": {"type": "string", "description": "what they should do"},
                        "context": {
                            "type": "object",
                            "description": "facts to add to the team's shared context",
                        },
                    },
                    "required": ["agent", "message"],
                }
            },
        }

    async def invoke(self, tool_use: ToolUse, context: ToolContext) -> ToolResult:
        def answer(status: Literal["success", "error"], text: str) -> ToolResult:
            return {
                "toolUseId": tool_use["toolUseId"],
                "status": status,
                "content": [{"text": text}],
            }

        given = tool_use["input"]
        if not isinstance(given, dict):
            return answer("error", "the input must be an object with 'agent' and 'message'")
        target, message, extra = given.get("agent"), given.get("message"), given.get("context", {})
        if target not in self._swarm.agent_names or target == self._owner:
            others = [n for n in self._swarm.agent_names if n != self._owner]
            return answer("error", f"unknown agent {target!r}; hand off to one of {others}")
        if not isinstance(message, str):
            return answer("error", "'message' must be a string")
        if not isinstance(extra, dict):
            return answer("error", "'context' must be an object")
        try:
            validate_storable(extra, "context")
        except (TypeError, ValueError) as exc:
            return answer("error", str(exc))
        swarm = self._swarm
        if swarm._handoff is not None or swarm._refused is not None:
            return answer("error", "you handed off already in this turn")
        if swarm._handoffs_made >= swarm.max_handoffs:
            swarm._refused = target
            context.agent.cancel()  # the swarm stops: the turn ends as a hand-off's would
            return answer("error", f"Hand-off to {target} refused: {swarm._limit_reason()}")
        swarm._handoff = ({"from": self._owner, "to": target, "message": message}, extra)
        context.agent.cancel()  # ends the turn once the tool results are in
        return answer("success", f"Handed off to {target}.")


class Swarm(Orchestrator[SwarmResult]):
    """Agents that hand a task to each other (see the module docstring).

    Args:
        agents: the agents, with distinct names; each gets a ``handoff`` tool.
        entry: the agent (or its name) that starts; default the first.
        max_handoffs: hand-offs allowed in one run; one more is refused and fails
            the run.
        session_manager: a :class:`~perdure.session.SnapshotSessionManager`, a
            :class:`~perdure.session.Session`, or ``None``.
        swarm_id: names the swarm's run inside the session.

    Raises:
        ValueError: no agents, two with one name, an unknown entry, a bad
            ``max_handoffs``, an agent that already has a ``handoff`` tool or is in
            another swarm.
        TypeError: an agent that is not an :class:`~perdure.agent.Agent`.
    """

    kind = "swarm"

    def __init__(
        self,
        agents: Sequence[Agent],
        entry: Agent | str | None = None,
        max_handoffs: int = 20,
        session_manager: object = None,
        *,
        swarm_id: str = "swarm",
    ) -> None:
        agents = list(agents)
        if not agents:
            raise ValueError("a swarm needs at least one agent")
        for agent in agents:
            if not isinstance(agent, Agent):
                raise TypeError(f"swarm agents must be Agents, got {type(agent).__name__}")
        names = [a.name for a in agents]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"swarm agents need distinct names (Agent(name=...)): {duplicates}")
        if isinstance(max_handoffs, bool) or not isinstance(max_handoffs, int) or max_handoffs < 0:
            raise ValueError(f"max_handoffs must be an int >= 0, got {max_handoffs!r}")
        entry_name = entry.name if isinstance(entry, Agent) else (entry or names[0])
        if entry_name not in names:
            raise ValueError(f"entry {entry_name!r} is not an agent of the swarm ({names})")
        validate_session_id(swarm_id, "swarm_id")
        for agent in agents:
            if agent.tool_registry.get(HANDOFF_TOOL) is not None:
                raise ValueError(
                    f"agent {agent.name!r} already has a tool named {HANDOFF_TOOL!r} "
                    "(is it in another swarm?)"
                )
        store: RunStore = run_store(session_manager, swarm_id)
        check_agent_ids(agents, store, "swarm")
        super().__init__(store, swarm_id)
        self.swarm_id = swarm_id
        self.entry = entry_name
        self.max_handoffs = max_handoffs
        self._agents = {a.name: a for a in agents}
        for agent in agents:
            agent.tool_registry.register(_HandoffTool(self, agent.name))
        # Set by the active agent's handoff tool during its turn:
        self._handoff: tuple[dict[str, str], dict[str, Any]] | None = None
        self._refused: str | None = None  # the target of a hand-off max_handoffs refused
        self._handoffs_made = 0  # in the run, before this turn

    @property
    def agent_names(self) -> list[str]:
        """The agents' names, in the order given."""
        return list(self._agents)

    def _node_agents(self) -> list[Agent]:
        return list(self._agents.values())

    def _limit_reason(self) -> str:
        if self.max_handoffs == 0:
            return "this swarm allows no hand-off (max_handoffs=0); the swarm stops here"
        return (
            f"this swarm allows {_handoffs(self.max_handoffs)} (max_handoffs), all made; "
            "the swarm stops here"
        )

    def __call__(
        self, task: str, *, responses: Sequence[Mapping[str, Any]] | None = None
    ) -> SwarmResult:
        """Run (or resume) on ``task``; the sync face of :meth:`invoke_async`."""
        return run_sync(
            self.invoke_async(task, responses=responses), async_name="swarm.invoke_async(task)"
        )

    async def invoke_async(
        self, task: str, *, responses: Sequence[Mapping[str, Any]] | None = None
    ) -> SwarmResult:
        """Run on ``task``, or resume the unfinished run of that task.

        Args:
            task: the task.
            responses: ``interruptResponse`` blocks answering the interrupts the
                paused agent waits on (:attr:`SwarmResult.interrupts`).

        Raises:
            ValueError: ``responses`` is malformed, or names an interrupt the paused
                agent does not wait on; and see :meth:`Orchestrator.invoke_async
                <perdure.multiagent.orchestrator.Orchestrator.invoke_async>`.
        """
        with answering(responses):
            return await super().invoke_async(task)

    async def _invoke(self, task: str) -> SwarmResult:
        records, state, fresh = await self._begin(task, self.entry)
        store = self._store
        check_answered(
            invocation_answers(),
            [self._agents[n] for n in state.pending[:1] if n in self._agents],
            f"swarm {self.swarm_id!r}",
        )
        while state.pending:
            name = state.pending[0]
            if name not in self._agents:
                raise ValueError(
                    f"the stored run of swarm {self.swarm_id!r} hands off to {name!r}, "
                    f"which is not one of its agents ({self.agent_names})"
                )
            agent = self._agents[name]
            self._handoff, self._refused = None, None
            self._handoffs_made = len(state.handoffs)
            try:
                result = await run_node_agent(agent, _prompt(state, name), invocation_answers())
            except Exception as exc:  # the run stays unfinished: calling again retries
                error = f"agent {name!r} failed: {type(exc).__name__}: {exc}"
                if store.strategy == "invocation":
                    await self._save(records, fresh=fresh, final=True)
                return _result(state, "failed", error)
            text = str(result)
            handoff: dict[str, str] | None = None
            extra: dict[str, Any] = {}
            if self._handoff is not None:
                handoff, extra = self._handoff
            refused, self._handoff, self._refused = self._refused, None, None
            if handoff is None and refused is None and result.stop_reason in PAUSED_STOP_REASONS:
                # Not a finished turn: no record; the agent, paused, is kept with the
                # run, and the next invocation goes on with it.
                if store.strategy == "node":
                    kept = await store.save_agent(agent)
                    if kept is not None:
                        records.append(kept)
                await self._save(records, fresh=fresh, final=True)
                return _result(state, "interrupted", None, paused={name: result})
            if store.strategy == "node":
                kept = await store.save_agent(agent)  # the agent before its turn's record
                if kept is not None:
                    records.append(kept)
            state.order.append(name)
            state.results[name] = text
            before = copy.deepcopy(state.shared)
            state.shared.update(copy.deepcopy(extra))
            shared = state.shared if state.shared != before else None
            over = refused is not None
            state.pending = [handoff["to"]] if handoff is not None else []
            if handoff is not None:
                state.handoffs.append(handoff)
            records.append(node_record(name, text, state.pending, shared=shared, handoff=handoff))
            if refused is not None:
                state.status = "failed"
                if self.max_handoffs == 0:
                    state.error = (
                        f"max_handoffs (0): {name!r} tried to hand off to {refused!r}, but "
                        "this swarm allows no hand-off"
                    )
                else:
                    state.error = (
                        f"max_handoffs ({self.max_handoffs}) reached: {name!r} tried to hand "
                        f"off to {refused!r} after {_handoffs(len(state.handoffs))}"
                    )
                records.append(end_record("failed", state.error))
            await self._save(records, fresh=fresh, final=over)
            fresh = False
            if over:
                return _result(state, "failed", state.error)
        records.append(end_record("completed"))
        state.status = "completed"
        await self._save(records, fresh=fresh, final=True)
        return _result(state, "completed", None)

    async def _save(self, records: list[dict[str, Any]], *, fresh: bool, final: bool) -> None:
        store = self._store
        if store.strategy == "invocation":
            if not final:
                return
            for agent in self._agents.values():
                kept = await store.save_agent(agent)
                if kept is not None:
                    records.append(kept)
        await store.save(records, fresh=fresh)


def _handoffs(count: int) -> str:
    return f"{count} hand-off" if count == 1 else f"{count} hand-offs"


def _prompt(state: RunState, name: str) -> str:
    """What the active agent is told: the task, and how it came to it."""
    if not state.handoffs:
        return state.task
    last = state.handoffs[-1]
    path = " -> ".join([*state.order, name])
    parts = [
        state.task,
        f"{last['from']} handed this task to you ({name}): {last['message']}",
        f"Agents so far: {path}",
    ]
    if state.shared:
        parts.append("Shared context: " + json.dumps(state.shared, sort_keys=True))
    return "\n\n".join(parts)


def _result(
    state: RunState,
    status: Status,
    error: str | None,
    *,
    paused: Mapping[str, AgentResult] | None = None,
) -> SwarmResult:
    return SwarmResult(
        status=status,
        node_history=list(state.order),
        results=dict(state.results),
        context=copy.deepcopy(state.shared),
        handoffs=[dict(h) for h in state.handoffs],
        error=error,
        paused=dict(paused or {}),
    )
