"""Runs the tool calls of one assistant message concurrently, with hooks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perdure.agent.events import AgentEvent, ToolEndEvent, ToolInterruptedEvent, ToolStartEvent
from perdure.hooks import AfterToolCallEvent, BeforeToolCallEvent
from perdure.tools import Interrupt, InterruptException, ToolContext, error_result
from perdure.types import ToolResult, ToolUse

if TYPE_CHECKING:
    from perdure.agent.agent import Agent

logger = logging.getLogger("perdure")


@dataclass
class ToolBatchOutcome:
    """What running one message's tool calls produced.

    ``results`` holds one result per call that finished, in call order; calls that
    raised an interrupt have none and appear in ``interrupts`` instead.
    """

    results: list[ToolResult] = field(default_factory=list)
    interrupts: list[Interrupt] = field(default_factory=list)


class _Done:
    pass


async def run_tools(
    agent: Agent,
    tool_uses: list[ToolUse],
    invocation_state: dict[str, Any],
    outcome: ToolBatchOutcome,
) -> AsyncIterator[AgentEvent]:
    """Run ``tool_uses`` concurrently, yielding tool events as they happen.

    Fills ``outcome`` when the iteration ends. A tool that raises, an unknown tool
    name, or a call cancelled by a ``BeforeToolCallEvent`` hook becomes an error
    result; nothing here raises for a tool's sake. If the iteration is abandoned
    (the consumer stops), the running calls are cancelled.
    """
    queue: asyncio.Queue[AgentEvent | _Done] = asyncio.Queue()
    slots: list[ToolResult | Interrupt | None] = [None] * len(tool_uses)

    async def one(index: int, tool_use: ToolUse) -> None:
        try:
            slots[index] = await _run_one(agent, tool_use, invocation_state, queue)
        finally:
            queue.put_nowait(_Done())

    tasks = [asyncio.create_task(one(i, tu)) for i, tu in enumerate(tool_uses)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if isinstance(item, _Done):
                remaining -= 1
            else:
                yield item
        for task in tasks:
            task.result()  # re-raise a hook's exception, if any
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for slot in slots:
        if isinstance(slot, Interrupt):
            outcome.interrupts.append(slot)
        elif slot is not None:
            outcome.results.append(slot)


async def _run_one(
    agent: Agent,
    tool_use: ToolUse,
    invocation_state: dict[str, Any],
    queue: asyncio.Queue[AgentEvent | _Done],
) -> ToolResult | Interrupt:
    tool_use_id = tool_use["toolUseId"]
    selected = agent.tool_registry.get(tool_use["name"])
    before = await agent.hooks.invoke(
        BeforeToolCallEvent(
            agent=agent,
            tool_use=tool_use,
            selected_tool=selected,
            invocation_state=invocation_state,
        )
    )
    queue.put_nowait(ToolStartEvent(tool_use))
    exception: BaseException | None = None
    if before.cancel_tool:
        message = (
            before.cancel_tool
            if isinstance(before.cancel_tool, str)
            else "Tool call was cancelled by a hook."
        )
        result = error_result(tool_use_id, message)
    elif selected is None:
        known = ", ".join(agent.tool_registry.names) or "none"
        result = error_result(
            tool_use_id, f"Unknown tool: {tool_use['name']!r}. Available tools: {known}."
        )
    else:
        context = ToolContext(
            tool_use=tool_use,
            agent=agent,
            state=agent.state,
            invocation_state=invocation_state,
            _interrupt=agent.interrupt_state.raise_or_answer,
        )
        try:
            result = await selected.invoke(tool_use, context)
        except InterruptException as signal:
            queue.put_nowait(ToolInterruptedEvent(tool_use, signal.interrupt))
            return signal.interrupt
        except Exception as exc:
            # The type only: a tool's error message often quotes its input, and
            # nothing perdure logs carries message content (SPEC §9). The message
            # goes to the model in the error result, and to AfterToolCallEvent.
            logger.warning(
                "tool %r (toolUseId %r) raised %s",
                tool_use["name"],
                tool_use_id,
                type(exc).__name__,
            )
            exception = exc
            result = error_result(tool_use_id, f"Error: {type(exc).__name__}: {exc}")
        if result.get("toolUseId") != tool_use_id:
            result = {**result, "toolUseId": tool_use_id}
    after = await agent.hooks.invoke(
        AfterToolCallEvent(
            agent=agent,
            tool_use=tool_use,
            selected_tool=selected,
            invocation_state=invocation_state,
            result=result,
            exception=exception,
        )
    )
    queue.put_nowait(ToolEndEvent(tool_use, after.result))
    return after.result
