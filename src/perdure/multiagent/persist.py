"""Where an orchestrator's run is kept: a SnapshotSessionManager, a Session, or nowhere.

Every orchestrator persists the same way (SPEC §8.1): the run's records
(:mod:`perdure.multiagent.run`) are saved after every node (``"node"``) or at the
end of the invocation only (``"invocation"``), and read back on the first invocation
of a rebuilt orchestrator. A node agent's own history is saved before the record of
its node, so a record never points at an agent state that was not kept.

* :class:`~perdure.session.SnapshotSessionManager`: the records are the
  orchestrator's ``snapshot_latest`` (``sessions/<sid>/multi_agents/<id>/``, one
  append per save on a local file). A node agent without a session manager of its
  own is kept in the run too: before its node's record goes an ``agent`` record
  (``SnapshotSessionManager.node_agent_record``) with the messages it gained since
  its last one and its other fields, so that a node costs one append however many
  agents the orchestrator has — a first save of its own would create a file (three
  fsyncs). When a new run starts, what the old one held of each agent is carried
  into it, and an agent whose carried messages pass :data:`CARRY_MAX` is saved
  instead as that session's agent ``agent.agent_id`` (its own ``latest``), which
  its later records build on — so node agents need distinct ids. An agent is
  restored from its own ``latest``, then from the run's records of it.
A node completes when its record is saved. A crash before that (during the node)
runs the node again on resume: then that agent's history may hold the interrupted
attempt too, if it was saved. A crash after it never runs the node again.

* :class:`~perdure.session.Session`: the records are the messages of the session's
  history (one message per record, its text the record's JSON), committed to the
  session's store under its writer lock. A node agent without a session manager of
  its own is kept in the run as with a snapshot manager (an ``agent`` record before
  its node's record, in the same commit), through the Session's filters; a session
  has no place of its own for it, so a new run carries each such agent's whole
  history into its first commit (its cost grows with those histories, not with the
  number of runs before). Node agents need distinct ids here too.

  A session holds **one** run: its history is that run. The run's start record names
  the orchestrator (kind and id), and a graph or swarm given a session that holds the
  run of another — another ``graph_id`` / ``swarm_id``, or a graph's run met by a
  swarm — is refused with :class:`~perdure.errors.SessionMismatchError` naming both,
  whether that run is finished or not: resuming it would report another
  orchestrator's results, and starting a new run would overwrite them. (With a
  snapshot manager each id has a ``multi_agents/<id>/`` of its own, so several
  orchestrators share a session; a graph and a swarm of one id are refused the
  same way.) A session that holds something else than a run (an agent's
  conversation) is refused with the same error; run records that are damaged raise
  :class:`~perdure.errors.SessionCorruptedError`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perdure.agent import Agent, Snapshot, SnapshotField
from perdure.errors import (
    SessionCorruptedError,
    SessionMismatchError,
    SessionNotFoundError,
    SnapshotError,
)
from perdure.hygiene.filters import FilterChain
from perdure.multiagent.run import agent_records, fold_agent
from perdure.session.session import Session
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.types import Message, encode_bytes_values
from perdure.types.json import compact_json

__all__ = ["RunStore", "run_store", "session_run_records"]

Strategy = Literal["node", "invocation"]


class RunStore:
    """Keeps nothing: an orchestrator without a session manager."""

    strategy: Strategy = "invocation"
    durable = False
    # Where the run is kept, as an error names it; and whether that place holds one
    # run, whatever its orchestrator's id (a Session), or one per id.
    where = "nowhere"
    single_run = False

    async def load(self) -> list[dict[str, Any]] | None:
        """The stored records of the run, or ``None``."""
        return None

    async def save(self, records: Sequence[Mapping[str, Any]], *, fresh: bool) -> None:
        """Store ``records`` (the whole run; ``fresh``: a new run replaces the old)."""

    async def restore_agent(self, agent: Agent) -> None:
        """Bring a node agent back as it was saved (after :meth:`load`)."""

    async def save_agent(self, agent: Agent) -> dict[str, Any] | None:
        """Save a node agent after its node; or return the record that keeps it in the run.

        A returned record must go into the run before the record of the node.
        """
        return None

    async def carry_agents(
        self, records: Sequence[Mapping[str, Any]], agents: Sequence[Agent]
    ) -> list[dict[str, Any]]:
        """The records a new run starts with, after its start, to keep what ``records`` held.

        ``records`` are the run that ends; ``agents`` the node agents.
        """
        return []

    def holding(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held for a whole invocation (a writer lock, where the store has one)."""
        return contextlib.nullcontext()


# Messages of a node agent carried from one run into the next before they go into
# the agent's own ``latest`` instead: a new run's first save rewrites at most this
# many of each agent's messages.
CARRY_MAX = 64


@dataclass(frozen=True)
class _Ends:
    """The first ``count`` messages of a history, known by their first and last
    (held, compared by identity)."""

    count: int
    first: Any = None
    last: Any = None

    @classmethod
    def of(cls, messages: Sequence[Any]) -> _Ends:
        return cls(len(messages), *((messages[0], messages[-1]) if messages else ()))

    def begin(self, messages: Sequence[Any]) -> bool:
        """``messages`` still begins with these."""
        return self.count == 0 or (
            len(messages) >= self.count
            and messages[0] is self.first
            and messages[self.count - 1] is self.last
        )


class _AgentsInRun(RunStore):
    """A store that keeps node agents in the run's records (``agent`` records).

    Each agent without a session manager of its own goes into the run as the
    messages it gained since its last record and its other fields, before the
    record of its node; a subclass says how a record is made and applied, and
    whether the agent has a ``latest`` of its own to start from and to move a long
    history into.
    """

    durable = True

    def __init__(self, run_name: str) -> None:
        self.run_name = run_name  # what a damaged record's error calls the run
        self.loaded: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
        # Per node agent id: the messages stored in all (its latest and the run's
        # records of it), and those of them in its own latest.
        self.stored: dict[str, _Ends] = {}
        self.in_latest: dict[str, _Ends] = {}

    def _loaded(self, records: Sequence[Mapping[str, Any]]) -> None:
        self.loaded, self.stored, self.in_latest = agent_records(records), {}, {}

    async def _restore_own(self, agent: Agent) -> bool:
        """Restore ``agent`` from a ``latest`` of its own; whether one was found."""
        return False

    async def _save_own(self, agent: Agent) -> bool:
        """Save ``agent`` into a ``latest`` of its own; ``False``: there is none."""
        return False

    def _agent_record(self, agent: Agent, start: int) -> dict[str, Any]:
        """The record of ``agent``'s messages from ``start`` on and its other fields."""
        raise NotImplementedError

    def _apply(self, agent: Agent, messages: list[Any], fields: Mapping[str, Any]) -> None:
        """Put the state the run's records hold into ``agent``."""
        raise NotImplementedError

    async def restore_agent(self, agent: Agent) -> None:
        if agent.session_manager is not None:
            return
        found = await self._restore_own(agent)
        # What the agent held before, when nothing was stored, is not stored.
        history = agent.messages if found else []
        self.in_latest[agent.agent_id] = _Ends.of(history)
        messages, fields = fold_agent(
            self.loaded.get(agent.agent_id, []), agent.agent_id, history, self.run_name
        )
        if fields is not None:
            self._apply(agent, messages, fields)
            found = True
        self.stored[agent.agent_id] = _Ends.of(agent.messages) if found else _Ends(0)

    def _record(self, agent: Agent, since: _Ends | None) -> dict[str, Any]:
        """The agent's record from ``since`` on (from its first message if it moved)."""
        start = since.count if since is not None and since.begin(agent.messages) else 0
        record = self._agent_record(agent, start)
        # Counted as stored now: if the save fails, the orchestrator loads the run
        # again, and this with it.
        self.stored[agent.agent_id] = _Ends.of(agent.messages)
        if start == 0:
            self.in_latest[agent.agent_id] = _Ends(0)
        return record

    async def save_agent(self, agent: Agent) -> dict[str, Any] | None:
        if agent.session_manager is not None:
            return None
        return self._record(agent, self.stored.get(agent.agent_id))

    async def carry_agents(
        self, records: Sequence[Mapping[str, Any]], agents: Sequence[Agent]
    ) -> list[dict[str, Any]]:
        held = {r.get("agent") for r in records if r.get("t") == "agent"}
        present = {agent.agent_id for agent in agents}
        # An agent no node has now (the graph changed) keeps its records as they
        # are, so that it comes back whole if a node has it again.
        carried = [
            dict(r) for r in records if r.get("t") == "agent" and r.get("agent") not in present
        ]
        for agent in agents:
            if agent.session_manager is not None or agent.agent_id not in held:
                continue
            base = self.in_latest.get(agent.agent_id)
            if base is None or not base.begin(agent.messages):
                base = _Ends(0)
            if len(agent.messages) - base.count > CARRY_MAX and await self._save_own(agent):
                # Into the agent's own latest; the new run holds nothing of it.
                self.stored[agent.agent_id] = self.in_latest[agent.agent_id] = _Ends.of(
                    agent.messages
                )
                continue
            carried.append(self._record(agent, base))
        return carried


class _SnapshotRunStore(_AgentsInRun):
    def __init__(self, manager: SnapshotSessionManager, orchestrator_id: str) -> None:
        super().__init__(orchestrator_id)
        self.manager = manager
        self.orchestrator_id = orchestrator_id
        self.strategy = manager.multi_agent_save_latest_on
        self.where = f"session {manager.session_id!r} (multi_agents/{orchestrator_id})"

    async def load(self) -> list[dict[str, Any]] | None:
        records = await self.manager.restore_multi_agent(self.orchestrator_id)
        self._loaded(records or [])
        return records

    async def save(self, records: Sequence[Mapping[str, Any]], *, fresh: bool) -> None:
        await self.manager.save_multi_agent(self.orchestrator_id, records)

    async def _restore_own(self, agent: Agent) -> bool:
        return await self.manager.restore_snapshot(agent)

    async def _save_own(self, agent: Agent) -> bool:
        await self.manager.save_snapshot(agent, is_latest=True)
        return True

    def _agent_record(self, agent: Agent, start: int) -> dict[str, Any]:
        return self.manager.node_agent_record(agent, start)

    def _apply(self, agent: Agent, messages: list[Any], fields: Mapping[str, Any]) -> None:
        self.manager.apply_node_agent(agent, messages, fields, self.orchestrator_id)


def _record_of(message: Message) -> dict[str, Any]:
    """The run record a message holds (its text, a JSON object).

    Raises:
        ValueError, KeyError, IndexError, TypeError: it holds none.
    """
    record = json.loads(message["content"][0]["text"])
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record


def _starts_a_run(message: Message) -> bool:
    """``message`` is a run's start record (of any format: :func:`replay` checks it)."""
    try:
        return _record_of(message).get("t") == "start"
    except (KeyError, IndexError, TypeError, ValueError, RecursionError):
        return False


def session_run_records(messages: Sequence[Message], session_id: str) -> list[dict[str, Any]]:
    """The records of the run a Session holds: one per message, its text the JSON.

    A history whose first message is not a start record is not a run (an agent's
    conversation, say): that is told apart from a run whose later records are
    damaged, which a store's own checks let through only if written so.

    Raises:
        SessionMismatchError: the first message is not a run's start record.
        SessionCorruptedError: a later message is not a record (its index is named).
    """
    if messages and not _starts_a_run(messages[0]):
        raise _not_a_run(session_id, "its first message is not a run's start record")
    records: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        try:
            record = _record_of(message)
        except (KeyError, IndexError, TypeError, ValueError, RecursionError) as exc:
            raise SessionCorruptedError(
                f"orchestrator run in session {session_id!r}: message {index} is "
                f"not a run record ({exc})"
            ) from exc
        records.append(record)
    return records


def _not_a_run(session_id: str, why: str) -> SessionMismatchError:
    return SessionMismatchError(
        f"session {session_id!r} holds no graph or swarm run ({why}; an agent's "
        "conversation?): give the orchestrator a session of its own",
        details={"session_id": session_id},
    )


def _as_message(record: Mapping[str, Any], filters: FilterChain, session_id: str) -> Message:
    """A record as a message, its values through the session's filters first."""
    if filters:  # as values (as agent state is), so a replacement never breaks the JSON
        record = filters.state(dict(record), "session", session_id)
    text = compact_json(record)
    return {"role": "user", "content": [{"text": text}]}


class _SessionRunStore(_AgentsInRun):
    strategy: Strategy = "node"
    single_run = True

    def __init__(self, session: Session) -> None:
        super().__init__(session.session_id)
        self.store = session.store
        self.session_id = session.session_id
        self.filters = session.filters
        self.where = f"session {session.session_id!r}"
        self.messages: list[Message] = []
        self.records: list[Mapping[str, Any]] = []
        self.tail: str | None = None
        self.exists = False

    async def load(self) -> list[dict[str, Any]] | None:
        """The run the session holds (``None``: none yet).

        Raises:
            SessionMismatchError: the session holds something else (an agent's
                conversation: its agent state, or a first message that starts no run).
            SessionCorruptedError: a run record is damaged.
        """
        try:
            stored = await self.store.get(self.session_id)
        except SessionNotFoundError:
            return None
        if stored.agent_state:  # a run is only messages; an agent's session has state
            raise _not_a_run(self.session_id, "it holds an agent's state")
        self.exists, self.tail = True, stored.tail
        self.messages = list(stored.messages)
        records = session_run_records(self.messages, self.session_id)
        self.records = list(records)
        self._loaded(records)
        return records or None

    def _agent_record(self, agent: Agent, start: int) -> dict[str, Any]:
        # The fields as a snapshot without messages, as a snapshot manager keeps
        # them; the messages through the session's filters as messages (the whole
        # record then goes through them as agent state, in _as_message).
        messages: Sequence[Message] = agent.messages[start:]
        if self.filters:
            messages = self.filters.messages(messages, "session", self.session_id)
        fields = agent.take_snapshot(preset="session", exclude=[SnapshotField.messages])
        return {
            "t": "agent",
            "agent": agent.agent_id,
            "from": start,
            "messages": encode_bytes_values(list(messages)),
            "fields": fields.to_dict(),
        }

    def _apply(self, agent: Agent, messages: list[Any], fields: Mapping[str, Any]) -> None:
        # Everything is checked before the agent changes.
        history = list(messages)
        try:
            snapshot = Snapshot.from_dict(dict(fields))
            snapshot.data[SnapshotField.messages.value] = history
            snapshot.validate()
        except (SnapshotError, ValueError, RecursionError) as exc:
            raise SessionCorruptedError(
                f"orchestrator run in {self.where}: the state of agent {agent.agent_id!r} "
                f"is damaged ({exc})"
            ) from exc
        del snapshot.data[SnapshotField.messages.value]
        agent.load_snapshot(snapshot)
        agent.messages = history

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
    """Refuse node agents a run store would keep over each other.

    Raises:
        ValueError: two agents without a session manager of their own share an
            ``agent_id`` (the message names it).
    """
    if not isinstance(store, _AgentsInRun):
        return
    keeper = "a Session" if isinstance(store, _SessionRunStore) else "a SnapshotSessionManager"
    seen: set[str] = set()
    for agent in agents:
        if agent.session_manager is not None:
            continue
        if agent.agent_id in seen:
            raise ValueError(
                f"two {what} agents have agent_id {agent.agent_id!r}: with {keeper} "
                "each node agent is saved under its agent_id, so give them distinct ones"
            )
        seen.add(agent.agent_id)
