"""SnapshotSessionManager: persist a whole agent as snapshots on any ``Storage`` (seed 003).

Two things are kept per agent (``sessions/<session_id>/agents/<agent_id>/``):

* ``latest`` — ``snapshot_latest``, saved per ``save_latest_on`` and restored when the
  agent is built;
* ``snapshots/<ULID>`` — immutable snapshots, appended when ``snapshot_trigger``
  returns ``True`` after an invocation or on ``save_snapshot(agent, is_latest=False)``;
  their ULID ids sort by creation time and are strictly increasing.

A save is incremental, not a rewrite: messages live in immutable, SHA-256-named
chunks (``chunks/<sha256>``) shared by ``latest`` and every snapshot; a manifest
points at them and carries only the open tail of recent messages (see
:mod:`perdure.snapshots.layout` for the layout and
:mod:`perdure.snapshots.format` for the blob format). On a storage that can append
(:func:`~perdure.storage.can_append`: ``LocalFileStorage``, ``MemoryStorage``, without a cipher)
``latest`` is a log instead (:mod:`perdure.snapshots.log`): a save appends one record
of what changed — on ``LocalFileStorage`` one write and one fsync — and the log is
started afresh, in one atomic replace, once it has grown long. Elsewhere a save of
``latest`` replaces one manifest. Either way its cost does not grow with the
history; a restore reads the chunks and checks every hash. Both formats restore
everywhere.

Guarantees:

* After a save returns, what it saved is durable (as durable as the ``Storage``).
* A crash (even SIGKILL) during a save leaves the previous state of ``latest`` or the
  new one, never one pointing at a missing chunk: chunks are written before what
  references them. (A crash in the middle of an append leaves a torn last record:
  it was never acknowledged, so the restore leaves it out, says so in a warning,
  and the next save starts the log afresh.)
* Damaged data raises :class:`~perdure.errors.SessionCorruptedError` (code
  ``session_store_corrupted``), an unknown format version
  :class:`~perdure.errors.SnapshotError`; never a silently empty agent.
* A ``latest`` that is missing while immutable snapshots exist (deleted by hand, or
  never saved because only ``save_snapshot(agent, is_latest=False)`` was called):
  an agent being built comes back from the newest immutable snapshot, and a warning
  says so on the ``perdure.snapshots.manager`` logger (what ``latest`` held
  after that snapshot is gone). It does not start empty. A ``latest`` that is
  present but damaged still raises, and nothing falls back.
* Deleting a snapshot or running :meth:`SnapshotSessionManager.collect_garbage`
  removes the chunks no manifest references, and a crash during it only leaves
  garbage behind.
* One writer per ``(session_id, agent_id)``: in one process every save, restore and
  collection of a manager is serialized (a thread lock, usable from any event loop).
  Every write of ``latest`` is conditional on ``latest`` being as this manager last
  read or wrote it — on an ``AppendStorage`` by the end of its log, on any other
  :class:`~perdure.storage.ConditionalStorage` (every perdure backend) by its
  version (``write_if``): a manager whose agent is stale (another process, or
  another manager, saved since) gets :class:`~perdure.errors.SessionConflictError`
  and writes nothing; restoring the agent picks up what is stored, and saving goes
  on from there. (A manager that never read ``latest`` — saving an agent it did not
  restore — replaces whatever is there, as it asked to.) Only on a third-party
  ``Storage`` that is neither are two processes writing the same agent
  last-writer-wins for ``latest``. Either way a collection in one process may delete
  chunks that a save in flight in another has written but not yet referenced; run
  collections from the writing process (or while no other process writes that
  agent).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, cast, runtime_checkable

from perdure._runtime.loop import run_sync
from perdure._runtime.threads import ProcessLock
from perdure.agent import Agent, Snapshot, SnapshotField
from perdure.crypto import Cipher, check_cipher
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SnapshotError,
    StorageConflictError,
    TurnRunningError,
)
from perdure.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    HookRegistry,
    MessageAddedEvent,
)
from perdure.hygiene.filters import FilterChain, PersistenceFilter
from perdure.models import ScriptedModel
from perdure.session.ids import validate_session_id
from perdure.session.ulid import MonotonicUlid, is_ulid
from perdure.snapshots.format import (
    Manifest,
    encode_json,
    fields_chunk,
    index_chunk,
    manifest_blob,
    sha256_hex,
)
from perdure.snapshots.io import (
    Loaded,
    collect,
    delete_all,
    gc_paused,
    list_all,
    load,
    read_latest,
    read_manifest,
    write_chunks,
)
from perdure.snapshots.layout import Layout, copy_message, plan_save
from perdure.snapshots.log import LatestEnd, LogState, append_record, end_of, new_log
from perdure.storage import (
    AppendStorage,
    ConditionalStorage,
    EncryptedStorage,
    LocalFileStorage,
    Storage,
    can_append,
)
from perdure.types import Message, encode_bytes_values, validate_message
from perdure.types.json import compact_json

__all__ = [
    "BidiAgentSaveLatestStrategy",
    "HoldsAgent",
    "MultiAgentSaveLatestStrategy",
    "SaveLatestStrategy",
    "SnapshotSessionManager",
    "SnapshotTrigger",
]

SaveLatestStrategy = Literal["invocation", "message", "trigger"]
"""When an Agent's ``snapshot_latest`` is saved: after each invocation (default);
after every message added plus each invocation; or only when ``snapshot_trigger``
fires (or on ``save_snapshot``)."""

BidiAgentSaveLatestStrategy = Literal["message", "stop", "trigger"]
"""When a :class:`~perdure.bidi.BidiAgent`'s ``snapshot_latest`` is saved: after every
message added plus on stop and before a connection restart (default); only on stop and
before a restart; or only when ``snapshot_trigger`` fires (or on ``save_snapshot``)."""

MultiAgentSaveLatestStrategy = Literal["node", "invocation"]
"""When a Graph's or Swarm's ``snapshot_latest`` is saved: after every node completes
(default: a crash resumes at the next node), or only when the whole invocation ends."""

_BidiAgentSaveLatestStrategy = BidiAgentSaveLatestStrategy
_MultiAgentSaveLatestStrategy = MultiAgentSaveLatestStrategy

_STRATEGIES: tuple[str, ...] = ("invocation", "message", "trigger")
_BIDI_STRATEGIES: tuple[str, ...] = ("message", "stop", "trigger")
_MULTI_STRATEGIES: tuple[str, ...] = ("node", "invocation")
_ULIDS = MonotonicUlid()
_log = logging.getLogger(__name__)


@runtime_checkable
class SnapshotTrigger(Protocol):
    """Decides, after an invocation, whether to append an immutable snapshot.

    ``agent_data`` is the agent that just completed an invocation, or the
    :class:`~perdure.bidi.BidiAgent` that just stopped or is about to restart its
    connection (seed 003).
    """

    def __call__(self, *, agent_data: Agent | HoldsAgent, **kwargs: Any) -> bool:
        """Return ``True`` to append an immutable snapshot of ``agent_data``."""
        ...


def _session_fields(agent: Agent) -> Snapshot:
    """``agent``'s fields beside its messages: what a ``latest`` holds as its fields, and
    what a run's record of a node agent holds (:meth:`SnapshotSessionManager.node_agent_record`)."""
    return agent.take_snapshot(preset="session", exclude=[SnapshotField.messages])


def _filtered_fields(filters: FilterChain, data: dict[str, Any], session_id: str) -> Any:
    """Snapshot fields as ``filters`` leave them (as agent state: write ``"snapshot"``)."""
    return filters.state(data, "snapshot", session_id) if filters else data


@dataclass(frozen=True)
class _Source:
    """What an agent's snapshot fields were captured from.

    They are still the agent's when its state and interrupt state are the same
    objects at the same versions, and its conversation manager's and model's states
    are equal to what was captured (how ``Session`` decides that its agent state is
    unchanged): then a save reuses what it made of them instead of capturing,
    validating and encoding every field again. The objects compared by identity are
    held, so no other object can take their ids.
    """

    state: Any
    state_version: int
    interrupts: Any
    interrupts_version: int
    manager_state: Any
    model_state: Any

    @classmethod
    def capture(cls, agent: Agent) -> tuple[_Source, Snapshot]:
        """``agent``'s fields (all but messages), and where they came from."""
        state, interrupts = agent.state, agent.interrupt_state
        state_version, interrupts_version = state.version, interrupts.version
        captured = _session_fields(agent)
        source = cls(
            state=state,
            state_version=state_version,
            interrupts=interrupts,
            interrupts_version=interrupts_version,
            manager_state=captured.data[SnapshotField.conversation_manager_state.value],
            model_state=captured.data[SnapshotField.model_state.value],
        )
        return source, captured

    def fresh(self, agent: Agent) -> bool:
        """True when ``agent``'s fields would be captured as these were."""
        return (
            agent.state is self.state
            and agent.state.version == self.state_version
            and agent.interrupt_state is self.interrupts
            and agent.interrupt_state.version == self.interrupts_version
            and agent.model_state == self.model_state
            and agent.conversation_manager.get_state() == self.manager_state
        )


@dataclass(frozen=True)
class _Fields:
    """An agent's snapshot fields as last captured and encoded (for its ``latest``),
    and what they came from."""

    source: _Source
    json: bytes
    meta: dict[str, Any]
    meta_json: bytes

    @classmethod
    def capture(cls, agent: Agent, filters: FilterChain, session_id: str) -> tuple[_Fields, str]:
        """Capture ``agent``'s fields (all but messages); return them and the time.

        The fields are encoded as ``filters`` leave them; what is compared with the
        agent later is what was captured.
        """
        source, captured = _Source.capture(agent)
        meta = {
            "schema_version": captured.schema_version,
            "scope": captured.scope,
            "app_data": captured.app_data,
        }
        fields = cls(
            source=source,
            json=encode_json(_filtered_fields(filters, captured.data, session_id), "fields"),
            meta=meta,
            meta_json=encode_json(meta, "metadata"),
        )
        return fields, captured.created_at

    def fresh(self, agent: Agent) -> bool:
        """True when ``agent``'s fields would encode as these do."""
        return self.source.fresh(agent)


@dataclass
class _Slot:
    """The manager's memory of one agent id: which agent, and what it last stored."""

    agent: weakref.ref[Agent] | None = None
    layout: Layout | None = None
    known: set[str] = field(default_factory=set)
    graph: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    ids_floor_checked: bool = False
    # The manifest ``latest`` holds, as written by this manager, with its creation
    # time blanked: a save that would write the same again is skipped (the save at
    # the end of an invocation usually follows the last message's save unchanged).
    latest_probe: tuple[Any, ...] | None = None
    # How ``latest`` ended when this manager last read or wrote it (an AppendStorage
    # only): what its next write expects to find. None: not known (read it first).
    latest_end: LatestEnd | None = None
    # The end a write of ``latest`` would have left, while that write's outcome is
    # unknown (it raised or was cancelled); the next save looks which end is there.
    latest_unsure: LatestEnd | None = None
    # On a ConditionalStorage that cannot append: the version of ``latest`` this
    # manager last read or wrote (None: there was none), if known; and, while a
    # write's outcome is unknown, the version it expected and the blob it wrote.
    latest_version: str | None = None
    latest_version_known: bool = False
    latest_attempt: tuple[str | None, bytes] | None = None
    fields: _Fields | None = None
    # With filters: id of each message saved last time -> (the message, a copy to
    # compare it with, what the filters made of it). The same message gives the same
    # filtered object, so the layout still matches its messages by identity.
    filtered: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)

    def owner(self) -> Agent | None:
        return None if self.agent is None else self.agent()


def _check_strategy(value: Any, allowed: tuple[str, ...], argument: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"{argument} {value!r} is not a known strategy; expected one of "
            f"{', '.join(repr(a) for a in allowed)}"
        )
    return value


def _check_snapshot_id(snapshot_id: Any, argument: str) -> str:
    if not is_ulid(snapshot_id):
        raise ValueError(
            f"{argument} {snapshot_id!r} is not a valid snapshot id (a 26-character "
            "upper-case ULID)"
        )
    return str(snapshot_id)


@runtime_checkable
class HoldsAgent(Protocol):
    """Something persisted as the :class:`Agent` it holds: a :class:`~perdure.bidi.BidiAgent`.

    ``snapshot_agent`` holds its history and state; while ``started`` is true (its
    connection is open) it cannot be restored (seed 003).
    """

    @property
    def snapshot_agent(self) -> Agent:
        """The agent whose snapshot is this object's."""
        ...

    @property
    def started(self) -> bool:
        """True while the object runs (a BidiAgent: between start and stop)."""
        ...


def _check_agent(agent: Any, *, restoring: bool = False) -> Agent:
    if isinstance(agent, Agent):
        return agent
    if isinstance(agent, HoldsAgent):
        if restoring and agent.started:
            raise RuntimeError(
                f"cannot restore {type(agent).__name__} {agent.snapshot_agent.agent_id!r} "
                "while it is started; stop it first"
            )
        return agent.snapshot_agent
    raise TypeError(f"agent must be an Agent or a BidiAgent, got {type(agent).__name__}")


class _Held:
    """Hold a thread lock from async code without blocking the event loop.

    A ``threading.Lock`` (not an ``asyncio.Lock``) so that callers on different
    loops and threads exclude each other; it is polled, never waited on. (A class
    rather than an ``asynccontextmanager``: it is entered on every save, and a
    generator-based one costs three times as much.)
    """

    __slots__ = ("_lock",)

    def __init__(self, lock: ProcessLock) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        delay = 0.0002
        while not self._lock.acquire(blocking=False):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


class _RunCarrier(Agent):
    """An orchestrator's run as the manager stores it: an agent whose messages are its records.

    Orchestrators are latest-only (seed 003). Carrying a run's records as the messages
    of an agent of its own gives them everything ``latest`` guarantees an agent's
    history — on a local file one append and one fsync per save, older records sealed
    into content-addressed chunks so that a save costs the same however long the run,
    conditional writes against a second writer, hash-checked restores — under
    ``sessions/<session_id>/multi_agents/<orchestrator_id>/``. Never invoked.
    """

    def __init__(self, orchestrator_id: str) -> None:
        super().__init__(ScriptedModel(()), agent_id=orchestrator_id)
        # The record objects self.messages were made from, in order: a save encodes
        # only the records past those it was given last time (compared by identity).
        self.records: list[Mapping[str, Any]] = []


def _record_message(record: Mapping[str, Any]) -> Message:
    try:
        text = compact_json(record)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"an orchestrator record is not JSON: {exc}") from exc
    return {"role": "user", "content": [{"text": text}]}


def _message_record(message: Message, index: int, where: str) -> dict[str, Any]:
    content = message.get("content")
    try:
        if not isinstance(content, list) or len(content) != 1:
            raise ValueError("not one text block")
        record = json.loads(content[0]["text"])
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (KeyError, TypeError, ValueError) as exc:
        raise SessionCorruptedError(
            f"orchestrator run {where!r}: record {index} is damaged ({exc})"
        ) from exc
    return record


class SnapshotSessionManager:
    """Persist agents as snapshots on a :class:`~perdure.storage.Storage`.

    Give it to an agent (``Agent(session_manager=manager)``): the agent's
    ``snapshot_latest`` is restored when it is built and saved per
    ``save_latest_on``; immutable snapshots are appended when ``snapshot_trigger``
    says so. See the module docstring for the layout and the guarantees.

    When ``snapshot_latest`` is missing but immutable snapshots exist, the agent is
    built from the newest of them and a warning is logged (logger
    ``perdure.snapshots.manager``): it never starts empty over a history that
    is still there. A damaged ``snapshot_latest`` raises ``SessionCorruptedError``.

    Seed 003 makes three methods sync: :meth:`initialize`, :meth:`sync_agent` and
    :meth:`redact_latest_message`. Each has an async twin for code inside an event
    loop — :meth:`restore_snapshot`, ``save_snapshot(agent, is_latest=True)`` and
    :meth:`redact_latest_message_async` (as ``Session.redact_latest_message`` is
    async); every other operation is a coroutine.

    Args:
        session_id: Names the session: non-empty, not ``.``/``..``, no ``/``, ``\\``
            or NUL.
        storage: Where the blobs go; ``None``: a :class:`LocalFileStorage` under
            ``.perdure/storage`` in the working directory.
        save_latest_on: ``"invocation"`` (default), ``"message"`` or ``"trigger"``.
        snapshot_trigger: Called as ``snapshot_trigger(agent_data=agent)`` after each
            invocation; ``True`` appends an immutable snapshot (and, under
            ``"trigger"``, also saves ``latest``).
        bidi_agent_save_latest_on: ``"message"`` (default), ``"stop"`` or
            ``"trigger"``: when a :class:`~perdure.bidi.BidiAgent` given this
            manager saves its ``snapshot_latest`` (see :mod:`perdure.bidi`).
        multi_agent_save_latest_on: ``"node"`` (default) or ``"invocation"``: when a
            :mod:`perdure.multiagent` Graph or Swarm given this manager saves its
            run (:meth:`save_multi_agent`): after every node, or at the end only.
        filters: persistence filters (:mod:`perdure.hygiene.filters`, e.g.
            :class:`~perdure.hygiene.PIIRedactor`): every message and the agent's
            other fields go through them before a snapshot is written
            (``write="snapshot"``); the agent keeps the originals until it is
            restored. A filter that fails fails the save with
            :class:`~perdure.errors.FilterFailedError` and writes nothing.
        cipher: a :class:`~perdure.crypto.Cipher` (SPEC §9): ``storage`` is wrapped
            in :class:`~perdure.storage.EncryptedStorage` (the default storage is
            built with it), so every blob — latest, snapshots, chunks — is stored
            encrypted. Whole blobs are written then, as they are on a storage built
            with its own ``cipher=``: a ciphertext does not grow by appends. A
            storage that encrypts already is refused (``ValueError``): give the
            cipher once.

    Raises:
        ValueError: a bad ``session_id``, an unknown strategy (the message names the
            argument), or a ``cipher`` for a ``storage`` that encrypts already.
        TypeError: ``storage`` is not a Storage, ``snapshot_trigger`` not callable
            or ``cipher`` not a Cipher.
    """

    def __init__(
        self,
        session_id: str = "default-session",
        *,
        storage: Storage | None = None,
        save_latest_on: SaveLatestStrategy = "invocation",
        bidi_agent_save_latest_on: _BidiAgentSaveLatestStrategy = "message",
        multi_agent_save_latest_on: _MultiAgentSaveLatestStrategy = "node",
        snapshot_trigger: SnapshotTrigger | Callable[..., bool] | None = None,
        filters: Iterable[PersistenceFilter] | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.session_id = validate_session_id(session_id)
        check_cipher(cipher)
        self._filters = FilterChain(filters)
        self.save_latest_on = cast(
            SaveLatestStrategy, _check_strategy(save_latest_on, _STRATEGIES, "save_latest_on")
        )
        self.bidi_agent_save_latest_on = cast(
            _BidiAgentSaveLatestStrategy,
            _check_strategy(
                bidi_agent_save_latest_on, _BIDI_STRATEGIES, "bidi_agent_save_latest_on"
            ),
        )
        self.multi_agent_save_latest_on = cast(
            _MultiAgentSaveLatestStrategy,
            _check_strategy(
                multi_agent_save_latest_on, _MULTI_STRATEGIES, "multi_agent_save_latest_on"
            ),
        )
        if snapshot_trigger is not None and not callable(snapshot_trigger):
            raise TypeError(
                f"snapshot_trigger must be callable or None, got {type(snapshot_trigger).__name__}"
            )
        self.snapshot_trigger = snapshot_trigger
        if storage is None:
            storage = LocalFileStorage(cipher=cipher)
        elif not isinstance(storage, Storage):
            raise TypeError(
                "storage must implement the Storage protocol (write/read/delete/list), "
                f"got {type(storage).__name__}"
            )
        elif cipher is not None:
            storage = EncryptedStorage(storage, cipher)
        self.storage: Storage = storage
        self._appends = can_append(storage)
        self._versioned = not self._appends and isinstance(storage, ConditionalStorage)
        self._lock = ProcessLock()
        self._slots: dict[str, _Slot] = {}
        # Per node agent id: what its last run record's fields were captured from, and
        # those fields (see node_agent_record).
        self._node_fields: dict[str, tuple[_Source, dict[str, Any]]] = {}
        self._initialized: weakref.WeakSet[Agent] = weakref.WeakSet()
        self._carriers: dict[str, _RunCarrier] = {}

    def __repr__(self) -> str:
        return (
            f"SnapshotSessionManager({self.session_id!r}, storage={self.storage!r}, "
            f"save_latest_on={self.save_latest_on!r})"
        )

    # ----------------------------------------------------------------- keys

    def _prefix(self, agent: Agent) -> str:
        if isinstance(agent, _RunCarrier):
            return f"sessions/{self.session_id}/multi_agents/{agent.agent_id}/"
        return f"sessions/{self.session_id}/agents/{agent.agent_id}/"

    def _slot(self, agent: Agent) -> _Slot:
        """The slot of ``agent``'s prefix, reset if another agent object used it before."""
        slot = self._slots.setdefault(self._prefix(agent), _Slot())
        if slot.owner() is not agent:
            # The layout remembers another agent object's messages; matching them by
            # identity would fail anyway, so start from a full write.
            slot.agent = weakref.ref(agent)
            slot.layout = None
            slot.fields = None
            slot.filtered = {}
        return slot

    def _filtered_messages(self, slot: _Slot, messages: list[Message]) -> list[Message]:
        """``messages`` as the filters make them, each filtered once while unchanged.

        A message is taken as unchanged when it is the same object (in the sealed
        part of the layout, as :func:`plan_save` matches them) or the same object
        and equal to its copy (in the open tail, where in-place edits are saved too).
        A message the filters leave equal is kept as it is, so a restored history
        (already filtered) keeps matching its stored layout.
        """
        memo = slot.filtered
        sealed = len(slot.layout.sealed()) if slot.layout is not None else 0
        kept: dict[int, tuple[Any, Any, Any]] = {}
        out: list[Message] = []
        for index, message in enumerate(messages):
            hit = memo.get(id(message))
            if hit is None or hit[0] is not message or (index >= sealed and hit[1] != message):
                filtered = self._filters.message(message, "snapshot", self.session_id)
                if filtered == message:
                    filtered = message
                hit = (message, copy_message(message), filtered)
            kept[id(message)] = hit
            out.append(hit[2])
        slot.filtered = kept
        return out

    # ---------------------------------------------------------------- hooks

    def register_hooks(self, registry: HookRegistry) -> None:
        """Register the restore and save callbacks on an agent's hook registry."""
        registry.add_callback(AgentInitializedEvent, self._on_initialized)
        if self.save_latest_on == "message":
            registry.add_callback(MessageAddedEvent, self._on_message_added)
        registry.add_callback(AfterInvocationEvent, self._on_after_invocation)

    async def _on_initialized(self, event: AgentInitializedEvent) -> None:
        async with _Held(self._lock):
            if event.agent not in self._initialized:
                slot = self._slot(event.agent)
                await self._restore_locked(event.agent, slot, None, from_init=True)

    async def _on_message_added(self, event: MessageAddedEvent) -> None:
        await self._save(event.agent, snapshot=False)

    async def _on_after_invocation(self, event: AfterInvocationEvent) -> None:
        agent = event.agent
        if self.save_latest_on in ("invocation", "message"):
            await self._save(agent, snapshot=False)
        trigger = self.snapshot_trigger
        if trigger is None:
            return
        decision = trigger(agent_data=agent)
        if not isinstance(decision, bool):
            raise TypeError(f"snapshot_trigger must return a bool, got {type(decision).__name__}")
        if decision:
            if self.save_latest_on == "trigger":
                await self._save(agent, snapshot=False)
            await self._save(agent, snapshot=True)

    # ------------------------------------------------------------ public API

    async def list_snapshot_ids(
        self, agent: Agent | HoldsAgent, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        """List the agent's immutable snapshot ids, oldest first.

        Args:
            agent: Agent whose snapshots to list.
            limit: At most this many ids (``None``: all).
            start_after: Exclusive cursor: a snapshot id from a previous page.

        Raises:
            ValueError: ``start_after`` is not a valid snapshot id, or ``limit`` is
                negative.
        """
        agent = _check_agent(agent)
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
            if limit < 0:
                raise ValueError(f"limit must be >= 0, got {limit}")
        base = f"{self._prefix(agent)}snapshots/"
        cursor = (
            None if start_after is None else base + _check_snapshot_id(start_after, "start_after")
        )
        ids: list[str] = []
        while limit is None or len(ids) < limit:
            want = 1000 if limit is None else limit - len(ids)
            page = await self.storage.list(base, limit=want, start_after=cursor)
            ids.extend(key[len(base) :] for key in page if is_ulid(key[len(base) :]))
            if len(page) < want:
                break
            cursor = page[-1]
        return ids

    async def restore_snapshot(
        self, agent: Agent | HoldsAgent, *, snapshot_id: str | None = None
    ) -> bool:
        """Load a stored snapshot into ``agent``; ``True`` if it existed.

        Args:
            agent: Agent to restore into (not while it runs a turn), or a
                :class:`~perdure.bidi.BidiAgent` that is not started.
            snapshot_id: An immutable snapshot's id (time travel); ``None`` restores
                ``snapshot_latest`` only (unlike the agent's construction, it does
                not fall back to the newest immutable snapshot when ``latest`` is
                missing: it returns ``False``).

        Returns:
            ``True`` when the snapshot existed and the agent now holds it; ``False``
            (agent untouched) when there is no such snapshot.

        Raises:
            ValueError: ``snapshot_id`` is not a valid snapshot id.
            TurnRunningError: the agent is running a turn.
            RuntimeError: the BidiAgent is started.
            SessionCorruptedError: the stored snapshot is damaged (agent untouched).
            SnapshotError: it is of an unknown format version (agent untouched).
        """
        agent = _check_agent(agent, restoring=True)
        if snapshot_id is not None:
            _check_snapshot_id(snapshot_id, "snapshot_id")
        async with _Held(self._lock):
            return await self._restore_locked(agent, self._slot(agent), snapshot_id)

    async def save_snapshot(self, agent: Agent | HoldsAgent, *, is_latest: bool) -> str | None:
        """Save the agent's current state now.

        Args:
            agent: Agent whose state to capture.
            is_latest: ``True`` overwrites ``snapshot_latest``; ``False`` appends an
                immutable snapshot under a new, time-ordered id.

        Returns:
            The new snapshot's id, or ``None`` when ``is_latest`` is ``True``. The
            save is durable when this returns.

        Raises:
            TypeError: ``is_latest`` is not a bool.
            SnapshotError: some of the agent's data is not JSON-serializable.
        """
        agent = _check_agent(agent)
        if not isinstance(is_latest, bool):
            raise TypeError(f"is_latest must be a bool, got {type(is_latest).__name__}")
        return await self._save(agent, snapshot=not is_latest)

    async def delete_session(self) -> None:
        """Delete every snapshot and chunk of this session, for all its agents.

        Manifests go first, then chunks, so a crash part-way never leaves a manifest
        without its chunks. Agents still in memory keep their state; their next save
        writes everything again.
        """
        async with _Held(self._lock):
            try:
                await delete_all(self.storage, f"sessions/{self.session_id}/")
            finally:
                for slot in self._slots.values():
                    slot.layout = None
                    slot.latest_probe = None
                    slot.latest_end = slot.latest_unsure = None
                    slot.latest_version_known, slot.latest_attempt = False, None
                    slot.known.clear()
                    slot.graph.clear()

    async def delete_snapshot(self, agent: Agent | HoldsAgent, *, snapshot_id: str) -> bool:
        """Delete one immutable snapshot and the chunks nothing else references.

        (A perdure addition to the seed's API.) Returns ``True`` if it existed.

        Raises:
            ValueError: ``snapshot_id`` is not a valid snapshot id.
            SessionCorruptedError: another manifest is damaged; the snapshot is
                deleted but no chunk is collected.
        """
        agent = _check_agent(agent)
        _check_snapshot_id(snapshot_id, "snapshot_id")
        key = f"{self._prefix(agent)}snapshots/{snapshot_id}"
        async with _Held(self._lock):
            if await self.storage.read(key) is None:
                return False
            await self.storage.delete(key)
            await self._collect_locked(agent)
            return True

    async def collect_garbage(self, agent: Agent | HoldsAgent) -> int:
        """Delete the agent's chunks that no manifest references; return how many.

        (A perdure addition.) Trimmed history and deleted snapshots leave such chunks.

        Raises:
            SessionCorruptedError: a manifest or inner chunk is damaged; nothing is
                deleted.
        """
        agent = _check_agent(agent)
        async with _Held(self._lock):
            return len(await self._collect_locked(agent))

    async def redact_latest_message_async(self, redact_message: Message, agent: Agent) -> None:
        """Persist a guardrail redaction of the agent's last message now.

        If ``agent.messages[-1]`` is not already ``redact_message`` it is replaced by
        it. ``snapshot_latest`` is then saved whatever ``save_latest_on`` is, and any
        chunk that held the original and that no manifest still needs is deleted, so
        pre-redaction content never sits at rest in ``latest``. (Immutable snapshots
        taken before the redaction keep what they captured.)

        Raises:
            ValueError: the agent has no messages, or ``redact_message`` is not a
                valid message.
        """
        agent = _check_agent(agent)
        message = validate_message(copy.deepcopy(redact_message), "redact_message")
        if not agent.messages:
            raise ValueError("redact_message given but the agent has no messages to redact")
        if agent.messages[-1] != message:
            agent.messages[-1] = message
        async with _Held(self._lock):
            slot = self._slot(agent)
            await self._ensure_initialized(agent, slot)
            dropped = await self._save_locked(agent, slot, snapshot=False, rewrite=True)
            if dropped[1]:
                await self._collect_locked(agent)

    def redact_latest_message(self, redact_message: Message, agent: Agent) -> None:
        """Sync face of :meth:`redact_latest_message_async` (seed 003's signature).

        Raises:
            RuntimeError: called on perdure's own event-loop thread (await
                ``redact_latest_message_async`` instead).
        """
        run_sync(
            self.redact_latest_message_async(redact_message, agent),
            async_name="manager.redact_latest_message_async(redact_message, agent)",
        )

    def initialize(self, agent: Agent | HoldsAgent) -> None:
        """Restore ``agent`` as its construction does (sync; seed 003).

        From ``snapshot_latest`` if there is one; if it is missing, from the newest
        immutable snapshot with a logged warning; else the agent is left as it is.

        Raises:
            RuntimeError: called on perdure's own event-loop thread (await
                ``restore_snapshot(agent)`` instead).
            TurnRunningError: the agent is running a turn.
            SessionCorruptedError: the snapshot to restore is damaged.
        """
        run_sync(self._initialize(agent), async_name="manager.restore_snapshot(agent)")

    async def _initialize(self, agent: Agent | HoldsAgent) -> bool:
        agent = _check_agent(agent, restoring=True)
        async with _Held(self._lock):
            return await self._restore_locked(agent, self._slot(agent), None, fallback=True)

    def sync_agent(self, agent: Agent | HoldsAgent) -> None:
        """Save ``agent`` to ``snapshot_latest`` now (sync; seed 003).

        Raises:
            RuntimeError: called on perdure's own event-loop thread (await
                ``save_snapshot(agent, is_latest=True)`` instead).
        """
        run_sync(
            self.save_snapshot(agent, is_latest=True),
            async_name="manager.save_snapshot(agent, is_latest=True)",
        )

    def append_message(self, message: Message, agent: Agent) -> None:
        """Do nothing: snapshots capture the whole agent (seed 003).

        Under ``save_latest_on="message"`` the MessageAddedEvent hook saves.
        """

    # ------------------------------------------------------------ orchestrators

    def _carrier(self, orchestrator_id: str) -> _RunCarrier:
        validate_session_id(orchestrator_id, "orchestrator_id")
        carrier = self._carriers.get(orchestrator_id)
        if carrier is None:
            carrier = self._carriers[orchestrator_id] = _RunCarrier(orchestrator_id)
        return carrier

    def _record_message(self, record: Mapping[str, Any]) -> Message:
        """A record as the carrier's message, its values through the filters first.

        Filtered as a value (as agent state is), not as the JSON text it becomes, so a
        filter's replacement can never break the JSON. A node agent's record
        (:meth:`node_agent_record`) went through the filters when it was made.
        """
        if self._filters and record.get("t") != "agent":
            record = self._filters.state(dict(record), "snapshot", self.session_id)
        return _record_message(record)

    def node_agent_record(self, agent: Agent, start: int) -> dict[str, Any]:
        """A run record of a node agent: its messages from ``start`` on, and its other fields.

        (Used by :mod:`perdure.multiagent`: an orchestrator keeps its node agents'
        states in its run, so a node costs one append, not a second file.) The
        messages go through the filters as messages and the fields as agent state,
        as they would into the agent's own ``latest``; ``bytes`` values are encoded
        as a snapshot encodes them.

        Raises:
            FilterFailedError: a filter failed.
            SnapshotError: a field is not JSON-serializable.
        """
        messages: Sequence[Message] = agent.messages[start:]
        if self._filters:
            messages = self._filters.messages(messages, "snapshot", self.session_id)
        known = self._node_fields.get(agent.agent_id)
        if known is not None and known[0].fresh(agent):
            fields = known[1]  # unchanged since its last record: the same object, as is
        else:
            source, captured = _Source.capture(agent)
            captured.data = _filtered_fields(self._filters, captured.data, self.session_id)
            fields = captured.to_dict()
            self._node_fields[agent.agent_id] = (source, fields)
        return {
            "t": "agent",
            "agent": agent.agent_id,
            "from": start,
            "messages": encode_bytes_values(list(messages)),
            "fields": fields,
        }

    def apply_node_agent(
        self, agent: Agent, messages: Sequence[Any], fields: Mapping[str, Any], where: str
    ) -> None:
        """Put a node agent's state, as its run's records hold it, into ``agent``.

        Everything is checked before the agent changes: ``fields`` (stored form) as a
        snapshot without messages, ``messages`` (decoded, as
        :func:`~perdure.multiagent.run.fold_agent` gives them) as a snapshot's messages.

        Raises:
            SessionCorruptedError: the state does not make a valid agent (``where``
                names the run).
        """
        history = list(messages)
        try:
            snapshot = Snapshot.from_dict(dict(fields))
            loaded = Snapshot(
                schema_version=snapshot.schema_version,
                scope=snapshot.scope,
                created_at=snapshot.created_at,
                data={**snapshot.data, SnapshotField.messages.value: history},
                app_data=snapshot.app_data,
            )
            loaded.validate()
        except (SnapshotError, ValueError, RecursionError) as exc:
            raise SessionCorruptedError(
                f"orchestrator run {where!r}: the state of agent {agent.agent_id!r} is "
                f"damaged ({exc})"
            ) from exc
        del loaded.data[SnapshotField.messages.value]
        agent.load_snapshot(loaded)
        agent.messages = history

    async def restore_multi_agent(self, orchestrator_id: str) -> list[dict[str, Any]] | None:
        """Read an orchestrator's ``snapshot_latest``: its run's records, oldest first.

        (Used by :mod:`perdure.multiagent`, whose Graph and Swarm write and read the
        records; the manager only keeps them.) ``None`` when none were saved.

        Raises:
            ValueError: ``orchestrator_id`` is not a valid id (the session-id rules).
            SessionCorruptedError: what is stored is damaged; never an empty run.
        """
        carrier = self._carrier(orchestrator_id)
        async with _Held(self._lock):
            found = await self._restore_locked(carrier, self._slot(carrier), None)
        if not found:
            carrier.messages, carrier.records = [], []
            return None
        where = f"{self._prefix(carrier)}latest"
        records = [_message_record(m, i, where) for i, m in enumerate(carrier.messages)]
        carrier.records = list(records)
        return records

    async def save_multi_agent(
        self, orchestrator_id: str, records: Sequence[Mapping[str, Any]]
    ) -> None:
        """Overwrite an orchestrator's ``snapshot_latest`` with ``records`` (its whole run).

        Incremental like an agent's ``latest``: the records that are the very objects
        given (or restored) last time are not encoded or written again, so a save
        after one more node appends one record. Durable on return. The manager's
        ``filters`` see each record (as agent state); what is stored is their output.

        Raises:
            ValueError: a bad ``orchestrator_id``, or a record that is not JSON.
            SessionConflictError: another writer saved this orchestrator since this
                manager last read or wrote it; nothing was written.
        """
        carrier = self._carrier(orchestrator_id)
        old, messages = carrier.records, carrier.messages
        if (
            len(old) == len(messages) <= len(records)
            and (not old or records[len(old) - 1] is old[-1])
            and (len(old) < 2 or records[0] is old[0])
        ):
            # The usual save: the same run with records appended. Extended in place,
            # so that a save costs the same however long the run.
            new = records[len(old) :]
            messages.extend([self._record_message(r) for r in new])
            old.extend(new)
            try:
                await self._save(carrier, snapshot=False)
            except BaseException:
                # Not saved: forget them, so that the next save writes them again.
                del messages[len(messages) - len(new) :]
                del old[len(old) - len(new) :]
                raise
            return
        keep = 0
        limit = min(len(old), len(records), len(messages))
        while keep < limit and old[keep] is records[keep]:
            keep += 1
        carrier.messages = messages[:keep] + [self._record_message(r) for r in records[keep:]]
        carrier.records = list(records)
        await self._save(carrier, snapshot=False)

    # ------------------------------------------------------------- internals

    async def _ensure_initialized(self, agent: Agent, slot: _Slot) -> None:
        """Run the restore-on-init first if this agent is ours and it has not run yet.

        An agent built inside a running event loop restores at its first invocation;
        saving before that would overwrite the stored ``latest`` with an empty agent.
        """
        if agent not in self._initialized and agent.session_manager is self:
            await self._restore_locked(agent, slot, None, from_init=True)

    async def _save(self, agent: Agent, *, snapshot: bool) -> str | None:
        async with _Held(self._lock):
            slot = self._slot(agent)
            await self._ensure_initialized(agent, slot)
            return (await self._save_locked(agent, slot, snapshot=snapshot))[0]

    async def _save_locked(
        self, agent: Agent, slot: _Slot, *, snapshot: bool, rewrite: bool = False
    ) -> tuple[str | None, set[str]]:
        """Save under the lock; return the snapshot id (or None) and dropped chunks.

        ``rewrite`` (``latest`` only) writes ``latest`` whole even when unchanged, so
        that no older record of a log keeps what the agent no longer holds.
        """
        prefix = self._prefix(agent)
        fields = slot.fields
        if fields is not None and fields.fresh(agent):
            created_at = datetime.now(UTC).isoformat()
        else:
            fields, created_at = _Fields.capture(agent, self._filters, self.session_id)
            slot.fields = fields
        fields_json = fields.json
        # plan_save only reads the list, before any await: no copy needed.
        messages = agent.messages
        run = isinstance(agent, _RunCarrier)  # its records: made here, never edited
        if self._filters and not run:  # a run filters its records
            messages = self._filtered_messages(slot, messages)
        plan = plan_save(slot.layout, messages, snapshot=snapshot, owned=run)
        chunks = plan.chunks
        if snapshot:
            fields_blob = fields_chunk(fields_json)
            fields_sha = sha256_hex(fields_blob)
            index_sha: str | None = None
            chunks = {**chunks, fields_sha: fields_blob}
            if plan.top:
                index_blob = index_chunk(plan.top)
                index_sha = sha256_hex(index_blob)
                chunks[index_sha] = index_blob
            manifest = manifest_blob(
                {**fields.meta, "created_at": created_at},
                fields_ref=fields_sha,
                count=plan.count,
                skip=plan.layout.skip,
                parts=None if index_sha else [],
                index_ref=index_sha,
                chain_ref=plan.chain_ref,
                inline=[],
            )
            if not slot.ids_floor_checked:
                existing = await list_all(self.storage, f"{prefix}snapshots/")
                for key in existing:
                    name = key.rsplit("/", 1)[1]
                    if is_ulid(name):
                        _ULIDS.observe(name)
                slot.ids_floor_checked = True
            snapshot_id: str | None = _ULIDS.new()
            key = f"{prefix}snapshots/{snapshot_id}"
        else:
            # What latest would hold, but its creation time: equal to what this
            # manager last wrote there means the write would change nothing else.
            top = tuple(plan.top)  # parts are (level, count, sha) tuples already
            inline = tuple(plan.inline)
            probe = (fields_json, plan.count, plan.layout.skip, top, inline, fields.meta_json)
            if (
                not rewrite
                and probe == slot.latest_probe
                and not any(sha not in slot.known for sha in chunks)
            ):
                slot.layout = plan.layout  # latest already holds exactly this
                return None, plan.dropped
            snapshot_id = None
            key = f"{prefix}latest"
        slot.latest_probe = None  # until the write below is done
        new = {sha: blob for sha, blob in chunks.items() if sha not in slot.known}
        if new:  # most saves seal nothing
            await write_chunks(self.storage, prefix, new)
            slot.known.update(new)
        if snapshot_id is not None:
            await self.storage.write(key, manifest)
        elif self._appends:
            state = LogState(
                at=created_at,
                meta=fields.meta_json,
                fields=fields_json,
                count=plan.count,
                skip=plan.layout.skip,
                parts=top,
                inline=inline,
            )
            await self._write_log(slot, agent.agent_id, key, state, rewrite=rewrite)
        else:
            blob = manifest_blob(
                {**fields.meta, "created_at": created_at},
                fields_json=fields_json,
                count=plan.count,
                skip=plan.layout.skip,
                parts=plan.top,
                chain_ref=None,
                inline=plan.inline,
            )
            if self._versioned:
                await self._write_versioned(slot, agent.agent_id, key, blob)
            else:
                await self.storage.write(key, blob)
        if snapshot_id is None:
            slot.latest_probe = probe
        slot.layout = plan.layout
        return snapshot_id, plan.dropped

    async def _write_log(
        self, slot: _Slot, agent_id: str, key: str, state: LogState, *, rewrite: bool
    ) -> None:
        """Write ``state`` to the ``latest`` log: append one record, or start it afresh.

        Either write is conditional on ``latest`` ending as this manager last saw it.

        Raises:
            SessionConflictError: another writer changed ``latest`` since; nothing was
                written.
        """
        storage = cast(AppendStorage, self.storage)
        end = await self._latest_end(slot, agent_id, key)
        head = end.head
        try:
            if head is not None and not rewrite and not head.due():
                line, after = append_record(head, state)
                slot.latest_unsure = LatestEnd(after.size, after.tail, after)
                await storage.append(key, line, size=head.size, tail=head.tail)
            else:
                blob, after = new_log(state)
                slot.latest_unsure = LatestEnd(after.size, after.tail, after)
                await storage.replace(key, blob, size=end.size, tail=end.tail)
        except StorageConflictError as exc:
            slot.latest_unsure = None
            raise self._conflict(agent_id) from exc
        slot.latest_unsure = None
        slot.latest_end = LatestEnd(after.size, after.tail, after)

    async def _write_versioned(self, slot: _Slot, agent_id: str, key: str, blob: bytes) -> None:
        """Replace ``latest`` with ``blob`` if its version is the one this manager knows.

        Raises:
            SessionConflictError: another writer changed ``latest`` since; nothing was
                written.
        """
        storage = cast(ConditionalStorage, self.storage)
        expected = await self._latest_version(slot, agent_id, key)
        slot.latest_attempt = (expected, blob)
        try:
            made = await storage.write_if(key, blob, expected=expected)
        except StorageConflictError as exc:
            slot.latest_attempt = None
            raise self._conflict(agent_id) from exc
        slot.latest_attempt = None
        slot.latest_version = made

    async def _latest_version(self, slot: _Slot, agent_id: str, key: str) -> str | None:
        """The version the next write of ``latest`` expects: as last seen, or read now.

        After a write whose outcome is unknown (it raised, or its task was
        cancelled), what is stored decides: still the version it expected (not
        applied), or the very blob it wrote (applied); anything else is another
        writer's.

        Raises:
            SessionConflictError: ``latest`` is neither.
        """
        storage = cast(ConditionalStorage, self.storage)
        attempt = slot.latest_attempt
        if attempt is not None:
            slot.latest_attempt = None
            before, tried = attempt
            now = await storage.version(key)
            if now != before:
                # The version is read before the blob: a write in between makes the
                # version stale, and the next write_if a conflict, never a lost update.
                if now is None or await storage.read(key) != tried:
                    raise self._conflict(agent_id)
                slot.latest_version = now
        if not slot.latest_version_known:
            slot.latest_version = await storage.version(key)
            slot.latest_version_known = True
        return slot.latest_version

    async def _latest_end(self, slot: _Slot, agent_id: str, key: str) -> LatestEnd:
        """How ``latest`` ends for the next write: as last seen, or read now.

        After a write whose outcome is unknown (it raised, or its task was
        cancelled), the stored end decides: the one before it or the one it would
        have left; anything else is another writer's.

        Raises:
            SessionConflictError: ``latest`` is neither.
        """
        tried = slot.latest_unsure
        if tried is not None:
            slot.latest_unsure = None
            now = end_of(await self.storage.read(key))
            if (now.size, now.tail) == (tried.size, tried.tail):
                slot.latest_end = tried
            elif slot.latest_end is None or (now.size, now.tail) != (
                slot.latest_end.size,
                slot.latest_end.tail,
            ):
                raise self._conflict(agent_id)
        if slot.latest_end is None:
            slot.latest_end = end_of(await self.storage.read(key))
        return slot.latest_end

    def _conflict(self, agent_id: str) -> SessionConflictError:
        return SessionConflictError(
            f"snapshot_latest of session {self.session_id!r}, agent {agent_id!r} was "
            "written by another writer since this manager last read or wrote it; nothing "
            "was saved (restore the agent to go on from what is stored)"
        )

    async def _restore_locked(
        self,
        agent: Agent,
        slot: _Slot,
        snapshot_id: str | None,
        *,
        from_init: bool = False,
        fallback: bool = False,
    ) -> bool:
        """Restore ``latest`` (or ``snapshot_id``) into ``agent``; ``True`` if it existed.

        The agent's construction (``from_init``) and ``fallback`` restore the newest
        immutable snapshot when ``latest`` is missing, with a logged warning.
        """
        if agent.turn_running and not from_init:
            raise TurnRunningError("cannot restore a snapshot while the agent is running a turn")
        prefix = self._prefix(agent)
        latest = f"{prefix}latest"
        replayed = None
        end: LatestEnd | None
        # The version before the blob: a write in between makes it stale, so the next
        # save is refused (a conflict), never a lost update.
        version = (
            await cast(ConditionalStorage, self.storage).version(latest)
            if self._versioned
            else None
        )
        if snapshot_id is None:
            key = latest
            manifest, replayed, end = await read_latest(self.storage, key)
        else:
            key = f"{prefix}snapshots/{snapshot_id}"
            manifest = await read_manifest(self.storage, key)
            # The next save replaces latest on condition that it is still as it is now.
            end = end_of(await self.storage.read(latest)) if self._appends else None
        if manifest is None and snapshot_id is None and (from_init or fallback):
            key, manifest = await self._newest_snapshot(agent)
        if manifest is None:
            self._initialized.add(agent)
            slot.latest_end, slot.latest_unsure = end, None
            self._know_version(slot, version)
            return False
        with gc_paused():
            loaded = await load(self.storage, prefix, key, manifest)
            _apply(agent, loaded, key)
        self._initialized.add(agent)
        slot.layout = loaded.layout
        slot.known.update(loaded.refs)
        slot.latest_probe = None  # the next save writes latest again
        slot.fields = None
        if replayed is not None and replayed.head is not None and end is not None:
            # The log holds the open tail as the layout now encodes it: the next
            # record finds those messages (the same bytes objects) and appends only
            # what is new.
            head = dataclasses.replace(
                replayed.head, inline=tuple(entry.encoded for entry in loaded.layout.tail)
            )
            end = LatestEnd(end.size, end.tail, head)
        slot.latest_end, slot.latest_unsure = end, None
        self._know_version(slot, version)
        if replayed is not None and replayed.torn:
            _log.warning(
                "snapshot_latest of session %r, agent %r ends with %d bytes of a save that "
                "was interrupted (never acknowledged); restored the state before it, and "
                "the next save rewrites the log",
                self.session_id,
                agent.agent_id,
                replayed.torn,
            )
        return True

    def _know_version(self, slot: _Slot, version: str | None) -> None:
        """After a restore: the version of ``latest`` the next save expects."""
        slot.latest_version, slot.latest_attempt = version, None
        slot.latest_version_known = self._versioned

    async def _newest_snapshot(self, agent: Agent) -> tuple[str, Manifest | None]:
        """The newest immutable snapshot's key and manifest, standing in for a lost ``latest``.

        ``(key, None)`` when there is none. Logs a warning when there is one: a
        missing ``latest`` beside immutable snapshots was deleted or never saved,
        and whatever it held after that snapshot is not coming back.
        """
        agent_id = agent.agent_id
        prefix = self._prefix(agent)
        base = f"{prefix}snapshots/"
        ids = [key[len(base) :] for key in await list_all(self.storage, base)]
        ids = sorted(i for i in ids if is_ulid(i))
        if not ids:
            return f"{prefix}latest", None
        key = base + ids[-1]
        manifest = await read_manifest(self.storage, key)  # damaged: raises, no guessing
        if manifest is not None:
            _log.warning(
                "snapshot_latest of session %r, agent %r is missing although %d immutable "
                "snapshot(s) exist; restoring the newest, %s (created %s): anything saved "
                "to snapshot_latest after it is lost",
                self.session_id,
                agent_id,
                len(ids),
                ids[-1],
                manifest.meta.get("created_at"),
            )
        return key, manifest

    async def _collect_locked(self, agent: Agent) -> set[str]:
        slot = self._slot(agent)
        deleted = await collect(self.storage, self._prefix(agent), slot.graph)
        slot.known -= deleted
        if slot.layout is not None and slot.layout.refs() & deleted:
            slot.layout = None  # it pointed at something now gone: write afresh next time
        return deleted


def _apply(agent: Agent, loaded: Loaded, key: str) -> None:
    """Put restored data into ``agent``, validating everything before changing anything.

    The messages travel beside the snapshot rather than in it, so the freshly decoded
    (and hash-verified) history is neither deep-copied nor serialised again to
    validate; every other field goes through :meth:`Agent.load_snapshot`.

    Raises:
        SnapshotError: the data does not make a valid agent (agent untouched).
    """
    meta = loaded.manifest.meta
    snapshot = Snapshot(
        schema_version=meta["schema_version"],
        scope=meta["scope"],
        created_at=meta["created_at"],
        data=loaded.fields,
        app_data=meta["app_data"],
    )
    if SnapshotField.messages.value in snapshot.data:
        raise SnapshotError(f"snapshot {key!r}: messages must not be among its fields")
    snapshot.validate()
    # The chunks' hashes were verified, so these are the very messages that were
    # saved; check their shape as Snapshot.validate() does for its messages field.
    messages: list[Message] = loaded.messages
    for index, message in enumerate(messages):
        if message.get("role") not in ("user", "assistant") or not isinstance(
            message.get("content"), list
        ):
            raise SnapshotError(
                f"snapshot {key!r} messages[{index}] is not a message "
                "(role 'user'/'assistant' and a content list)"
            )
    agent.load_snapshot(snapshot)  # every other field, validated before any change
    agent.messages = messages
