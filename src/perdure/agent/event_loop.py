"""The agent loop: model call → tools (concurrently) → results → next cycle.

The loop keeps one invariant on the history it leaves behind: every ``toolUse`` has
its ``toolResult`` in the next message, except while paused on purpose (an
``after_model`` checkpoint or an interrupt), when the last message is the assistant
message whose calls are pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from perdure.agent.checkpoint import Checkpoint
from perdure.agent.conversation.pairing import merge_user_runs, placeholder_tool_result
from perdure.agent.events import (
    AgentEvent,
    CheckpointEvent,
    ModelMessageEvent,
    ReasoningDeltaEvent,
    ResultEvent,
    TextDeltaEvent,
)
from perdure.agent.result import AgentResult
from perdure.agent.tool_executor import ToolBatchOutcome, run_tools
from perdure.errors import ContextWindowOverflowError, ModelError
from perdure.hooks import (
    AfterModelCallEvent,
    BeforeModelCallEvent,
    InvokeModelContext,
    InvokeModelStage,
)
from perdure.models import (
    ModelResponse,
    ModelStreamEvent,
    ReasoningDelta,
    TextDelta,
    add_usage,
    empty_usage,
)
from perdure.types import ContentBlock, Message, StopReason, ToolResult, ToolUse

if TYPE_CHECKING:
    from perdure.agent.agent import Agent

CANCELLED_TOOL_TEXT = "Tool call was not run: the invocation was cancelled."
ABANDONED_TOOL_TEXT = "Tool call was not run: the invocation ended before it could run."
MAX_CONTEXT_REDUCTIONS = 8


@dataclass
class LoopStart:
    """Where an invocation begins.

    ``mode`` is ``"prompt"`` (new messages were appended; call the model),
    ``"run_tools"`` (run the pending calls of the last assistant message: a resume
    from an ``after_model`` checkpoint or from an interrupt), or ``"call_model"``
    (the last message holds tool results: a resume from ``after_tools``).
    """

    mode: Literal["prompt", "run_tools", "call_model"]
    cycle_index: int = 0
    resumed_from_after_model: bool = False
    interrupt_resume: bool = False


@dataclass
class _Invocation:
    usage: Any = field(default_factory=empty_usage)
    last_message: Message | None = None
    invocation_state: dict[str, Any] = field(default_factory=dict)


def tool_uses_of(message: Message) -> list[ToolUse]:
    """The ``toolUse`` blocks of ``message``, in order."""
    return [block["toolUse"] for block in message["content"] if "toolUse" in block]


def pending_tool_uses(messages: list[Message]) -> list[ToolUse]:
    """The tool calls of the last message when it is an assistant message with calls."""
    if messages and messages[-1]["role"] == "assistant":
        return tool_uses_of(messages[-1])
    return []


def placeholder_results(tool_uses: list[ToolUse], text: str) -> list[ContentBlock]:
    """Error ``toolResult`` blocks closing ``tool_uses`` that will never run."""
    return [placeholder_tool_result(tool_use["toolUseId"], text) for tool_use in tool_uses]


async def run_loop(agent: Agent, start: LoopStart) -> AsyncIterator[AgentEvent]:
    """Drive cycles until the model ends its turn or the loop pauses; yield events.

    The last event is always a :class:`ResultEvent`.
    """
    inv = _Invocation()
    cycle = start.cycle_index
    model_calls = 0
    skip_after_model = start.resumed_from_after_model
    mode = start.mode

    def finish(stop_reason: StopReason, **extra: Any) -> ResultEvent:
        message = inv.last_message or _last_assistant(agent.messages)
        return ResultEvent(
            AgentResult(stop_reason=stop_reason, message=message, usage=inv.usage, **extra)
        )

    while True:
        if mode != "run_tools":
            if agent.cancel_requested:
                yield finish("cancelled")
                return
            if model_calls >= agent.max_cycles:
                yield finish("max_cycles")
                return
            response: ModelResponse | None = None
            async for event in _call_model(agent, cycle, inv):
                if isinstance(event, ModelResponse):
                    response = event
                else:
                    yield event
            model_calls += 1
            if response is None:  # cancelled while streaming; nothing was appended
                yield finish("cancelled")
                return
            message = response.message
            await agent._append_message(message)
            inv.last_message = message
            yield ModelMessageEvent(message, response.stop_reason)
            calls = tool_uses_of(message)
            # Some providers report end_turn beside tool calls; the calls still run.
            if not calls or response.stop_reason not in ("tool_use", "end_turn"):
                if calls:  # the model stopped mid-call (max_tokens): close the calls
                    await agent._append_message(
                        {
                            "role": "user",
                            "content": placeholder_results(
                                calls, "Tool call was not run: the model's turn was cut off."
                            ),
                        }
                    )
                yield finish(response.stop_reason)
                return
            if agent.cancel_requested:
                await _close_calls(agent, calls, CANCELLED_TOOL_TEXT)
                yield finish("cancelled")
                return
            if agent.checkpointing and not skip_after_model:
                checkpoint = Checkpoint(position="after_model", cycle_index=cycle)
                yield CheckpointEvent(checkpoint)
                yield finish("checkpoint", checkpoint=checkpoint)
                return
        skip_after_model = False
        mode = "prompt"

        # --- tools ---------------------------------------------------------------
        if agent.cancel_requested and not start.interrupt_resume:
            await _close_calls(agent, pending_tool_uses(agent.messages), CANCELLED_TOOL_TEXT)
            yield finish("cancelled")
            return
        calls = pending_tool_uses(agent.messages)
        kept: list[ToolResult] = []
        if start.interrupt_resume:
            kept = copy.deepcopy(agent.interrupt_state.completed_results)
            done = {result["toolUseId"] for result in kept}
            calls = [call for call in calls if call["toolUseId"] not in done]
            start.interrupt_resume = False
        outcome = ToolBatchOutcome()
        async for event in run_tools(agent, calls, inv.invocation_state, outcome):
            yield event
        results = _in_call_order(pending_tool_uses(agent.messages), [*kept, *outcome.results])
        if outcome.interrupts:
            agent.interrupt_state.activate(results, cycle)
            yield finish("interrupt", interrupts=list(agent.interrupt_state.pending))
            return
        agent.interrupt_state.clear()
        await agent._append_message(
            {"role": "user", "content": [{"toolResult": result} for result in results]}
        )
        if agent.cancel_requested:
            yield finish("cancelled")
            return
        if agent.checkpointing:
            checkpoint = Checkpoint(position="after_tools", cycle_index=cycle)
            yield CheckpointEvent(checkpoint)
            yield finish("checkpoint", checkpoint=checkpoint)
            return
        cycle += 1


async def _call_model(
    agent: Agent, cycle: int, inv: _Invocation
) -> AsyncIterator[AgentEvent | ModelResponse]:
    """One model call with middleware, hooks and context-overflow recovery.

    Yields stream events, then the :class:`ModelResponse` — or stops early, yielding
    no response, when the invocation is cancelled mid-stream.
    """
    reductions = 0
    compacting = agent.conversation_manager.maybe_compact(agent)
    if inspect.isawaitable(compacting):
        await compacting
    while True:
        await agent.hooks.invoke(BeforeModelCallEvent(agent=agent, cycle_index=cycle))
        tool_specs = agent.tool_registry.specs()
        if agent.middleware.has(InvokeModelStage.Input):
            context = InvokeModelContext(
                agent=agent,
                messages=copy.deepcopy(agent.messages),
                system_prompt=agent.system_prompt,
                tool_specs=copy.deepcopy(tool_specs),
                cycle_index=cycle,
            )
            await agent.middleware.run(InvokeModelStage.Input, context)
            request_messages, system_prompt = context.messages, context.system_prompt
            tool_specs = context.tool_specs
            # Never two user messages in a row to a model (the stored history may have
            # them after a failed call or a torn tail); the stored log stays as written.
            request_messages = merge_user_runs(request_messages)
        elif agent._user_runs.has_runs(agent.messages):
            request_messages = merge_user_runs(agent.messages)
            system_prompt = agent.system_prompt
        else:
            # The history itself, not a copy: adapters must not mutate it (the Model
            # protocol), and a copy per call made a long conversation quadratic.
            request_messages, system_prompt = agent.messages, agent.system_prompt
        response: ModelResponse | None = None
        try:
            stream = agent.model.stream(
                request_messages, tool_specs=tool_specs, system_prompt=system_prompt
            )
            try:
                async for event in _until_cancelled(agent, stream):
                    if isinstance(event, ModelResponse):
                        response = event
                    elif isinstance(event, TextDelta):
                        yield TextDeltaEvent(event.text)
                    elif isinstance(event, ReasoningDelta):
                        yield ReasoningDeltaEvent(event.text)
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
            if response is None and not agent.cancel_requested:
                raise ModelError(
                    f"model {type(agent.model).__name__} ended its stream without a response"
                )
        except ContextWindowOverflowError as exc:
            await agent.hooks.invoke(
                AfterModelCallEvent(agent=agent, cycle_index=cycle, exception=exc)
            )
            reductions += 1
            if reductions > MAX_CONTEXT_REDUCTIONS:
                raise
            reduced = agent.conversation_manager.reduce_context(agent, exc)
            if inspect.isawaitable(reduced):
                await reduced
            continue
        except Exception as exc:
            await agent.hooks.invoke(
                AfterModelCallEvent(agent=agent, cycle_index=cycle, exception=exc)
            )
            raise
        if response is None:
            return
        _check_response(agent, response)
        add_usage(inv.usage, response.usage)
        await agent.hooks.invoke(
            AfterModelCallEvent(
                agent=agent,
                cycle_index=cycle,
                message=response.message,
                stop_reason=response.stop_reason,
            )
        )
        yield response
        return


class StreamInterrupt:
    """Lets :meth:`Agent.cancel` stop the wait for a model's next stream event.

    While an invocation waits for the model (and only then: never while the event is
    handed to the caller, whose own code runs in the same task), the waiting task is
    *armed* here. ``cancel()`` (any thread) sets the agent's flag, then *pokes*: on
    the task's loop, an armed task is cancelled, which ends the wait at once — a
    model that goes quiet (a slow first token, a stalled connection) does not make
    ``cancel()`` wait for its next event. The waiter arms before it reads the flag,
    and ``cancel()`` sets the flag before it reads the arm, so one of them sees the
    other. The cancellation is taken back (``Task.uncancel``) once the wait ended.

    This replaced a task and a timed wait per stream event (half the CPU of a
    short turn).
    """

    __slots__ = ("fired", "loop", "task")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.fired = False

    def arm(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop, self.task = loop, task

    def disarm(self) -> None:
        self.task = None

    def poke(self) -> None:
        """Interrupt the armed wait, if any (any thread)."""
        loop = self.loop
        if loop is not None and self.task is not None:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        task = self.task
        if task is not None and not task.done():
            self.fired = True
            task.cancel()


async def _until_cancelled(
    agent: Agent, stream: AsyncIterator[ModelStreamEvent]
) -> AsyncIterator[ModelStreamEvent]:
    """The stream's events until it ends or the invocation is cancelled.

    A cancel while the model is awaited interrupts the wait (see
    :class:`StreamInterrupt`); one while an event is being handled stops the stream
    before the next.
    """
    iterator = stream.__aiter__()
    interrupt: StreamInterrupt = agent._stream_interrupt
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    while True:
        if task is not None:
            interrupt.arm(loop, task)
        if agent.cancel_requested:
            interrupt.disarm()
            return
        try:
            event = await iterator.__anext__()
        except StopAsyncIteration:
            return
        except asyncio.CancelledError:
            if not interrupt.fired:
                raise
            return  # the finally below takes the cancellation back
        finally:
            interrupt.disarm()
            if interrupt.fired and task is not None:
                interrupt.fired = False
                task.uncancel()
        yield event


def _check_response(agent: Agent, response: ModelResponse) -> None:
    message = response.message
    if (
        not isinstance(message, dict)
        or message.get("role") != "assistant"
        or not isinstance(message.get("content"), list)
    ):
        raise ModelError(
            f"model {type(agent.model).__name__} returned a malformed message: {message!r}"
        )
    ids = [call["toolUseId"] for call in tool_uses_of(message)]
    if len(ids) != len(set(ids)):
        raise ModelError(f"model {type(agent.model).__name__} reused a toolUseId: {ids}")


async def _close_calls(agent: Agent, calls: list[ToolUse], text: str) -> None:
    if calls:
        await agent._append_message({"role": "user", "content": placeholder_results(calls, text)})


def _in_call_order(calls: list[ToolUse], results: list[ToolResult]) -> list[ToolResult]:
    by_id = {result["toolUseId"]: result for result in results}
    return [by_id[call["toolUseId"]] for call in calls if call["toolUseId"] in by_id]


def _last_assistant(messages: list[Message]) -> Message:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "assistant":
            return messages[index]
    return {"role": "assistant", "content": []}
