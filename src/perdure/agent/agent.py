"""Agent: the loop, its tools, hooks, state, and the ways to invoke it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from perdure._runtime.loop import in_running_loop, run_blocking, run_sync
from perdure._runtime.threads import ProcessLock
from perdure.agent.checkpoint import Checkpoint
from perdure.agent.conversation import ConversationManager, SlidingWindowConversationManager
from perdure.agent.conversation.pairing import UserRunWatch
from perdure.agent.event_loop import (
    LoopStart,
    StreamInterrupt,
    pending_tool_uses,
    placeholder_results,
    run_loop,
)
from perdure.agent.events import AgentEvent, ResultEvent
from perdure.agent.interrupt_state import InterruptState
from perdure.agent.plugin import Plugin
from perdure.agent.result import AgentResult
from perdure.agent.snapshot import Snapshot, SnapshotField, resolve_snapshot_fields
from perdure.errors import CheckpointError, SnapshotError, TurnRunningError
from perdure.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    BeforeInvocationEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
    MiddlewareRegistry,
)
from perdure.models import Model, from_string
from perdure.state import AgentState
from perdure.tools import AgentTool, ToolRegistry
from perdure.types import (
    ContentBlock,
    Message,
    validate_content_block,
    validate_storable,
    validate_storable_message,
)

Prompt = str | Sequence[ContentBlock] | Sequence[Message] | None

_RESUME_KEYS = ("checkpointResume", "interruptResponse")


class Agent:
    """An LLM agent: a model, tools, and a loop whose state can be persisted.

    Args:
        model: the :class:`~perdure.models.Model` the loop calls, or a spec such as
            ``"openai:gpt-4o-mini"``, ``"anthropic:MODEL"`` or ``"scripted"`` that
            :func:`~perdure.models.from_string` builds one from (an unknown provider
            raises ``ValueError``, a missing SDK ``ImportError`` naming the extra).
        tools: tools (``@tool`` functions, :class:`~perdure.tools.AgentTool`
            objects, or plain annotated functions).
        system_prompt: the system prompt sent with every model call.
        messages: an initial history (deep-copied and validated).
        state: an :class:`~perdure.state.AgentState` or a dict to build one from.
        agent_id: names this agent inside a session (no path separators).
        conversation_manager: trims the history after each invocation; default
            :class:`SlidingWindowConversationManager` (never splits a tool pair).
        session_manager: a hook provider that persists the agent (e.g. ``Session``).
        memory_manager: a plugin that searches and injects long-term memory.
        plugins: objects with ``name`` and ``init_agent(agent)``.
        hooks: :class:`~perdure.hooks.HookProvider` objects.
        checkpointing: pause at ``after_model`` / ``after_tools`` with
            ``stop_reason="checkpoint"``.
        max_cycles: at most this many model calls per invocation; past it the loop
            stops with ``stop_reason="max_cycles"``.
        name: a display name (defaults to ``agent_id``).

    One turn at a time: a second invocation while one runs raises
    :class:`~perdure.errors.TurnRunningError`.

    Built where no event loop runs, the agent is ready when the constructor returns:
    a session manager has restored it, or raised ``SessionNotFoundError`` /
    ``SessionCorruptedError`` / ``DecryptionError`` from the constructor. Built inside
    a running loop, the constructor does no I/O: the restore runs at
    ``await agent.initialize()`` or the first invocation, which raise those errors
    (``await Agent.create(...)`` does both in one step).
    """

    def __init__(
        self,
        model: Model | str,
        tools: Iterable[AgentTool | Callable[..., Any]] = (),
        system_prompt: str | None = None,
        messages: Sequence[Message] | None = None,
        state: AgentState | dict[str, Any] | None = None,
        agent_id: str = "default",
        conversation_manager: ConversationManager | None = None,
        session_manager: HookProvider | None = None,
        memory_manager: Plugin | None = None,
        plugins: Iterable[Plugin] = (),
        hooks: Iterable[HookProvider] = (),
        checkpointing: bool = False,
        *,
        max_cycles: int = 50,
        name: str | None = None,
    ) -> None:
        if isinstance(model, str):
            model = from_string(model)  # the adapter's SDK is imported only now
        if not callable(getattr(model, "stream", None)):
            raise TypeError(
                f"model must implement the Model protocol (a stream method), got {model!r}"
            )
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise TypeError(
                f"system_prompt must be a str or None, got {type(system_prompt).__name__}"
            )
        _check_id(agent_id, "agent_id")
        if not isinstance(checkpointing, bool):
            raise TypeError(f"checkpointing must be a bool, got {type(checkpointing).__name__}")
        if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
            raise ValueError(f"max_cycles must be an int >= 1, got {max_cycles!r}")
        if conversation_manager is not None and not isinstance(
            conversation_manager, ConversationManager
        ):
            raise TypeError(
                f"conversation_manager must be a ConversationManager, got {conversation_manager!r}"
            )

        self.model = model
        self.system_prompt = system_prompt
        self.agent_id = agent_id
        self.name = name or agent_id
        self.checkpointing = checkpointing
        self.max_cycles = max_cycles
        self.messages: list[Message] = self._copy_messages(messages)
        if state is None or isinstance(state, dict):
            self.state = AgentState(state)
        elif isinstance(state, AgentState):
            self.state = state
        else:
            raise TypeError(
                f"state must be an AgentState, a dict or None, got {type(state).__name__}"
            )
        self.conversation_manager: ConversationManager = (
            conversation_manager or SlidingWindowConversationManager()
        )
        self.interrupt_state = InterruptState()
        self.model_state: dict[str, Any] = {}
        self.tool_registry = ToolRegistry(tools)
        self.hooks = HookRegistry()
        self.middleware = MiddlewareRegistry()
        self.session_manager = session_manager
        self.memory_manager = memory_manager
        self.plugins: list[Plugin] = list(plugins)

        self._turn_lock = ProcessLock()
        self._cancel = threading.Event()
        self._stream_interrupt = StreamInterrupt()
        self._user_runs = UserRunWatch()  # before each model call (see event_loop)
        self._pending_init: list[Callable[[], Awaitable[None]]] = []
        self._initializing = False
        # initialize() runs once at a time, from any loop or thread: the others wait.
        self._init_guard = ProcessLock()
        self._init_running: concurrent.futures.Future[None] | None = None
        self._init_task: asyncio.Task[Any] | None = None
        self._init_error: Exception | None = None

        for provider in hooks:
            self.hooks.add_hook(provider)
        if session_manager is not None:
            self.hooks.add_hook(session_manager)
        for plugin in [*self.plugins, *([memory_manager] if memory_manager is not None else [])]:
            self._init_plugin(plugin)
        self._fire_initialized()

    # ------------------------------------------------------------------ invoking

    def __call__(self, prompt: Prompt = None) -> AgentResult:
        """Run one invocation synchronously and return its result.

        Runs on perdure's single long-lived event loop. After the invocation, a
        memory manager's background extraction is flushed.

        Called inside a running event loop (a notebook cell, a web handler), it
        still works, blocking that loop until it returns; a warning logged once
        names ``agent.invoke_async``.

        Raises:
            RuntimeError: called on perdure's own event-loop thread (from an async
                tool or hook of a running agent): use ``await agent.invoke_async(...)``.
            TurnRunningError: another invocation of this agent is running.
        """
        # The flush wrapper only for a memory manager that has one: a bare turn
        # should not pay for a second coroutine.
        coro = (
            self.invoke_async(prompt)
            if getattr(self.memory_manager, "flush", None) is None
            else self._invoke_and_flush(prompt)
        )
        return run_sync(coro, async_name="agent.invoke_async(prompt)")

    async def _invoke_and_flush(self, prompt: Prompt) -> AgentResult:
        result = await self.invoke_async(prompt)
        flush = getattr(self.memory_manager, "flush", None)
        if flush is not None:
            await flush()
        return result

    async def invoke_async(self, prompt: Prompt = None) -> AgentResult:
        """Run one invocation and return its result (see :meth:`stream_async`)."""
        result: AgentResult | None = None
        async for event in self.stream_async(prompt):
            if isinstance(event, ResultEvent):
                result = event.result
        assert result is not None  # run_loop always ends with a ResultEvent
        return result

    async def stream_async(self, prompt: Prompt = None) -> AsyncIterator[AgentEvent]:
        """Run one invocation, yielding typed events as it goes; the last is a ResultEvent.

        ``prompt`` is a ``str``, a list of content blocks (one user message), a list
        of messages, ``None`` (go on from the current history), a single
        ``checkpointResume`` block (resume from a checkpoint) or
        ``interruptResponse`` blocks (answer pending interrupts).

        Raises:
            TurnRunningError: another invocation of this agent is running.
            TypeError, ValueError: ``prompt`` is malformed (the message says how).
            KeyError: a ``checkpointResume`` block has no ``checkpoint`` key.
            CheckpointError: the checkpoint is of another schema or does not fit the
                history.
        """
        if not self._turn_lock.acquire(blocking=False):
            raise TurnRunningError(
                f"agent {self.agent_id!r} is already running a turn; wait for it to finish "
                "(two concurrent turns would corrupt tool pairing)"
            )
        try:
            self._cancel.clear()
            await self.initialize()
            start, new_messages = self._plan(prompt)
            await self.hooks.invoke(BeforeInvocationEvent(agent=self, messages=new_messages))
            result: AgentResult | None = None
            error: BaseException | None = None
            try:
                for message in new_messages:
                    await self._append_message(message)
                async for event in run_loop(self, start):
                    if isinstance(event, ResultEvent):
                        result = event.result
                        managed = self.conversation_manager.apply_management(self)
                        if inspect.isawaitable(managed):
                            await managed
                    yield event
            except BaseException as exc:
                error = exc
                raise
            finally:
                await self.hooks.invoke(
                    AfterInvocationEvent(agent=self, result=result, exception=error)
                )
        finally:
            self._cancel.clear()
            self._turn_lock.release()

    def cancel(self) -> None:
        """Ask the running invocation to stop at its next boundary (thread-safe).

        The invocation ends with ``stop_reason="cancelled"`` and a model-valid
        history: tool calls the model asked for but that did not run get error
        results. Without a running invocation this does nothing.
        """
        if self._turn_lock.locked():
            self._cancel.set()
            self._stream_interrupt.poke()  # a wait for the model ends now

    @property
    def cancel_requested(self) -> bool:
        """True once :meth:`cancel` was called during the running invocation."""
        return self._cancel.is_set()

    @property
    def turn_running(self) -> bool:
        """True while an invocation runs."""
        return self._turn_lock.locked()

    @property
    def tool_names(self) -> list[str]:
        """The names of the agent's tools."""
        return self.tool_registry.names

    # --------------------------------------------------------------- snapshots

    def take_snapshot(
        self,
        preset: str | None = "session",
        include: Iterable[str | SnapshotField] | None = None,
        exclude: Iterable[str | SnapshotField] | None = None,
        app_data: dict[str, Any] | None = None,
    ) -> Snapshot:
        """Deep-copy the chosen fields of the agent into a :class:`Snapshot`.

        Fields are ``preset ∪ include − exclude`` (:func:`resolve_snapshot_fields`).

        Raises:
            SnapshotError: an unknown preset or field, or no field left.
        """
        fields = resolve_snapshot_fields(preset, include, exclude)
        data = {f.value: self._snapshot_value(f) for f in SnapshotField if f in fields}
        snapshot = Snapshot(data=data, app_data=copy.deepcopy(app_data) if app_data else {})
        snapshot.validate()
        return snapshot

    def _snapshot_value(self, field: SnapshotField) -> Any:
        """A copy of one field's value, as a snapshot holds it."""
        if field is SnapshotField.messages:
            return copy.deepcopy(self.messages)
        if field is SnapshotField.state:
            return self.state.get()
        if field is SnapshotField.conversation_manager_state:
            return self.conversation_manager.get_state()
        if field is SnapshotField.interrupt_state:
            return self.interrupt_state.to_dict()
        if field is SnapshotField.system_prompt:
            return self.system_prompt
        return copy.deepcopy(self.model_state)

    def load_snapshot(self, snapshot: Snapshot) -> None:
        """Restore the fields present in ``snapshot``; other fields stay as they are.

        The snapshot is validated before anything changes.

        Session managers restoring the agent while it initialises (which may happen
        at the start of its first invocation) are allowed to load; anyone else during
        a turn is refused.

        Raises:
            TurnRunningError: an invocation is running (loading would corrupt it).
            SnapshotError: the snapshot is malformed or of another schema.
        """
        if self.turn_running and not self._initializing:
            raise TurnRunningError("cannot load a snapshot while the agent is running a turn")
        if not isinstance(snapshot, Snapshot):
            raise TypeError(f"snapshot must be a Snapshot, got {type(snapshot).__name__}")
        snapshot.validate()
        data = snapshot.data
        try:
            messages = (
                self._copy_messages(data[SnapshotField.messages.value])
                if SnapshotField.messages.value in data
                else None
            )
            state = (
                AgentState(data[SnapshotField.state.value])
                if SnapshotField.state.value in data
                else None
            )
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"snapshot data is invalid: {exc}") from exc
        interrupt_state = (
            InterruptState.from_dict(data[SnapshotField.interrupt_state.value])
            if SnapshotField.interrupt_state.value in data
            else None
        )
        if SnapshotField.conversation_manager_state.value in data:
            try:
                self.conversation_manager.restore_from_session(
                    copy.deepcopy(data[SnapshotField.conversation_manager_state.value])
                )
            except ValueError as exc:
                raise SnapshotError(f"snapshot conversation_manager_state: {exc}") from exc
        if messages is not None:
            self.messages = messages
        if state is not None:
            self.state = state
        if interrupt_state is not None:
            self.interrupt_state = interrupt_state
        if SnapshotField.system_prompt.value in data:
            self.system_prompt = data[SnapshotField.system_prompt.value]
        if SnapshotField.model_state.value in data:
            self.model_state = copy.deepcopy(data[SnapshotField.model_state.value])

    # ------------------------------------------------------------------ internals

    async def _append_message(self, message: Message) -> None:
        """Append ``message`` to the history and tell the hooks (sessions persist here).

        Every message enters the history here, and is checked first: one no store
        could keep (NaN, infinity, nesting deeper than 200, a non-``str`` key — a
        model's tool input, a tool's result) raises ``ValueError`` naming its path
        before the history changes, so the agent stays usable and what a session
        stores is what the agent holds.
        """
        validate_storable_message(message, f"messages[{len(self.messages)}]")
        self.messages.append(message)
        await self.hooks.invoke(MessageAddedEvent(agent=self, message=message))

    def _plan(self, prompt: Prompt) -> tuple[LoopStart, list[Message]]:
        """Turn ``prompt`` into where the loop starts and the messages to append."""
        if prompt is None:
            if not self.messages:
                raise ValueError("prompt is None and the agent has no history to continue")
            return self._plan_messages([])
        if isinstance(prompt, str):
            return self._plan_messages([{"role": "user", "content": [{"text": prompt}]}])
        if isinstance(prompt, bytes | dict) or not isinstance(prompt, Sequence):
            raise TypeError(
                "prompt must be a str, a list of content blocks, a list of messages or None, "
                f"got {type(prompt).__name__}"
            )
        items: list[dict[str, Any]] = list(prompt)  # type: ignore[arg-type]  # checked below
        if not items:
            raise ValueError("prompt is an empty list")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise TypeError(
                    f"prompt[{i}] must be a dict (a content block or a message), "
                    f"got {type(item).__name__}"
                )
        if any(key in item for item in items for key in _RESUME_KEYS):
            return self._plan_resume(items)
        if all("role" in item for item in items):
            messages = [
                copy.deepcopy(validate_storable_message(m, f"prompt[{i}]"))
                for i, m in enumerate(items)
            ]
            return self._plan_messages(messages)
        if any("role" in item for item in items):
            raise ValueError("prompt mixes messages (with 'role') and content blocks")
        blocks: list[ContentBlock] = []
        for i, block in enumerate(items):
            checked = validate_content_block(block, f"prompt[{i}]")
            validate_storable(checked, f"prompt[{i}]")
            blocks.append(copy.deepcopy(checked))
        return self._plan_messages([{"role": "user", "content": blocks}])

    def _plan_messages(self, messages: list[Message]) -> tuple[LoopStart, list[Message]]:
        pending = pending_tool_uses(self.messages)
        if pending:
            # A new prompt over calls that never ran (a checkpoint or interrupt left
            # unanswered, a crash): close them in the same user message (SPEC §7).
            # The calls of an interrupted batch that did finish keep their results:
            # the model must not be told that a side effect it asked for never ran.
            done = (
                {result["toolUseId"]: result for result in self.interrupt_state.completed_results}
                if self.interrupt_state.activated
                else {}
            )
            closing: list[ContentBlock] = [
                {"toolResult": copy.deepcopy(done[use["toolUseId"]])}
                if use["toolUseId"] in done
                else placeholder_results(
                    [use], "Tool call was not run: the conversation moved on without it."
                )[0]
                for use in pending
            ]
            if messages and messages[0]["role"] == "user":
                messages[0] = {"role": "user", "content": [*closing, *messages[0]["content"]]}
            else:
                messages.insert(0, {"role": "user", "content": closing})
            self.interrupt_state.clear()
        last = messages[-1] if messages else (self.messages[-1] if self.messages else None)
        if last is not None and last["role"] == "assistant":
            raise ValueError("the history would end with an assistant message; nothing to answer")
        return LoopStart(mode="prompt"), messages

    def _plan_resume(self, items: list[dict[str, Any]]) -> tuple[LoopStart, list[Message]]:
        if any("checkpointResume" in item for item in items):
            if len(items) != 1:
                raise ValueError("a checkpointResume block must be the only block of the prompt")
            return self._plan_checkpoint_resume(items[0]["checkpointResume"])
        responses: dict[str, Any] = {}
        for i, item in enumerate(items):
            body = item.get("interruptResponse")
            if set(item) != {"interruptResponse"} or not isinstance(body, dict):
                raise ValueError(
                    f"prompt[{i}]: interruptResponse prompts hold only interruptResponse blocks"
                )
            if not isinstance(body.get("interruptId"), str) or "response" not in body:
                raise ValueError(
                    f"prompt[{i}]: interruptResponse needs 'interruptId' (str) and 'response'"
                )
            # Kept in the interrupt state a session stores: refused now if it could not be.
            validate_storable(body["response"], f"prompt[{i}].interruptResponse.response")
            responses[body["interruptId"]] = body["response"]
        if not pending_tool_uses(self.messages):
            raise ValueError("interruptResponse given but no tool calls are pending")
        self.interrupt_state.respond(responses)
        cycle = self.interrupt_state.cycle_index
        return LoopStart(mode="run_tools", cycle_index=cycle, interrupt_resume=True), []

    def _plan_checkpoint_resume(self, body: Any) -> tuple[LoopStart, list[Message]]:
        if not self.checkpointing:
            raise ValueError(
                "checkpointResume given but the agent was built with checkpointing=False"
            )
        if not isinstance(body, dict):
            raise TypeError(f"checkpointResume must be a dict, got {type(body).__name__}")
        checkpoint = Checkpoint.from_dict(body["checkpoint"])
        if self.interrupt_state.activated:
            raise ValueError(
                "the agent has pending interrupts; answer them with interruptResponse blocks"
            )
        last = self.messages[-1] if self.messages else None
        last_has_results = (
            last is not None
            and last["role"] == "user"
            and any("toolResult" in block for block in last["content"])
        )
        if checkpoint.position == "after_model":
            if pending_tool_uses(self.messages):
                return LoopStart(
                    "run_tools", checkpoint.cycle_index, resumed_from_after_model=True
                ), []
            if last_has_results:  # the tools already ran (and were persisted): don't rerun
                return LoopStart("call_model", checkpoint.cycle_index + 1), []
        elif last_has_results:
            return LoopStart("call_model", checkpoint.cycle_index + 1), []
        raise CheckpointError(
            f"checkpoint {checkpoint.position} of cycle {checkpoint.cycle_index} does not match "
            "the history: "
            + (
                "it is empty"
                if last is None
                else f"its last message is a {last['role']} message without pending tool calls"
            )
        )

    @staticmethod
    def _copy_messages(messages: Sequence[Message] | None) -> list[Message]:
        if messages is None:
            return []
        if isinstance(messages, str | bytes | dict) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of messages, got {type(messages).__name__}")
        return [
            copy.deepcopy(validate_storable_message(m, f"messages[{i}]"))
            for i, m in enumerate(messages)
        ]

    def _init_plugin(self, plugin: Plugin) -> None:
        init = getattr(plugin, "init_agent", None)
        if not callable(init) or not isinstance(getattr(plugin, "name", None), str):
            raise TypeError(f"plugin {plugin!r} needs a str 'name' and an init_agent(agent) method")
        if inspect.iscoroutinefunction(init):
            self._pending_init.append(lambda: init(self))
            return
        outcome = init(self)
        if inspect.isawaitable(outcome):
            awaitable = outcome

            async def wait() -> None:
                await awaitable

            self._pending_init.append(wait)

    def _fire_initialized(self) -> None:
        event = AgentInitializedEvent(agent=self)
        if not self.hooks.has_async_callbacks(AgentInitializedEvent) and not self._pending_init:
            self.hooks.invoke_sync(event)
            return

        async def initialize() -> None:
            await self.hooks.invoke(event)

        self._pending_init.append(initialize)
        if not in_running_loop():
            # No loop runs here: finish now (on perdure's loop), so agent.messages is
            # right at once and a session's errors surface in the constructor. Inside
            # a running loop (an async app, a notebook, a tool of another agent) the
            # constructor does no I/O: the work waits for initialize() or the first call.
            run_blocking(self.initialize())

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> Agent:
        """Build an agent and finish its initialisation without blocking the loop.

        Takes the constructor's arguments. The async twin of ``Agent(...)`` outside
        a loop: a session's restore runs now, and its errors are raised here.

        Raises:
            SessionNotFoundError, SessionCorruptedError, DecryptionError: the
                session manager could not restore the agent.
        """
        agent = cls(*args, **kwargs)
        await agent.initialize()
        return agent

    async def initialize(self) -> None:
        """Finish initialisation that needs the event loop (idempotent).

        That is a session manager restoring the history, and async plugins. Built
        where no event loop runs, an agent finishes in its constructor. Built inside
        a running loop, it does no I/O there: the work runs when this is awaited, or
        at the start of the first invocation, whichever comes first, and a call made
        meanwhile from elsewhere waits for it. Nothing is committed before it ends.

        Raises:
            SessionNotFoundError, SessionCorruptedError, DecryptionError: the
                session manager could not restore the agent. Initialisation that
                failed fails again, with the same error, on every later call and
                invocation (the agent is unusable: build another). A cancelled one
                starts again where it stopped.
        """
        while True:
            with self._init_guard:
                if self._init_error is not None:
                    raise self._init_error
                if not self._pending_init:
                    return
                running = self._init_running
                if running is None:
                    running = self._init_running = concurrent.futures.Future()
                    mine = True
                else:
                    mine = False
            if mine:
                break
            if asyncio.current_task() is self._init_task:
                return  # called by a step of the initialisation itself
            await asyncio.wrap_future(running)  # then look again: done, failed or cancelled
        self._initializing = True
        self._init_task = asyncio.current_task()
        try:
            while self._pending_init:
                await self._pending_init[0]()
                self._pending_init.pop(0)
        except Exception as exc:
            self._init_error = exc
            raise
        finally:
            self._initializing = False
            self._init_task = None
            with self._init_guard:
                self._init_running = None
            running.set_result(None)


def _check_id(value: Any, argument: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if not value or value in (".", "..") or "/" in value or "\\" in value or "\x00" in value:
        raise ValueError(
            f"{argument} {value!r} is invalid: it must be non-empty, not '.' or '..', "
            "and contain no '/', '\\' or NUL"
        )
