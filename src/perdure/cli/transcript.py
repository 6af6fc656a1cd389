"""A streamed invocation written as a readable, coloured transcript (demos, chat)."""

from __future__ import annotations

import json
from typing import Any, TextIO

from perdure.agent import (
    Agent,
    AgentResult,
    ResultEvent,
    TextDeltaEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from perdure.cli.style import Style


def shorten(text: str, limit: int = 110) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def stream_transcript(agent: Agent, prompt: Any, out: TextIO, s: Style) -> AgentResult:
    """Run one invocation, writing text as it streams and each tool call and result."""
    result: AgentResult | None = None
    streaming = False
    async for event in agent.stream_async(prompt):
        if isinstance(event, TextDeltaEvent):
            if not streaming:
                out.write(s("  assistant › ", "magenta"))
                streaming = True
            out.write(event.text)
        elif isinstance(event, ToolStartEvent):
            if streaming:
                out.write("\n")
                streaming = False
            args = json.dumps(event.tool_use["input"], ensure_ascii=False)
            out.write(s(f"  ⚙ {event.tool_use['name']}", "cyan") + s(f"({args})", "dim") + "\n")
        elif isinstance(event, ToolEndEvent):
            text = " ".join(b.get("text", "") for b in event.result["content"])
            colour = "green" if event.result["status"] == "success" else "red"
            out.write(s("    ↳ ", colour) + s(shorten(text), "dim") + "\n")
        elif isinstance(event, ResultEvent):
            result = event.result
    if streaming:
        out.write("\n")
    assert result is not None  # the stream always ends with a ResultEvent
    return result
