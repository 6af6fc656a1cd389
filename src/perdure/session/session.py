"""Session: the message-log session manager of one agent (SPEC §7, seed 000 §5).

Persistence rides on the agent's hooks:

- ``AgentInitializedEvent`` restores the agent from the store, in the order of seed
  000 §5.4: agent state, internal state (interrupts, model state), the conversation
  manager's state (with its removed-message offset), then the messages from that
  offset — repaired so the model accepts them, the repair written back once.
- ``BeforeInvocationEvent`` takes the session's writer lock for the whole turn
  (``SessionLockedError`` at once if another writer holds it);
  ``AfterInvocationEvent`` syncs state, flushes, and releases it. Nothing is held
  between turns.
- ``MessageAddedEvent`` commits the new message (and the agent's state when it
  changed), checking that the stored tail is the one this ``Session`` last saw:
  a stale ``Session`` gets ``SessionConflictError`` instead of forking the journal.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from perdure._runner import in_running_loop, is_runner_thread, run_blocking
from perdure.agent.conversation.pairing import repair_tool_pairs
from perdure.agent.interrupt_state import InterruptState
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
    TurnRunningError,
)
from perdure.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    BeforeInvocationEvent,
    HookRegistry,
    MessageAddedEvent,
)
from perdure.session.ids import new_session_id, validate_session_id
from perdure.session.paging import check_page_args, page_bounds
from perdure.session.store import (
    HistoryPage,
    SessionRecord,
    SessionStore,
    SupportsFlush,
    SupportsHistoryPage,
)
from perdure.state import AgentState
from perdure.types import Message, validate_message

if TYPE_CHECKING:
    from perdure.agent import Agent

AGENT_STATE_FORMAT = "perdure-agent-state/1"


class _History(Sequence[Message]):
    """The whole history as a store sees it: ``offset`` trimmed messages, then the agent's.

    Stores only read the part past what they hold, which the agent still has.
    """

    def __init__(self, offset: int, messages: list[Message]) -> None:
        self._offset = offset
        self._messages = messages

    def __len__(self) -> int:
        return self._offset + len(self._messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1 or start < self._offset:
                raise IndexError(
                    f"messages before index {self._offset} were trimmed by the conversation "
                    "manager and are only in the store"
                )
            return self._messages[start - self._offset : stop - self._offset]
        if index < 0:
            index += len(self)
        if index < self._offset:
            raise IndexError(f"message {index} was trimmed by the conversation manager")
        return self._messages[index - self._offset]

    def __iter__(self) -> Iterator[Message]:
        if self._offset:
            raise IndexError("the trimmed part of the history is only in the store")
        return iter(self._messages)


class Session:
    """Persists one agent's conversation, state and loop position in a ``SessionStore``.

    Args:
        store: where the session lives.
        session_id: open this session, creating it if absent; ``None`` starts a new
            one with a fresh id.

    Give it to ``Agent(session_manager=session)``. Every coroutine may be awaited
    from any event loop and any thread.
    """

    def __init__(self, store: SessionStore, session_id: str | None = None) -> None:
        if not isinstance(store, SessionStore):
            raise TypeError(f"store must implement SessionStore, got {type(store).__name__}")
        self.store = store
        self._new = session_id is None
        self.session_id = (
            validate_session_id(session_id) if session_id is not None else new_session_id()
        )
        self._must_exist = False
        self._record: SessionRecord | None = None
        self._agent: Agent | None = None
        self._tail: str | None = None
        self._lock_stack: contextlib.AsyncExitStack | None = None
        self._synced: tuple[Any, ...] | None = None

    def __repr__(self) -> str:
        return f"Session({self.store!r}, {self.session_id!r})"

    @classmethod
    def resume(cls, store: SessionStore, session_id: str) -> Session:
        """Open a session that must exist.

        Raises:
            SessionNotFoundError: no session ``session_id`` (raised here when called
                outside a running event loop, else when the agent initialises).
            SessionCorruptedError: the stored session is damaged.
        """
        session = cls(store, session_id)
        session._must_exist = True
        if not in_running_loop() and not is_runner_thread():
            run_blocking(session._load())
        return session

    @classmethod
    async def open(
        cls, store: SessionStore, session_id: str | None = None, *, must_exist: bool = False
    ) -> Session:
        """Async twin of the constructor and :meth:`resume`: reads the session now."""
        session = cls(store, session_id)
        session._must_exist = must_exist
        await session._load()
        return session

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
        self._agent = agent
        if self._record is None:
            await self._load()
        assert self._record is not None
        await self._restore(agent, self._record)
        self._record = None  # the agent holds it now; do not keep a second copy

    async def _on_before_invocation(self, event: BeforeInvocationEvent) -> None:
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(self.store.writer_lock(self.session_id))
        self._lock_stack = stack

    async def _on_message_added(self, event: MessageAddedEvent) -> None:
        await self._commit(event.agent)

    async def _on_after_invocation(self, event: AfterInvocationEvent) -> None:
        try:
            if not isinstance(event.exception, SessionConflictError | SessionLockedError):
                await self._commit(event.agent, state_only=True)
            if isinstance(self.store, SupportsFlush):
                await self.store.flush(self.session_id)
        finally:
            stack, self._lock_stack = self._lock_stack, None
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
        async with self.store.writer_lock(self.session_id):
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
        agent.messages[-1] = replacement
        if self._lock_stack is not None:  # inside a turn: the lock is ours
            await self._commit(agent, redactions={index: replacement})
            return
        async with self.store.writer_lock(self.session_id):
            await self._commit(agent, redactions={index: replacement})

    # ------------------------------------------------------------------ internals

    def _require_agent(self) -> Agent:
        if self._agent is None:
            raise ValueError("this session is not attached to an agent yet")
        return self._agent

    async def _load(self) -> None:
        try:
            self._record = await self.store.get(self.session_id)
        except SessionNotFoundError:
            if self._must_exist:
                raise
            await self.store.create(self.session_id, exist_ok=not self._new)
            self._record = await self.store.get(self.session_id)
        self._tail = self._record.tail

    async def _restore(self, agent: Agent, record: SessionRecord) -> None:
        saved = record.agent_state
        if saved:
            _check_agent_state(self.session_id, saved)
            agent.state = AgentState(saved.get("state") or {})
            internal = saved.get("internal_state") or {}
            agent.interrupt_state = InterruptState.from_dict(internal.get("interrupt_state") or {})
            agent.model_state = copy.deepcopy(internal.get("model_state") or {})
            manager_state = saved.get("conversation_manager_state")
            prepend = (
                agent.conversation_manager.restore_from_session(manager_state)
                if manager_state
                else None
            )
        else:
            prepend = None
        repaired, changes = repair_tool_pairs(record.messages)
        offset = agent.conversation_manager.removed_message_count
        if changes:
            # Write the repair back once, so the session is never repaired again.
            async with self.store.writer_lock(self.session_id):
                result = await self.store.commit(
                    self.session_id, repaired, rewritten=True, expected_tail=self._tail
                )
            self._tail = result.tail
        offset = min(offset, len(repaired))
        agent.messages = [*(prepend or []), *repaired[offset:]]
        self._synced = self._state_key(agent)

    async def _commit(
        self,
        agent: Agent,
        *,
        state_only: bool = False,
        redactions: dict[int, Message] | None = None,
    ) -> None:
        key = self._state_key(agent)
        state = _agent_state(agent) if key != self._synced else None
        offset = agent.conversation_manager.removed_message_count
        history = _History(offset, agent.messages)
        if state_only and state is None and not redactions:
            return
        result = await self.store.commit(
            self.session_id,
            history,
            agent_state=state,
            expected_tail=self._tail,
            redactions=redactions,
        )
        self._tail = result.tail
        self._synced = key

    @staticmethod
    def _state_key(agent: Agent) -> tuple[Any, ...]:
        """What decides whether the persisted state is stale (versions, then values)."""
        return (
            id(agent.state),
            agent.state.version,
            id(agent.interrupt_state),
            agent.interrupt_state.version,
            copy.deepcopy(agent.model_state),
            agent.conversation_manager.get_state(),
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
