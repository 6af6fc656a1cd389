"""SnapshotSessionManager: persist a whole agent as snapshots on any ``Storage`` (seed 003).

Two things are kept per agent (``sessions/<session_id>/agents/<agent_id>/``):

* ``latest`` — ``snapshot_latest``, overwritten on each save (per ``save_latest_on``)
  and restored when the agent is built;
* ``snapshots/<ULID>`` — immutable snapshots, appended when ``snapshot_trigger``
  returns ``True`` after an invocation or on ``save_snapshot(agent, is_latest=False)``;
  their ULID ids sort by creation time and are strictly increasing.

A save is incremental, not a rewrite: messages live in immutable, SHA-256-named
chunks (``chunks/<sha256>``) shared by ``latest`` and every snapshot; a manifest
points at them and carries only the open tail of recent messages (see
:mod:`perdure.snapshots.layout` for the layout and
:mod:`perdure.snapshots.format` for the blob format). One save costs about
one blob write whatever the length of the history; restore reads the chunks and
checks every hash.

Guarantees:

* After a save returns, what it saved is durable (as durable as the ``Storage``).
* A crash (even SIGKILL) during a save leaves the previous manifest or the new one,
  never a manifest pointing at a missing chunk: chunks are written before the
  manifest that references them.
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
  Two processes writing the same agent are last-writer-wins for ``latest``, and a
  collection in one may delete chunks that a save in flight in the other has written
  but not yet referenced; run collections from the writing process (or while no
  other process writes that agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, runtime_checkable

from perdure._runtime.loop import run_sync
from perdure._runtime.threads import ProcessLock
from perdure.agent import Agent, Snapshot, SnapshotField
from perdure.errors import SnapshotError, TurnRunningError
from perdure.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    HookRegistry,
    MessageAddedEvent,
)
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
    read_manifest,
    write_chunks,
)
from perdure.snapshots.layout import Layout, plan_save
from perdure.storage import LocalFileStorage, Storage
from perdure.types import Message, validate_message

__all__ = [
    "SaveLatestStrategy",
    "SnapshotSessionManager",
    "SnapshotTrigger",
]

SaveLatestStrategy = Literal["invocation", "message", "trigger"]
"""When an Agent's ``snapshot_latest`` is saved: after each invocation (default);
after every message added plus each invocation; or only when ``snapshot_trigger``
fires (or on ``save_snapshot``)."""

# The strategies seed 003 names for bidirectional agents and orchestrators. perdure
# has neither yet (issue 24), so the values are validated and kept, and not exported
# as if they did something.
_BidiAgentSaveLatestStrategy = Literal["message", "stop", "trigger"]
_MultiAgentSaveLatestStrategy = Literal["node", "invocation"]

_STRATEGIES: tuple[str, ...] = ("invocation", "message", "trigger")
_BIDI_STRATEGIES: tuple[str, ...] = ("message", "stop", "trigger")
_MULTI_STRATEGIES: tuple[str, ...] = ("node", "invocation")
_ULIDS = MonotonicUlid()
_log = logging.getLogger(__name__)


@runtime_checkable
class SnapshotTrigger(Protocol):
    """Decides, after an invocation, whether to append an immutable snapshot."""

    def __call__(self, *, agent_data: Agent, **kwargs: Any) -> bool:
        """Return ``True`` to append an immutable snapshot of ``agent_data``."""
        ...


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


def _check_agent(agent: Any) -> Agent:
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be an Agent, got {type(agent).__name__}")
    return agent


@contextlib.asynccontextmanager
async def _hold(lock: ProcessLock) -> AsyncIterator[None]:
    """Hold a thread lock from async code without blocking the event loop.

    A ``threading.Lock`` (not an ``asyncio.Lock``) so that callers on different
    loops and threads exclude each other; it is polled, never waited on.
    """
    delay = 0.0002
    while not lock.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)
    try:
        yield
    finally:
        lock.release()


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
            ``"trigger"``: seed 003's strategy for a bidirectional agent. Validated
            and kept; perdure has no such agents yet, so it changes nothing.
        multi_agent_save_latest_on: ``"node"`` (default) or ``"invocation"``: seed
            003's strategy for Graph/Swarm orchestrators. Validated and kept;
            perdure has no orchestrators yet, so it changes nothing.

    Raises:
        ValueError: a bad ``session_id`` or an unknown strategy (the message names
            the argument).
        TypeError: ``storage`` is not a Storage or ``snapshot_trigger`` not callable.
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
    ) -> None:
        self.session_id = validate_session_id(session_id)
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
            storage = LocalFileStorage()
        elif not isinstance(storage, Storage):
            raise TypeError(
                "storage must implement the Storage protocol (write/read/delete/list), "
                f"got {type(storage).__name__}"
            )
        self.storage: Storage = storage
        self._lock = ProcessLock()
        self._slots: dict[str, _Slot] = {}
        self._initialized: weakref.WeakSet[Agent] = weakref.WeakSet()

    def __repr__(self) -> str:
        return (
            f"SnapshotSessionManager({self.session_id!r}, storage={self.storage!r}, "
            f"save_latest_on={self.save_latest_on!r})"
        )

    # ----------------------------------------------------------------- keys

    def _prefix(self, agent_id: str) -> str:
        return f"sessions/{self.session_id}/agents/{agent_id}/"

    def _slot(self, agent: Agent) -> _Slot:
        """The slot of ``agent``'s id, reset if another agent object used it before."""
        slot = self._slots.setdefault(agent.agent_id, _Slot())
        if slot.owner() is not agent:
            # The layout remembers another agent object's messages; matching them by
            # identity would fail anyway, so start from a full write.
            slot.agent = weakref.ref(agent)
            slot.layout = None
        return slot

    # ---------------------------------------------------------------- hooks

    def register_hooks(self, registry: HookRegistry) -> None:
        """Register the restore and save callbacks on an agent's hook registry."""
        registry.add_callback(AgentInitializedEvent, self._on_initialized)
        if self.save_latest_on == "message":
            registry.add_callback(MessageAddedEvent, self._on_message_added)
        registry.add_callback(AfterInvocationEvent, self._on_after_invocation)

    async def _on_initialized(self, event: AgentInitializedEvent) -> None:
        async with _hold(self._lock):
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
        self, agent: Agent, *, limit: int | None = None, start_after: str | None = None
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
        base = f"{self._prefix(agent.agent_id)}snapshots/"
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

    async def restore_snapshot(self, agent: Agent, *, snapshot_id: str | None = None) -> bool:
        """Load a stored snapshot into ``agent``; ``True`` if it existed.

        Args:
            agent: Agent to restore into (not while it runs a turn).
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
            SessionCorruptedError: the stored snapshot is damaged (agent untouched).
            SnapshotError: it is of an unknown format version (agent untouched).
        """
        agent = _check_agent(agent)
        if snapshot_id is not None:
            _check_snapshot_id(snapshot_id, "snapshot_id")
        async with _hold(self._lock):
            return await self._restore_locked(agent, self._slot(agent), snapshot_id)

    async def save_snapshot(self, agent: Agent, *, is_latest: bool) -> str | None:
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
        async with _hold(self._lock):
            try:
                await delete_all(self.storage, f"sessions/{self.session_id}/")
            finally:
                for slot in self._slots.values():
                    slot.layout = None
                    slot.latest_probe = None
                    slot.known.clear()
                    slot.graph.clear()

    async def delete_snapshot(self, agent: Agent, *, snapshot_id: str) -> bool:
        """Delete one immutable snapshot and the chunks nothing else references.

        (A perdure addition to the seed's API.) Returns ``True`` if it existed.

        Raises:
            ValueError: ``snapshot_id`` is not a valid snapshot id.
            SessionCorruptedError: another manifest is damaged; the snapshot is
                deleted but no chunk is collected.
        """
        agent = _check_agent(agent)
        _check_snapshot_id(snapshot_id, "snapshot_id")
        key = f"{self._prefix(agent.agent_id)}snapshots/{snapshot_id}"
        async with _hold(self._lock):
            if await self.storage.read(key) is None:
                return False
            await self.storage.delete(key)
            await self._collect_locked(agent)
            return True

    async def collect_garbage(self, agent: Agent) -> int:
        """Delete the agent's chunks that no manifest references; return how many.

        (A perdure addition.) Trimmed history and deleted snapshots leave such chunks.

        Raises:
            SessionCorruptedError: a manifest or inner chunk is damaged; nothing is
                deleted.
        """
        agent = _check_agent(agent)
        async with _hold(self._lock):
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
        async with _hold(self._lock):
            slot = self._slot(agent)
            await self._ensure_initialized(agent, slot)
            dropped = await self._save_locked(agent, slot, snapshot=False)
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

    def initialize(self, agent: Agent) -> None:
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

    async def _initialize(self, agent: Agent) -> bool:
        agent = _check_agent(agent)
        async with _hold(self._lock):
            return await self._restore_locked(agent, self._slot(agent), None, fallback=True)

    def sync_agent(self, agent: Agent) -> None:
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

    # ------------------------------------------------------------- internals

    async def _ensure_initialized(self, agent: Agent, slot: _Slot) -> None:
        """Run the restore-on-init first if this agent is ours and it has not run yet.

        An agent built inside a running event loop restores at its first invocation;
        saving before that would overwrite the stored ``latest`` with an empty agent.
        """
        if agent not in self._initialized and agent.session_manager is self:
            await self._restore_locked(agent, slot, None, from_init=True)

    async def _save(self, agent: Agent, *, snapshot: bool) -> str | None:
        async with _hold(self._lock):
            slot = self._slot(agent)
            await self._ensure_initialized(agent, slot)
            return (await self._save_locked(agent, slot, snapshot=snapshot))[0]

    async def _save_locked(
        self, agent: Agent, slot: _Slot, *, snapshot: bool
    ) -> tuple[str | None, set[str]]:
        """Save under the lock; return the snapshot id (or None) and dropped chunks."""
        prefix = self._prefix(agent.agent_id)
        captured = agent.take_snapshot(preset="session", exclude=[SnapshotField.messages])
        fields_json = encode_json(captured.data, "fields")
        meta = {
            "schema_version": captured.schema_version,
            "scope": captured.scope,
            "created_at": captured.created_at,
            "app_data": captured.app_data,
        }
        plan = plan_save(slot.layout, list(agent.messages), snapshot=snapshot)
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
                meta,
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
            probe = (
                fields_json,
                plan.count,
                plan.layout.skip,
                tuple(plan.top),  # parts are (level, count, sha) tuples already
                tuple(plan.inline),
                captured.schema_version,
                captured.scope,
                encode_json(captured.app_data, "app_data"),
            )
            if probe == slot.latest_probe and not any(sha not in slot.known for sha in chunks):
                slot.layout = plan.layout  # latest already holds exactly this
                return None, plan.dropped
            manifest = manifest_blob(
                meta,
                fields_json=fields_json,
                count=plan.count,
                skip=plan.layout.skip,
                parts=plan.top,
                chain_ref=None,
                inline=plan.inline,
            )
            snapshot_id = None
            key = f"{prefix}latest"
        slot.latest_probe = None  # until the write below is done
        new = {sha: blob for sha, blob in chunks.items() if sha not in slot.known}
        await write_chunks(self.storage, prefix, new)
        slot.known.update(new)
        await self.storage.write(key, manifest)
        if snapshot_id is None:
            slot.latest_probe = probe
        slot.layout = plan.layout
        return snapshot_id, plan.dropped

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
        prefix = self._prefix(agent.agent_id)
        key = f"{prefix}latest" if snapshot_id is None else f"{prefix}snapshots/{snapshot_id}"
        manifest = await read_manifest(self.storage, key)
        if manifest is None and snapshot_id is None and (from_init or fallback):
            key, manifest = await self._newest_snapshot(agent.agent_id)
        if manifest is None:
            self._initialized.add(agent)
            return False
        with gc_paused():
            loaded = await load(self.storage, prefix, key, manifest)
            _apply(agent, loaded, key)
        self._initialized.add(agent)
        slot.layout = loaded.layout
        slot.known.update(loaded.refs)
        slot.latest_probe = None  # the next save writes latest whole again
        return True

    async def _newest_snapshot(self, agent_id: str) -> tuple[str, Manifest | None]:
        """The newest immutable snapshot's key and manifest, standing in for a lost ``latest``.

        ``(key, None)`` when there is none. Logs a warning when there is one: a
        missing ``latest`` beside immutable snapshots was deleted or never saved,
        and whatever it held after that snapshot is not coming back.
        """
        prefix = self._prefix(agent_id)
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
        deleted = await collect(self.storage, self._prefix(agent.agent_id), slot.graph)
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
