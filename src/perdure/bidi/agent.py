"""BidiAgent: an agent over a bidirectional streaming model, persisted per seed 003.

::

    agent = BidiAgent(model, tools=[...], agent_id="voice", session_manager=manager)
    await agent.start()                 # restored from snapshot_latest first
    await agent.send("what's the weather?")
    async for event in agent.receive():
        ...                             # transcripts, tool calls run mid-stream
        if event["type"] == "response_complete":
            break
    await agent.stop()                  # saved

``send_audio(chunk)`` streams the user's speech, and ``audio`` events carry the
model's; neither enters the history, their transcripts do. ``text_delta`` events
carry a transcript's words as they come, for display; they are passed on and never
saved, and the finished entry follows them. Every finished transcript
entry becomes a message of the agent's history; a
``tool_use`` event runs the tool at once (the agent's tools, through perdure's tool
executor) and sends its result back over the open connection, the call and its
result entering the history as a pair. A ``restart_required`` event (or
:meth:`BidiAgent.restart`) closes the connection and opens a new one with the
history so far.

With a :class:`~perdure.session.SnapshotSessionManager` the agent is restored before
its connection starts, and its ``snapshot_latest`` is saved per
``bidi_agent_save_latest_on``: ``"message"`` (default) after every message added and
on stop and before a connection restart; ``"stop"`` on stop and before a restart
only; ``"trigger"`` only when ``snapshot_trigger`` says so. The trigger is asked on
stop and before a restart (``snapshot_trigger(agent_data=bidi_agent)``), and a
``True`` appends an immutable snapshot. A response completing is not a save point.
``manager.restore_snapshot(bidi_agent)`` raises ``RuntimeError`` while it is started.

Every connection opens on a model-valid history: a tool call left without its result
(the process died, or the stream was cancelled, while the tool ran) is closed first
with a placeholder error result (the text of
:data:`~perdure.agent.conversation.pairing.INTERRUPTED_TOOL_RESULT_TEXT`), saved under
``"message"`` like any message; the tool is not run again behind the model's back,
and the model, told it was interrupted, may call it again.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from perdure.agent import Agent, NullConversationManager
from perdure.agent.conversation.pairing import placeholder_tool_result, repair_tool_pairs
from perdure.agent.tool_executor import ToolBatchOutcome, run_tools
from perdure.bidi.model import BidiEvent, BidiModel
from perdure.models import ScriptedModel
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.state import AgentState
from perdure.tools import AgentTool
from perdure.types import Message, ToolResult, ToolUse, validate_storable_message

__all__ = ["BidiAgent"]


class BidiAgent:
    """An agent whose model keeps a connection open (see the module docstring).

    Args:
        model: a :class:`~perdure.bidi.BidiModel`.
        tools: tools the model may call mid-stream.
        system_prompt: given to the model at every start.
        messages: an initial history (validated and copied).
        state: an :class:`~perdure.state.AgentState` or a dict.
        agent_id: names the agent in a session (no path separators).
        name: a display name (default ``agent_id``).
        session_manager: a :class:`~perdure.session.SnapshotSessionManager` or
            ``None``.

    Raises:
        TypeError: ``model`` is not a BidiModel, or ``session_manager`` not a
            SnapshotSessionManager.
    """

    def __init__(
        self,
        model: BidiModel,
        tools: Iterable[AgentTool | Callable[..., Any]] = (),
        system_prompt: str | None = None,
        messages: Sequence[Message] | None = None,
        state: AgentState | dict[str, Any] | None = None,
        agent_id: str = "default",
        *,
        name: str | None = None,
        session_manager: SnapshotSessionManager | None = None,
    ) -> None:
        if not isinstance(model, BidiModel):
            raise TypeError(
                f"model must implement BidiModel (start, send, receive, stop), got {model!r}"
            )
        if session_manager is not None and not isinstance(session_manager, SnapshotSessionManager):
            raise TypeError(
                "session_manager must be a SnapshotSessionManager or None, "
                f"got {type(session_manager).__name__}"
            )
        self.model = model
        self.session_manager = session_manager
        # Holds the history, state and tools; never invoked (the bidi model talks).
        self._agent = Agent(
            ScriptedModel(()),
            tools=tools,
            system_prompt=system_prompt,
            messages=messages,
            state=state,
            agent_id=agent_id,
            name=name,
            conversation_manager=NullConversationManager(),
        )
        self._started = False
        self._restored = False

    # -------------------------------------------------------------- the agent

    @property
    def snapshot_agent(self) -> Agent:
        """The :class:`~perdure.agent.Agent` that holds what this agent persists."""
        return self._agent

    @property
    def started(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._started

    @property
    def agent_id(self) -> str:
        return self._agent.agent_id

    @property
    def name(self) -> str:
        return self._agent.name

    @property
    def messages(self) -> list[Message]:
        """The history: transcript entries and tool pairs, oldest first."""
        return self._agent.messages

    @property
    def state(self) -> AgentState:
        return self._agent.state

    @property
    def tool_names(self) -> list[str]:
        return self._agent.tool_names

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Restore from ``snapshot_latest`` (first start only), then open the connection.

        A tool call the history holds without its result is closed first with a
        placeholder error result (see the module docstring).

        Raises:
            RuntimeError: the agent is started already.
            SessionCorruptedError: the stored snapshot is damaged.
        """
        if self._started:
            raise RuntimeError(f"BidiAgent {self.agent_id!r} is started already")
        if self.session_manager is not None and not self._restored:
            await self.session_manager.restore_snapshot(self)
            self._restored = True
        await self._open()
        self._started = True

    async def send(self, text: str) -> None:
        """Say ``text`` to the model: it enters the history, then goes over the connection.

        Raises:
            RuntimeError: the agent is not started.
            TypeError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        self._require_started("send")
        await self._add({"role": "user", "content": [{"text": text}]})
        await self.model.send({"type": "text", "text": text})

    async def send_audio(self, chunk: bytes) -> None:
        """Stream a chunk of the user's speech to the model (in the session's format).

        Not added to the history: the model's transcript of it comes back as a user
        ``transcript`` event, which is.

        Raises:
            RuntimeError: the agent is not started.
            TypeError: ``chunk`` is not bytes.
        """
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise TypeError(f"chunk must be bytes, got {type(chunk).__name__}")
        self._require_started("send_audio")
        await self.model.send({"type": "audio", "audio": bytes(chunk)})

    async def receive(self) -> AsyncIterator[BidiEvent]:
        """The model's events as they come, with tool calls run and restarts done.

        Ends when the connection is stopped. Yields a ``tool_result`` event after
        each tool the agent ran, and ``restart_required`` once the connection has been
        restarted.

        Raises:
            RuntimeError: the agent is not started.
        """
        self._require_started("receive")
        while self._started:
            restarted = False
            async for event in self.model.receive():
                if not isinstance(event, Mapping):
                    raise ValueError(
                        f"the model's receive() yielded {type(event).__name__} {event!r}, "
                        "not an event dict with a 'type'"
                    )
                kind = event.get("type")
                if kind == "transcript":
                    role, text = event.get("role"), event.get("text")
                    if role not in ("user", "assistant") or not isinstance(text, str):
                        raise ValueError(f"a transcript event needs a role and a text: {event!r}")
                    await self._add({"role": role, "content": [{"text": text}]})
                    yield event
                elif kind == "tool_use":
                    call = event.get("toolUse")
                    if not (
                        isinstance(call, dict)
                        and isinstance(call.get("toolUseId"), str)
                        and isinstance(call.get("name"), str)
                    ):
                        raise ValueError(
                            f"a tool_use event needs a toolUse with a toolUseId and a name: "
                            f"{event!r}"
                        )
                    yield event
                    result = await self._run_tool(call)
                    yield {"type": "tool_result", "toolResult": result}
                    await self.model.send({"type": "tool_result", "toolResult": result})
                elif kind == "restart_required":
                    # Restarted before the event is yielded: a consumer that stops
                    # reading here still has an open, saved connection.
                    await self.restart()
                    restarted = True
                    yield event
                    break
                else:
                    yield event
            if not restarted:
                return

    async def restart(self) -> None:
        """Close the connection and open a new one with the history so far.

        Saved first, as before any connection restart (see the module docstring).

        Raises:
            RuntimeError: the agent is not started.
        """
        self._require_started("restart")
        await self._boundary()
        await self.model.stop()
        await self._open()

    async def stop(self) -> None:
        """Close the connection and save (idempotent: a stopped agent stays stopped)."""
        if not self._started:
            return
        self._started = False
        await self.model.stop()
        await self._boundary()

    # ------------------------------------------------------------- internals

    def _require_started(self, what: str) -> None:
        if not self._started:
            raise RuntimeError(f"BidiAgent {self.agent_id!r}: {what} before start (or after stop)")

    async def _open(self) -> None:
        await self._close_pending()
        await self.model.start(
            system_prompt=self._agent.system_prompt,
            tool_specs=self._agent.tool_registry.specs(),
            messages=copy.deepcopy(self._agent.messages),
        )

    async def _close_pending(self) -> None:
        """Give each tool call without a result a placeholder error result (see the
        module docstring), so that a connection never opens on a history no model
        accepts."""
        repaired, changes = repair_tool_pairs(self._agent.messages)
        last = repaired[-1] if repaired else None
        pending = (
            [block["toolUse"]["toolUseId"] for block in last["content"] if "toolUse" in block]
            if last is not None and last["role"] == "assistant"
            else []
        )
        if pending:
            repaired.append(
                {"role": "user", "content": [placeholder_tool_result(i) for i in pending]}
            )
        if not changes and not pending:
            return
        self._agent.messages = repaired
        manager = self.session_manager
        if manager is not None and manager.bidi_agent_save_latest_on == "message":
            await manager.save_snapshot(self, is_latest=True)

    async def _add(self, message: Message) -> None:
        """Append a message (checked first, as an Agent does) and save under "message"."""
        history = self._agent.messages
        history.append(validate_storable_message(message, f"messages[{len(history)}]"))
        manager = self.session_manager
        if manager is not None and manager.bidi_agent_save_latest_on == "message":
            await manager.save_snapshot(self, is_latest=True)

    async def _run_tool(self, tool_use: ToolUse) -> ToolResult:
        await self._add({"role": "assistant", "content": [{"toolUse": tool_use}]})
        outcome = ToolBatchOutcome()
        async for _ in run_tools(self._agent, [tool_use], {}, outcome):
            pass
        if outcome.results:
            result = outcome.results[0]
        else:  # an interrupt: nobody can answer it mid-stream
            result = {
                "toolUseId": tool_use["toolUseId"],
                "status": "error",
                "content": [{"text": "interrupts are not supported in a bidirectional stream"}],
            }
        await self._add({"role": "user", "content": [{"toolResult": result}]})
        return result

    async def _boundary(self) -> None:
        """On stop and before a restart: save per the strategy, then ask the trigger."""
        manager = self.session_manager
        if manager is None:
            return
        strategy = manager.bidi_agent_save_latest_on
        if strategy in ("message", "stop"):
            await manager.save_snapshot(self, is_latest=True)
        trigger = manager.snapshot_trigger
        if trigger is None:
            return
        decision = trigger(agent_data=self)
        if not isinstance(decision, bool):
            raise TypeError(f"snapshot_trigger must return a bool, got {type(decision).__name__}")
        if decision:
            if strategy == "trigger":
                await manager.save_snapshot(self, is_latest=True)
            await manager.save_snapshot(self, is_latest=False)
