"""Session: the message-log session manager of one agent (SPEC §7, seed 000 §5).

Persistence rides on the agent's hooks:

- ``AgentInitializedEvent`` restores the agent from the store, in the order of seed
  000 §5.4: agent state, internal state (interrupts, model state), the conversation
  manager's state (with its removed-message offset), then the messages from that
  offset — repaired so the model accepts them, the repair written back once. Only
  those messages (and the one before them) are read, so a resume costs what the
  manager keeps, not what the log holds; ``verify_store`` reads everything.
- ``BeforeInvocationEvent`` takes the session's writer lock for the whole turn
  (``SessionLockedError`` at once if another writer holds it);
  ``AfterInvocationEvent`` syncs state, flushes, and releases it. Nothing is held
  between turns.
- ``MessageAddedEvent`` commits the new message (and the agent's state when it
  changed), checking that the stored tail is the one this ``Session`` last saw:
  a stale ``Session`` gets ``SessionConflictError`` instead of forking the journal.

With ``filters=[...]`` (:mod:`perdure.hygiene.filters`) every message and agent
state the session writes — commits, rewrites, checkpoints, exports, imports — goes
through the filters first, and only their output reaches a store; the agent keeps
the originals for the rest of its turn. Only the messages past what the store
holds (and the last one it holds) are filtered at a commit, so the store compares
its stored last message with a filtered one: filtered with filtered.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from perdure._runtime.loop import in_running_loop, run_blocking
from perdure.agent.conversation.pairing import repair_tool_pairs, tail_repairs
from perdure.agent.conversation.summarize import (
    SummaryError,
    latest_user_turn,
    summarize,
    summary_message,
)
from perdure.agent.interrupt_state import InterruptState
from perdure.checkpoints.export import (
    ImportedCheckpoint,
    ImportProgress,
    export_checkpoint_bytes,
    import_checkpoint_bytes,
)
from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    CheckpointTrigger,
    FileCheckpointStore,
    check_checkpoint_id,
    new_checkpoint_id,
    now_iso,
)
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionMismatchError,
    SessionNotFoundError,
    StoreNotWiredError,
    TurnRunningError,
)
from perdure.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    BeforeCompactEvent,
    BeforeInvocationEvent,
    HookEvent,
    HookRegistry,
    MessageAddedEvent,
    SessionCheckpointedEvent,
    SessionCompactedEvent,
    SessionRestoredEvent,
)
from perdure.hygiene.filters import FilterChain, PersistenceFilter
from perdure.session.ids import new_session_id, validate_session_id
from perdure.session.paging import check_page_args, page_bounds
from perdure.session.results import CompactResult, RestoreResult
from perdure.session.rules import PastOffset
from perdure.session.store import (
    HistoryPage,
    SessionRecord,
    SessionStore,
    SupportsFlush,
    SupportsHistoryPage,
)
from perdure.session.ulid import new_ulid as new_compaction_id
from perdure.state import AgentState
from perdure.types import Message, validate_message

if TYPE_CHECKING:
    from perdure.agent import Agent

AGENT_STATE_FORMAT = "perdure-agent-state/1"
# An offset past any history: a store's get() then reads only metadata, state and tail.
_PAST_END = sys.maxsize
# Reads of the window before giving up on a session whose state keeps moving.
_WINDOW_READS = 3
# Bytes of an export checked on the event loop itself; a larger one, in a worker.
_IMPORT_ON_LOOP_MAX = 256 * 1024


async def verify_export(
    data: bytes | str,
    verify_key: bytes | str | None = None,
    *,
    progress: ImportProgress | None = None,
) -> ImportedCheckpoint:
    """:func:`~perdure.checkpoints.export.import_checkpoint_bytes` without stalling
    the loop: an export over 256 KiB is checked in a worker thread (decoding and
    hashing a 64 MiB one takes seconds), so ``progress`` may be called from there.

    Raises:
        CheckpointImportError: the export failed any check.
        ValueError: ``verify_key`` is empty.
    """
    if isinstance(data, bytes | bytearray | str) and len(data) > _IMPORT_ON_LOOP_MAX:
        return await asyncio.to_thread(
            import_checkpoint_bytes, data, verify_key=verify_key, progress=progress
        )
    return import_checkpoint_bytes(data, verify_key=verify_key, progress=progress)


class _Filtered(Sequence[Message]):
    """A history as the store should see it: each message through the filters.

    The messages from ``start`` on (those the store does not hold yet, and the last
    one it holds) are filtered here, before the store sees any: a filter that fails
    fails the commit before anything is written. Any other message a store reads
    is filtered when read.
    """

    def __init__(
        self, source: Sequence[Message], start: int, chain: FilterChain, session_id: str
    ) -> None:
        self._source = source
        self._chain = chain
        self._session_id = session_id
        self._done: dict[int, Message] = {
            index: chain.message(source[index], "session", session_id)
            for index in range(start, len(source))
        }

    def __len__(self) -> int:
        return len(self._source)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            self._source[index]  # the source's own refusals (a trimmed prefix)
            return [self[i] for i in range(start, stop, step)]
        if index < 0:
            index += len(self)
        done = self._done.get(index)
        if done is None:
            done = self._chain.message(self._source[index], "session", self._session_id)
            self._done[index] = done
        return done

    def __iter__(self) -> Iterator[Message]:
        iter(self._source)  # the source's own refusal (a trimmed prefix)
        return (self[i] for i in range(len(self)))


class Session:
    """Persists one agent's conversation, state and loop position in a ``SessionStore``.

    Args:
        store: where the session lives.
        session_id: open this session, creating it if absent; ``None`` starts a new
            one with a fresh id.
        checkpoints: where the session's checkpoints live: ``None`` for the store's
            own (``store.checkpoints``: beside the session, deleted with it), a
            directory for an independent :class:`FileCheckpointStore`, any
            :class:`CheckpointStore`, or ``False`` for none (checkpoint operations
            then report ``store_not_wired``).
        checkpoint_before_compact: write a ``pre_compaction`` checkpoint before every
            compaction unless ``compact(checkpoint=...)`` says otherwise.
        filters: persistence filters (:mod:`perdure.hygiene.filters`, e.g.
            :class:`~perdure.hygiene.PIIRedactor`) that every message and agent state
            goes through before it is written; a filter that fails fails the write
            with :class:`~perdure.errors.FilterFailedError` and writes nothing.

    Give it to ``Agent(session_manager=session)``. Every coroutine may be awaited
    from any event loop and any thread.
    """

    def __init__(
        self,
        store: SessionStore,
        session_id: str | None = None,
        *,
        checkpoints: CheckpointStore | str | os.PathLike[str] | Literal[False] | None = None,
        checkpoint_before_compact: bool = True,
        filters: Iterable[PersistenceFilter] | None = None,
    ) -> None:
        if not isinstance(store, SessionStore):
            raise TypeError(f"store must implement SessionStore, got {type(store).__name__}")
        self.store = store
        if checkpoints is None:
            found = getattr(store, "checkpoints", None)
            self.checkpoints: CheckpointStore | None = (
                found if isinstance(found, CheckpointStore) else None
            )
        elif checkpoints is False:
            self.checkpoints = None
        elif isinstance(checkpoints, str | os.PathLike):
            self.checkpoints = FileCheckpointStore(checkpoints)
        elif isinstance(checkpoints, CheckpointStore):
            self.checkpoints = checkpoints
        else:
            raise TypeError(
                "checkpoints must be a CheckpointStore, a directory, None or False, "
                f"got {checkpoints!r}"
            )
        self.checkpoint_before_compact = checkpoint_before_compact
        self._filters = FilterChain(filters)
        self._new = session_id is None
        self.session_id = (
            validate_session_id(session_id) if session_id is not None else new_session_id()
        )
        self._must_exist = False
        self._record: SessionRecord | None = None
        self._agent: Agent | None = None
        self._tail: str | None = None
        self._tail_unknown = False  # a commit's outcome was lost (see _commit)
        # How many messages the store held at the last read or commit: a commit
        # filters the messages from the last of those on.
        self._count = 0
        self._lock_stack: contextlib.AsyncExitStack | None = None
        self._holding = False
        # What the store holds of the agent's state: its versions and manager state,
        # and a copy of the model state (taken only when it changes: compared, not
        # copied, at every commit).
        self._synced: tuple[Any, ...] | None = None
        self._synced_model_state: dict[str, Any] | None = None
        self._flush = store.flush if isinstance(store, SupportsFlush) else None

    def __repr__(self) -> str:
        return f"Session({self.store!r}, {self.session_id!r})"

    @classmethod
    def resume(
        cls,
        store: SessionStore,
        session_id: str,
        *,
        filters: Iterable[PersistenceFilter] | None = None,
    ) -> Session:
        """Open a session that must exist.

        Where no event loop runs, the session is read here (on perdure's loop) and
        its errors are raised here. Inside a running loop nothing is read (that would
        block the loop): the read waits for the agent's restore, and the errors are
        raised by ``await agent.initialize()``, ``await Agent.create(...)`` or the
        agent's first call — as ``Agent(session_manager=…)`` raises them (SPEC §7).
        ``await Session.open(store, session_id, must_exist=True)`` reads it at once
        from async code.

        Raises:
            SessionNotFoundError: no session ``session_id``.
            SessionCorruptedError: the stored session is damaged.
        """
        session = cls(store, session_id, filters=filters)
        session._must_exist = True
        if not in_running_loop():
            run_blocking(session._load())
        return session

    @classmethod
    async def open(
        cls,
        store: SessionStore,
        session_id: str | None = None,
        *,
        must_exist: bool = False,
        filters: Iterable[PersistenceFilter] | None = None,
    ) -> Session:
        """Async twin of the constructor and :meth:`resume`: reads the session now."""
        session = cls(store, session_id, filters=filters)
        session._must_exist = must_exist
        await session._load()
        return session

    @property
    def filters(self) -> FilterChain:
        """The persistence filters everything this session writes goes through."""
        return self._filters

    @property
    def agent(self) -> Agent | None:
        """The agent this session persists (set when the agent is built)."""
        return self._agent

    # ------------------------------------------------------------------ hooks

    def register_hooks(self, registry: HookRegistry) -> None:
        """Subscribe to the agent's lifecycle (see the module docstring)."""
        registry.add_callback(AgentInitializedEvent, self._on_initialized)
        registry.add_callback(BeforeInvocationEvent, self._on_before_invocation)
        registry.add_callback(MessageAddedEvent, self._on_message_added)
        registry.add_callback(AfterInvocationEvent, self._on_after_invocation)

    async def _on_initialized(self, event: AgentInitializedEvent) -> None:
        agent = event.agent
        if self._agent is not None and self._agent is not agent:
            raise ValueError(f"session {self.session_id!r} already persists another agent")
        if self._record is None:
            await self._load()
        assert self._record is not None
        await self._restore(agent, self._record)
        self._record = None  # the agent holds it now; do not keep a second copy
        # Attached only now: no save() or checkpoint commits the agent's (still empty)
        # state over the stored one while the restore runs.
        self._agent = agent

    async def _on_before_invocation(self, event: BeforeInvocationEvent) -> None:
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(self.store.writer_lock(self.session_id))
        self._lock_stack = stack
        self._holding = True

    async def _on_message_added(self, event: MessageAddedEvent) -> None:
        await self._commit(event.agent)

    async def _on_after_invocation(self, event: AfterInvocationEvent) -> None:
        try:
            if not isinstance(event.exception, SessionConflictError | SessionLockedError):
                await self._commit(event.agent, state_only=True)
            if self._flush is not None:
                await self._flush(self.session_id)
        finally:
            stack, self._lock_stack = self._lock_stack, None
            self._holding = False
            if stack is not None:
                await stack.aclose()

    # ------------------------------------------------------------------ operations

    async def save(self) -> None:
        """Persist state changed outside a turn (``agent.state.set`` between turns,
        pending interrupts, model state).

        Raises:
            TurnRunningError: the agent is running a turn (its hooks persist it).
            ValueError: the session has no agent yet.
        """
        agent = self._require_agent()
        if agent.turn_running:
            raise TurnRunningError("session.save() while a turn runs; the turn persists itself")
        async with self._locked():
            await self._commit(agent, state_only=True)

    async def history(self, offset: int = 0, limit: int = 50) -> HistoryPage:
        """A page of the stored history (pairs never split; advance with ``next_offset``)."""
        return await read_history_page(self.store, self.session_id, offset=offset, limit=limit)

    async def redact_latest_message(self, replacement: Message) -> None:
        """Replace the latest message, in the agent and in what reads return.

        The store keeps the original beside the replacement.

        Raises:
            ValueError: there is no message, or ``replacement`` is malformed.
        """
        agent = self._require_agent()
        replacement = copy.deepcopy(validate_message(replacement, "replacement"))
        if not agent.messages:
            raise ValueError("there is no message to redact")
        index = agent.conversation_manager.removed_message_count + len(agent.messages) - 1
        stored = self._filter_message(replacement, "session")
        agent.messages[-1] = replacement
        async with self._locked():
            await self._commit(agent, redactions={index: stored})

    # ------------------------------------------------------------------ checkpoints

    async def checkpoint(self, label: str | None = None) -> CheckpointMeta:
        """Write a ``manual`` checkpoint of the whole stored session now.

        Raises:
            TurnRunningError: the agent is running a turn (no side effect).
            StoreNotWiredError: the session has no checkpoint store.
            SessionLockedError: another writer holds the session.
        """
        if label is not None and not isinstance(label, str):
            raise TypeError(f"label must be a str or None, got {type(label).__name__}")
        self._refuse_during_turn("checkpoint")
        checkpoints = self._require_checkpoints("checkpoint")
        async with self._locked():
            return await self._write_checkpoint(checkpoints, "manual", label)

    async def list_checkpoints(self) -> list[CheckpointMeta]:
        """The session's checkpoints, oldest first (``[]`` when none are wired).

        Raises:
            SessionCorruptedError: one is too damaged to list;
                :func:`~perdure.session.scan_checkpoints` lists it, marked, with the others.
        """
        if self.checkpoints is None:
            return []
        return await self.checkpoints.list(self.session_id)

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Delete a checkpoint; deleting one that is gone is fine.

        Raises:
            ValueError: ``checkpoint_id`` is not a well-formed ULID.
            TurnRunningError: the agent is running a turn.
            SessionLockedError: another writer holds the session (nothing deleted).
        """
        check_checkpoint_id(checkpoint_id)
        self._refuse_during_turn("delete_checkpoint")
        if self.checkpoints is not None:
            async with self._locked():
                await self.checkpoints.delete(self.session_id, checkpoint_id)

    async def restore(self, checkpoint_id: str, checkpoint: bool = True) -> RestoreResult:
        """Replace the whole history with a checkpoint's (``rewritten`` commit).

        A ``pre_restore`` checkpoint of the current state is written first unless
        ``checkpoint=False``. Restoring the same checkpoint twice rewrites twice.

        Raises:
            ValueError: ``checkpoint_id`` is not a well-formed ULID.
            CheckpointNotFoundError: no such checkpoint.
            SessionMismatchError: the checkpoint belongs to another session.
            SessionCorruptedError: the checkpoint does not match its sha256 or is
                otherwise damaged; nothing is written.
        """
        check_checkpoint_id(checkpoint_id)
        if self._agent is not None and self._agent.turn_running:
            return RestoreResult("rejected", "turn_running")
        if self.checkpoints is None:
            return RestoreResult("rejected", "store_not_wired")
        record = await self._load_checkpoint(self.checkpoints, checkpoint_id)
        messages, state = self._filter_all(record.messages, record.agent_state, "session")
        async with self._locked():
            current = await self.store.get(self.session_id)
            pre: CheckpointMeta | None = None
            if checkpoint:
                pre = await self._write_checkpoint(self.checkpoints, "pre_restore", None, current)
            result = await self.store.commit(
                self.session_id,
                messages,
                agent_state=state,
                rewritten=True,
                expected_tail=current.tail,
            )
            self._tail = result.tail
            self._tail_unknown = False
            self._count = result.message_count
            if self._agent is not None:
                restored = await self.store.get(self.session_id)
                self._reset_agent(self._agent)
                await self._restore(self._agent, restored)
        outcome = RestoreResult(
            "restored",
            None,
            current.meta.message_count,
            len(record.messages),
            pre.checkpoint_id if pre else None,
        )
        await self._emit(
            SessionRestoredEvent,
            session_id=self.session_id,
            checkpoint_id=checkpoint_id,
            from_messages=outcome.from_messages,
            to_messages=outcome.to_messages,
            pre_restore_checkpoint_id=outcome.pre_restore_checkpoint_id,
        )
        return outcome

    async def fork(self, checkpoint_id: str) -> str:
        """Start a new session from a checkpoint; this session is untouched.

        Returns the new session's id.

        Raises:
            ValueError: ``checkpoint_id`` is not a well-formed ULID.
            StoreNotWiredError: no checkpoint store is wired.
            CheckpointNotFoundError: no such checkpoint.
            SessionMismatchError: the checkpoint belongs to another session.
            SessionCorruptedError: the checkpoint does not match its sha256 or is
                otherwise damaged; nothing is written.
        """
        check_checkpoint_id(checkpoint_id)
        checkpoints = self._require_checkpoints("fork")
        record = await self._load_checkpoint(checkpoints, checkpoint_id)
        messages, state = self._filter_all(record.messages, record.agent_state, "session")
        new_id = new_session_id()
        # Created under its writer lock, held until the history is in: a fork killed
        # halfway leaves a session a store can tell from one a user made (a file
        # store marks it provisional, and gc removes it once nobody holds it).
        async with self.store.writer_lock(new_id):
            await self.store.create(new_id)
            await self.store.commit(new_id, messages, agent_state=state)
        return new_id

    async def export_checkpoint(
        self, checkpoint_id: str, signing_key: bytes | str | None = None
    ) -> bytes:
        """A self-contained ``perdure-checkpoint/1`` export of a checkpoint.

        With ``signing_key`` it is signed with HMAC-SHA256 (see
        :mod:`perdure.checkpoints.export`), so an import given the same key as its
        ``verify_key`` refuses any edit, even one whose sha256 was recomputed.

        Raises:
            ValueError: ``checkpoint_id`` is not a well-formed ULID, or
                ``signing_key`` is empty.
            StoreNotWiredError: no checkpoint store is wired.
            CheckpointNotFoundError: no such checkpoint.
            SessionCorruptedError: the checkpoint does not match its sha256 or is
                otherwise damaged (a damaged checkpoint is never exported).
        """
        check_checkpoint_id(checkpoint_id)
        checkpoints = self._require_checkpoints("export_checkpoint")
        record = await self._load_checkpoint(checkpoints, checkpoint_id)
        if self._filters:
            messages, state = self._filter_all(record.messages, record.agent_state, "export")
            record = CheckpointRecord(record.meta, messages, state)
        return export_checkpoint_bytes(record, signing_key=signing_key)

    async def import_checkpoint(
        self,
        data: bytes | ImportedCheckpoint,
        verify_key: bytes | str | None = None,
        *,
        progress: ImportProgress | None = None,
    ) -> CheckpointMeta:
        """Verify an export and store it as an ``import`` checkpoint of this session.

        With ``verify_key`` the export must carry a valid HMAC-SHA256 signature under
        that key; without one, signed and unsigned exports import alike (the sha256
        detects damage, not forgery). ``progress(done, total)`` follows the checks
        (see :func:`~perdure.checkpoints.export.import_checkpoint_bytes`); the write
        comes after its last call. ``data`` may also be what
        :func:`verify_export` returned (it is not checked again).

        Raises:
            CheckpointImportError: the export failed any check (with ``verify_key``:
                its signature is missing or wrong); nothing was written.
            StoreNotWiredError: no checkpoint store is wired.
            SessionLockedError: another writer holds the session (nothing written).
            ValueError: ``verify_key`` is empty.
        """
        checkpoints = self._require_checkpoints("import_checkpoint")
        if isinstance(data, ImportedCheckpoint):
            imported = data
        else:
            imported = await verify_export(data, verify_key, progress=progress)
        messages, state = self._filter_all(imported.messages, imported.agent_state, "checkpoint")
        async with self._locked():
            meta = CheckpointMeta(
                checkpoint_id=await new_checkpoint_id(checkpoints, self.session_id),
                session_id=self.session_id,
                trigger="import",
                label=imported.meta.label,
                message_count=len(imported.messages),
                created_at=now_iso(),
            )
            await checkpoints.put(CheckpointRecord(meta, messages, state))
        return meta

    # ------------------------------------------------------------------ compaction

    async def compact(
        self, instructions: str | None = None, checkpoint: bool | None = None
    ) -> CompactResult:
        """Fold everything before the latest user turn into one summary message.

        A ``pre_compaction`` checkpoint is written first (unless ``checkpoint`` is
        false, or ``None`` and the session's default is off). Needs no known context
        window: any non-empty text the model returns is a valid summary. The model is
        the conversation manager's summarisation model if it names one, else the
        agent's.
        """
        agent = self._agent
        if agent is not None and agent.turn_running:
            return CompactResult("rejected", "turn_running")
        if agent is None:
            return CompactResult("rejected", "not_configured")
        if not agent.messages:
            return CompactResult("rejected", "empty_history")
        end = latest_user_turn(agent.messages)
        async with self._locked():
            return await self._compact(
                agent, end, instructions=instructions, checkpoint=checkpoint, trigger="manual"
            )

    async def apply_compaction(
        self, agent: Agent, end: int, summary: str, *, trigger: str = "auto"
    ) -> CompactResult:
        """Fold ``agent.messages[:end]`` into ``summary`` (automatic compaction in a turn).

        Called by :class:`SummarizingConversationManager`; writes the
        ``pre_compaction`` checkpoint and rewrites the store like :meth:`compact`.
        """
        async with self._locked():
            return await self._compact(agent, end, summary=summary, trigger=trigger)

    async def _compact(
        self,
        agent: Agent,
        end: int,
        *,
        instructions: str | None = None,
        summary: str | None = None,
        checkpoint: bool | None = None,
        trigger: str,
    ) -> CompactResult:
        before = await agent.hooks.invoke(BeforeCompactEvent(agent=agent, end=end, trigger=trigger))
        if before.cancel:
            return CompactResult("rejected", "hook_blocked")
        await self._commit(agent, state_only=True)
        pre: CheckpointMeta | None = None
        wanted = self.checkpoint_before_compact if checkpoint is None else checkpoint
        if wanted and self.checkpoints is not None:
            pre = await self._write_checkpoint(self.checkpoints, "pre_compaction", None)
        pre_id = pre.checkpoint_id if pre else None
        if end <= 0:
            return CompactResult("failed", "nothing_to_compact", checkpoint_id=pre_id)
        if summary is None:
            manager = agent.conversation_manager
            model = getattr(manager, "summarization_model", None) or agent.model
            try:
                summary = await summarize(
                    model,
                    agent.messages[:end],
                    instructions=instructions,
                    prompt=getattr(manager, "summarization_prompt", None),
                )
            except SummaryError as exc:
                return CompactResult("failed", exc.reason, checkpoint_id=pre_id)
        offset = agent.conversation_manager.removed_message_count
        folded = [summary_message(summary), *agent.messages[end:]]
        agent.conversation_manager.removed_message_count = 0
        try:
            messages, state = self._filter_all(folded, _agent_state(agent), "session")
            result = await self.store.commit(
                self.session_id,
                messages,
                agent_state=state,
                rewritten=True,
                expected_tail=self._tail,
            )
        except BaseException:
            agent.conversation_manager.removed_message_count = offset
            raise
        agent.messages[:] = folded
        self._tail = result.tail
        self._tail_unknown = False
        self._count = result.message_count
        self._mark_synced(agent)
        compaction = CompactResult(
            "compacted", None, new_compaction_id(), (0, offset + end), pre_id
        )
        await self._emit(
            SessionCompactedEvent,
            session_id=self.session_id,
            compaction_id=compaction.compaction_id or "",
            removed_range=compaction.removed_range or (0, 0),
            checkpoint_id=pre_id,
            trigger=trigger,
        )
        return compaction

    # ------------------------------------------------------------------ internals

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        """Hold the session's writer lock, unless this session already holds it."""
        if self._holding:
            yield
            return
        async with self.store.writer_lock(self.session_id):
            self._holding = True
            try:
                yield
            finally:
                self._holding = False

    def _refuse_during_turn(self, operation: str) -> None:
        if self._agent is not None and self._agent.turn_running:
            raise TurnRunningError(f"session.{operation}() is refused while a turn runs")

    def _require_checkpoints(self, operation: str) -> CheckpointStore:
        if self.checkpoints is None:
            raise StoreNotWiredError(
                f"session.{operation}() needs a checkpoint store; none is wired "
                "(pass checkpoints= to Session, or use a store that keeps them)"
            )
        return self.checkpoints

    async def _load_checkpoint(
        self, checkpoints: CheckpointStore, checkpoint_id: str
    ) -> CheckpointRecord:
        record = await checkpoints.get(self.session_id, checkpoint_id)
        if record.meta.session_id != self.session_id:
            raise SessionMismatchError(
                f"checkpoint {checkpoint_id} belongs to session {record.meta.session_id!r}, "
                f"not {self.session_id!r}"
            )
        return record

    async def _write_checkpoint(
        self,
        checkpoints: CheckpointStore,
        trigger: CheckpointTrigger,
        label: str | None,
        current: SessionRecord | None = None,
    ) -> CheckpointMeta:
        """Snapshot the stored session (after syncing the agent's state) as a checkpoint."""
        if current is None:
            if self._agent is not None:
                await self._commit(self._agent, state_only=True)
            current = await self.store.get(self.session_id)
        meta = CheckpointMeta(
            checkpoint_id=await new_checkpoint_id(checkpoints, self.session_id),
            session_id=self.session_id,
            trigger=trigger,
            label=label,
            message_count=current.meta.message_count,
            created_at=now_iso(),
        )
        messages, state = self._filter_all(current.messages, current.agent_state, "checkpoint")
        await checkpoints.put(CheckpointRecord(meta, messages, state))
        await self._emit(
            SessionCheckpointedEvent,
            session_id=self.session_id,
            checkpoint_id=meta.checkpoint_id,
            trigger=trigger,
            label=label,
            message_count=meta.message_count,
        )
        return meta

    async def _emit(self, event_type: type[HookEvent], **fields: Any) -> None:
        if self._agent is not None:
            await self._agent.hooks.invoke(event_type(agent=self._agent, **fields))

    def _reset_agent(self, agent: Agent) -> None:
        """Forget the agent's state before a restore puts the checkpoint's in."""
        agent.state = AgentState()
        agent.interrupt_state = InterruptState()
        agent.model_state = {}
        agent.conversation_manager.removed_message_count = 0

    def _require_agent(self) -> Agent:
        if self._agent is None:
            raise ValueError("this session is not attached to an agent yet")
        return self._agent

    async def _load(self) -> None:
        try:
            self._record = await self._read_window()
        except SessionNotFoundError:
            if self._must_exist:
                raise
            await self.store.create(self.session_id, exist_ok=not self._new)
            self._record = await self._read_window()
        self._tail = self._record.tail
        self._tail_unknown = False
        self._count = self._record.meta.message_count

    async def _read_window(self) -> SessionRecord:
        """The stored session from where the agent's history will start.

        That is the stored conversation manager's offset (its removed-message count),
        less one message: repair on resume looks at the message before the window.
        A first read past the end costs only the latest state and the tail (stores
        read only from ``offset``); the second reads the window. Its cost follows
        the window, not the whole history (SPEC §7.1). Each read is consistent in
        itself, so a writer that moved the state on in between only makes the
        window start earlier than needed, or (after a compaction) read again.
        """
        record = await self.store.get(self.session_id, offset=_PAST_END)
        for _ in range(_WINDOW_READS):
            start = max(0, _stored_offset(record.agent_state) - 1)
            if record.offset <= start:
                return record
            record = await self.store.get(self.session_id, offset=start)
        return await self.store.get(self.session_id)

    async def _restore(self, agent: Agent, record: SessionRecord) -> None:
        """Restore ``agent`` from ``record``: a window (see :meth:`_read_window`) or all.

        A window is used as it is when it needs no repair: the agent then holds
        exactly what a whole read, repaired and trimmed, would give it (pairs the
        manager dropped earlier are not looked at again). Otherwise the whole
        history is read, repaired and written back, as it always was.
        """
        prepend = self._restore_state(agent, record.agent_state)
        offset = agent.conversation_manager.removed_message_count
        if record.offset > 0:
            # Only the window was read: messages record.offset.. of the history.
            at = offset - record.offset
            kept = record.messages[at:] if at >= 1 else []
            before = record.messages[at - 1] if 1 <= at <= len(record.messages) else None
            if at >= 1 and not tail_repairs(before, kept):
                agent.messages = [*(prepend or []), *kept]
                self._mark_synced(agent)
                return
            # The window needs a repair (written back over the whole history), or the
            # manager restored an offset the window does not reach: read everything.
            record = await self.store.get(self.session_id)
            self._tail = record.tail
            self._tail_unknown = False
            self._count = record.meta.message_count
            prepend = self._restore_state(agent, record.agent_state)
            offset = agent.conversation_manager.removed_message_count
        repaired, changes = repair_tool_pairs(record.messages)
        if changes:
            # Write the repair back once, so the session is never repaired again.
            stored = self._filters.messages(repaired, "session", self.session_id)
            async with self._locked():
                result = await self.store.commit(
                    self.session_id, stored, rewritten=True, expected_tail=self._tail
                )
            self._tail = result.tail
            self._tail_unknown = False
            self._count = result.message_count
        offset = min(offset, len(repaired))
        agent.messages = [*(prepend or []), *repaired[offset:]]
        self._mark_synced(agent)

    def _restore_state(self, agent: Agent, saved: dict[str, Any]) -> list[Message] | None:
        """Put the stored agent state, internal state and manager state into ``agent``.

        Returns the messages the conversation manager puts in front of the history.
        """
        if not saved:
            return None
        _check_agent_state(self.session_id, saved)
        agent.state = AgentState(saved.get("state") or {})
        internal = saved.get("internal_state") or {}
        agent.interrupt_state = InterruptState.from_dict(internal.get("interrupt_state") or {})
        agent.model_state = copy.deepcopy(internal.get("model_state") or {})
        manager_state = saved.get("conversation_manager_state")
        if not manager_state:
            return None
        return agent.conversation_manager.restore_from_session(manager_state)

    async def _commit(
        self,
        agent: Agent,
        *,
        state_only: bool = False,
        redactions: dict[int, Message] | None = None,
    ) -> None:
        key = self._state_key(agent)
        model_changed = agent.model_state != self._synced_model_state
        state = _agent_state(agent) if model_changed or key != self._synced else None
        offset = agent.conversation_manager.removed_message_count
        history: Sequence[Message] = PastOffset(
            offset,
            agent.messages,
            "were trimmed by the conversation manager and are only in the store",
        )
        if state_only and state is None and not redactions and not self._tail_unknown:
            return
        if self._filters:
            # From the last message the store holds: with no expected tail a store
            # compares it with its own (check_extends), and its own is filtered.
            start = max(self._count - 1, offset)
            history = _Filtered(history, start, self._filters, self.session_id)
            if state is not None:
                state = self._filters.state(state, "session", self.session_id)
        try:
            result = await self.store.commit(
                self.session_id,
                history,
                agent_state=state,
                expected_tail=self._tail,
                redactions=redactions,
            )
        except _REFUSED:
            raise  # nothing written: the tail known is still the store's
        except BaseException:
            # Cancelled (or interrupted, or failed as an fsync did) once the store may
            # have written: whether the commit landed is unknown, and the tail known
            # may be one this writer's own commit moved on from. The next commit goes
            # without one: the store then checks that this history extends what it
            # holds (its last stored message against this one's) and appends only
            # what it lacks, instead of refusing the session for ever as changed by
            # "another writer" that does not exist. Until a commit has gone through,
            # every commit is made (one with nothing new writes nothing and learns the
            # tail), so a rewrite (a compaction) never goes without one.
            self._tail, self._tail_unknown = None, True
            raise
        self._tail, self._tail_unknown = result.tail, False
        self._count = result.message_count
        self._synced = key
        if model_changed:
            self._synced_model_state = copy.deepcopy(agent.model_state)

    def _filter_message(self, message: Message, write: Literal["session"]) -> Message:
        if not self._filters:
            return message
        filtered: Message = self._filters.message(message, write, self.session_id)
        return filtered

    def _filter_all(
        self,
        messages: list[Message],
        state: dict[str, Any],
        write: Literal["session", "checkpoint", "export"],
    ) -> tuple[list[Message], dict[str, Any]]:
        """Messages and agent state through the filters (as they are without any)."""
        if not self._filters:
            return messages, state
        return (
            self._filters.messages(messages, write, self.session_id),
            dict(self._filters.state(state, write, self.session_id)),
        )

    def _mark_synced(self, agent: Agent) -> None:
        """Record that the store holds the agent's state as it is now."""
        self._synced = self._state_key(agent)
        self._synced_model_state = copy.deepcopy(agent.model_state)

    @staticmethod
    def _state_key(agent: Agent) -> tuple[Any, ...]:
        """What decides, with the model state, whether the persisted state is stale."""
        return (
            id(agent.state),
            agent.state.version,
            id(agent.interrupt_state),
            agent.interrupt_state.version,
            agent.conversation_manager.get_state(),
        )


# What a commit raises having written nothing (its arguments refused, another writer's
# tail or lock met, the session gone): the tail known is still the store's.
_REFUSED = (
    SessionConflictError,
    SessionLockedError,
    SessionNotFoundError,
    SessionMismatchError,
    TypeError,
    ValueError,
)


def _agent_state(agent: Agent) -> dict[str, Any]:
    return {
        "format": AGENT_STATE_FORMAT,
        "agent_id": agent.agent_id,
        "state": agent.state.get(),
        "internal_state": {
            "interrupt_state": agent.interrupt_state.to_dict(),
            "model_state": copy.deepcopy(agent.model_state),
        },
        "conversation_manager_state": agent.conversation_manager.get_state(),
    }


def _stored_offset(saved: dict[str, Any]) -> int:
    """The removed-message count in a stored agent state (0 when absent or malformed:
    the restore then reads everything and reports what is wrong)."""
    manager = saved.get("conversation_manager_state")
    count = manager.get("removed_message_count") if isinstance(manager, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def _check_agent_state(session_id: str, saved: dict[str, Any]) -> None:
    if saved.get("format") != AGENT_STATE_FORMAT or not isinstance(saved.get("state", {}), dict):
        raise SessionCorruptedError(
            f"session {session_id!r} holds agent state of an unknown format {saved.get('format')!r}"
        )


async def read_history_page(
    store: SessionStore, session_id: str, *, offset: int = 0, limit: int = 50
) -> HistoryPage:
    """A pair-aligned page of a stored session, without an agent (a dormant session).

    Uses the store's ``history_page`` when it has one (reading only what the page
    needs), else reads the session and pages it with the same rule.
    """
    validate_session_id(session_id)
    check_page_args(offset, limit)
    if isinstance(store, SupportsHistoryPage):
        return await store.history_page(session_id, offset, limit)
    record = await store.get(session_id)
    messages = record.messages
    start, end = page_bounds(len(messages), offset, limit, messages.__getitem__)
    return HistoryPage(messages[start:end], start, end, len(messages))
