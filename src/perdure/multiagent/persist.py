"""Where an orchestrator's run is kept: a SnapshotSessionManager, a Session, or nowhere.

Every orchestrator persists the same way (SPEC §8.1): the run's records
(:mod:`perdure.multiagent.run`) are saved after every node (``"node"``) or at the
end of the invocation only (``"invocation"``), and read back on the first invocation
of a rebuilt orchestrator. A node agent's own history is saved before the record of
its node, so a record never points at an agent state that was not kept.

* :class:`~perdure.session.SnapshotSessionManager`: the records are the
  orchestrator's ``snapshot_latest`` (``sessions/<sid>/multi_agents/<id>/``, one
  append per save on a local file), and a node agent without a session manager of
  its own is saved and restored as that session's agent ``agent.agent_id`` — so node
  agents need distinct ids.
A node completes when its record is saved. A crash before that (during the node, or
between its agent's save and its record's) runs the node again on resume: then that
agent's history may hold the interrupted attempt too, as it was saved. A crash
after it never runs the node again.

* :class:`~perdure.session.Session`: the records are the messages of the session's
  history (one message per record, its text the record's JSON), committed to the
  session's store under its writer lock; each node agent persists through a session
  manager of its own, if it has one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from perdure.agent import Agent
from perdure.errors import SessionCorruptedError, SessionNotFoundError
from perdure.hygiene.filters import FilterChain
from perdure.session.session import Session
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.types import Message

__all__ = ["RunStore", "run_store"]

Strategy = Literal["node", "invocation"]


class RunStore:
    """Keeps nothing: an orchestrator without a session manager."""

    strategy: Strategy = "invocation"
    durable = False

    async def load(self) -> list[dict[str, Any]] | None:
        """The stored records of the run, or ``None``."""
        return None

    async def save(self, records: Sequence[Mapping[str, Any]], *, fresh: bool) -> None:
        """Store ``records`` (the whole run; ``fresh``: a new run replaces the old)."""

    async def restore_agent(self, agent: Agent) -> None:
        """Bring a node agent back as it was saved."""

    async def save_agent(self, agent: Agent) -> None:
        """Save a node agent after its node."""

    def holding(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held for a whole invocation (a writer lock, where the store has one)."""
        return contextlib.nullcontext()


class _SnapshotRunStore(RunStore):
    durable = True

    def __init__(self, manager: SnapshotSessionManager, orchestrator_id: str) -> None:
        self.manager = manager
        self.orchestrator_id = orchestrator_id
        self.strategy = manager.multi_agent_save_latest_on

    async def load(self) -> list[dict[str, Any]] | None:
        return await self.manager.restore_multi_agent(self.orchestrator_id)

    async def save(self, records: Sequence[Mapping[str, Any]], *, fresh: bool) -> None:
        await self.manager.save_multi_agent(self.orchestrator_id, records)

    async def restore_agent(self, agent: Agent) -> None:
        if agent.session_manager is None:
            await self.manager.restore_snapshot(agent)

    async def save_agent(self, agent: Agent) -> None:
        if agent.session_manager is None:
            await self.manager.save_snapshot(agent, is_latest=True)


def _as_message(record: Mapping[str, Any], filters: FilterChain, session_id: str) -> Message:
    """A record as a message, its values through the session's filters first."""
    if filters:  # as values (as agent state is), so a replacement never breaks the JSON
        record = filters.state(dict(record), "session", session_id)
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return {"role": "user", "content": [{"text": text}]}


class _SessionRunStore(RunStore):
    durable = True
    strategy: Strategy = "node"

    def __init__(self, session: Session) -> None:
        self.store = session.store
        self.session_id = session.session_id
        self.filters = session.filters
        self.messages: list[Message] = []
        self.records: list[Mapping[str, Any]] = []
        self.tail: str | None = None
        self.exists = False

    async def load(self) -> list[dict[str, Any]] | None:
        try:
            stored = await self.store.get(self.session_id)
        except SessionNotFoundError:
            return None
        self.exists, self.tail = True, stored.tail
        self.messages = list(stored.messages)
        records: list[dict[str, Any]] = []
        for index, message in enumerate(self.messages):
            try:
                record = json.loads(message["content"][0]["text"])
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise SessionCorruptedError(
                    f"orchestrator run in session {self.session_id!r}: message {index} is "
                    f"not a run record ({exc})"
                ) from exc
            records.append(record)
        self.records = list(records)
        return records or None

    async def save(self, records: Sequence[Mapping[str, Any]], *, fresh: bool) -> None:
        if not self.exists:
            await self.store.create(self.session_id, exist_ok=True)
            self.exists = True
        old = self.records
        if (
            not fresh
            and len(old) == len(self.messages) <= len(records)
            and (not old or (records[0] is old[0] and records[len(old) - 1] is old[-1]))
        ):
            # Records appended to the same run: extend in place (a commit appends only
            # what the store does not hold, so its cost does not grow with the run).
            new = records[len(old) :]
            added = [_as_message(r, self.filters, self.session_id) for r in new]
            self.messages.extend(added)
            old.extend(new)
            try:
                done = await self.store.commit(
                    self.session_id, self.messages, expected_tail=self.tail
                )
            except BaseException:
                del self.messages[len(self.messages) - len(added) :]
                del old[len(old) - len(new) :]
                raise
            self.tail = done.tail
            return
        messages = [_as_message(r, self.filters, self.session_id) for r in records]
        done = await self.store.commit(
            self.session_id, messages, rewritten=True, expected_tail=self.tail
        )
        self.messages, self.records, self.tail = messages, list(records), done.tail

    def holding(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._held()

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        await self.store.create(self.session_id, exist_ok=True)
        self.exists = True
        async with self.store.writer_lock(self.session_id):
            yield


def run_store(session_manager: object, orchestrator_id: str) -> RunStore:
    """The run store for an orchestrator's ``session_manager`` argument.

    Raises:
        TypeError: it is neither ``None``, a ``SnapshotSessionManager`` nor a
            ``Session``.
    """
    if session_manager is None:
        return RunStore()
    if isinstance(session_manager, SnapshotSessionManager):
        return _SnapshotRunStore(session_manager, orchestrator_id)
    if isinstance(session_manager, Session):
        return _SessionRunStore(session_manager)
    raise TypeError(
        "session_manager must be a SnapshotSessionManager, a Session or None, "
        f"got {type(session_manager).__name__}"
    )


def check_agent_ids(agents: Sequence[Agent], store: RunStore, what: str) -> None:
    """Refuse node agents a snapshot manager would save over each other.

    Raises:
        ValueError: two agents without a session manager of their own share an
            ``agent_id`` (the message names it).
    """
    if not isinstance(store, _SnapshotRunStore):
        return
    seen: set[str] = set()
    for agent in agents:
        if agent.session_manager is not None:
            continue
        if agent.agent_id in seen:
            raise ValueError(
                f"two {what} agents have agent_id {agent.agent_id!r}: with a "
                "SnapshotSessionManager each node agent is saved under its agent_id, so "
                "give them distinct ones"
            )
        seen.add(agent.agent_id)
