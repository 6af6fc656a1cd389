"""Summaries for compaction: render a history as a transcript and ask a model to fold it.

Shared by :class:`SummarizingConversationManager` (automatic compaction) and
``Session.compact`` (manual). Pure helpers plus one model call; no storage.
"""

from __future__ import annotations

import json
from typing import Literal

from perdure.agent.conversation.pairing import is_valid_cut
from perdure.models import Model, ModelResponse
from perdure.types import ContentBlock, Message

SummaryFailure = Literal["summary_malformed", "model_error"]

DEFAULT_SUMMARY_PROMPT = (
    "You compress conversations. Summarise the transcript below so that an assistant "
    "can continue the conversation without it: keep every fact, decision, preference, "
    "open question and result of a tool call that may matter later; drop small talk. "
    "Write plain prose or short bullet points, in the language of the conversation."
)
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


class SummaryError(Exception):
    """The model could not produce a usable summary; ``reason`` says why."""

    def __init__(self, reason: SummaryFailure, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: SummaryFailure = reason


def latest_user_turn(messages: list[Message]) -> int:
    """Index of the latest fresh user turn (a user message without tool results), or 0."""
    for index in range(len(messages) - 1, -1, -1):
        if is_valid_cut(messages, index):
            return index
    return 0


def render_transcript(messages: list[Message]) -> str:
    """A plain-text transcript of ``messages`` for a summarising model."""
    lines: list[str] = []
    for message in messages:
        parts = [_render_block(block) for block in message["content"]]
        lines.append(f"{message['role']}: " + " ".join(p for p in parts if p))
    return "\n".join(lines)


def _render_block(block: ContentBlock) -> str:
    if "text" in block:
        return block["text"]
    if "toolUse" in block:
        use = block["toolUse"]
        return f"[called tool {use['name']} with {json.dumps(use['input'], default=str)}]"
    if "toolResult" in block:
        result = block["toolResult"]
        inner = " ".join(_render_block(b) for b in result["content"])
        return f"[tool result ({result['status']}): {inner}]"
    if "image" in block:
        return "[image]"
    if "document" in block:
        return "[document]"
    return ""


def summary_message(text: str) -> Message:
    """The message that stands for the folded history at the head of the new one."""
    return {"role": "user", "content": [{"text": SUMMARY_PREFIX + text.strip()}]}


async def summarize(
    model: Model,
    messages: list[Message],
    *,
    instructions: str | None = None,
    prompt: str | None = None,
) -> str:
    """Ask ``model`` for a summary of ``messages``.

    Raises:
        SummaryError: the model call failed (``model_error``) or returned no text
            (``summary_malformed``).
    """
    request = "Transcript:\n" + render_transcript(messages)
    if instructions:
        request = f"Instructions for this summary: {instructions}\n\n{request}"
    response: ModelResponse | None = None
    try:
        async for event in model.stream(
            [{"role": "user", "content": [{"text": request}]}],
            tool_specs=[],
            system_prompt=prompt or DEFAULT_SUMMARY_PROMPT,
        ):
            if isinstance(event, ModelResponse):
                response = event
    except Exception as exc:
        raise SummaryError("model_error", f"{type(exc).__name__}: {exc}") from exc
    if response is None:
        raise SummaryError("summary_malformed", "the model returned no response")
    text = "".join(b["text"] for b in response.message.get("content", []) if "text" in b).strip()
    if not text:
        raise SummaryError("summary_malformed", "the model returned no summary text")
    return text
