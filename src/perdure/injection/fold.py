"""Folding injected text into the latest user message of a request (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence

from perdure.types import ContentBlock, Message

__all__ = ["fold_into_last_user_message", "is_user_turn", "latest_text"]


def fold_into_last_user_message(
    messages: Sequence[Message], text: str
) -> tuple[list[Message], int]:
    """Return a new message list whose last (user) message also carries ``text``.

    The text becomes one ``{"text": ...}`` block placed right after the message's
    ``toolResult`` blocks: on a fresh user turn (no tool results) it is prepended,
    so the user's own words stay the last thing the model reads; on a tool-result
    turn it is appended, because tool results must open their message. A new
    prompt that also closes abandoned tool calls gets it between the results and
    the prompt.

    Never mutates ``messages`` or any message in it: the result is a new list in
    which only the last message is a new dict with a new content list; the other
    messages are the same objects.

    Args:
        messages: the request's messages.
        text: the text to inject (non-empty).

    Returns:
        ``(new_messages, tail_block_count)``. ``tail_block_count`` is the number of
        blocks at the end of the new last message that belong to this call only —
        from the injected block to the end; every block before them is as stored.
        When there is nothing to fold into (no messages, or the last one is not a
        user message) the result is a copy of the list and ``0``.

    Raises:
        TypeError: ``messages`` is not a sequence of messages or ``text`` not a str.
        ValueError: ``text`` is empty.
    """
    if isinstance(messages, str | bytes | dict) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of messages, got {type(messages).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("text must not be empty")
    new_messages = list(messages)
    if not new_messages:
        return new_messages, 0
    target = new_messages[-1]
    if not isinstance(target, dict) or target.get("role") != "user":
        return new_messages, 0
    content = list(target.get("content") or [])
    position = _after_tool_results(content)
    injected: ContentBlock = {"text": text}
    new_content = [*content[:position], injected, *content[position:]]
    new_messages[-1] = {**target, "content": new_content}
    return new_messages, len(new_content) - position


def is_user_turn(messages: Sequence[Message]) -> bool:
    """True when the last message is a user prompt rather than only tool results.

    A user message made only of ``toolResult`` blocks is a tool turn (the loop's
    middle); one carrying anything else — text, an image — is a fresh prompt, even
    when it also closes abandoned tool calls with placeholder results.
    """
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") != "user":
        return False
    return any("toolResult" not in block for block in last.get("content") or [])


def latest_text(messages: Sequence[Message], role: str) -> str | None:
    """The text blocks of the latest ``role`` message that has any, joined by newlines.

    Text inside ``toolResult`` blocks does not count. ``None`` when no such message
    has text.
    """
    for message in reversed(messages):
        if message.get("role") != role:
            continue
        parts = [
            block["text"]
            for block in message.get("content") or []
            if isinstance(block.get("text"), str) and block["text"].strip()
        ]
        if parts:
            return "\n".join(parts)
    return None


def _after_tool_results(content: list[ContentBlock]) -> int:
    position = 0
    for index, block in enumerate(content):
        if isinstance(block, dict) and "toolResult" in block:
            position = index + 1
    return position
