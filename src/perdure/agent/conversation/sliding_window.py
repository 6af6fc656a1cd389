"""A conversation manager that keeps the most recent messages and never splits a tool pair."""

from __future__ import annotations

import logging

from perdure.agent.conversation.base import (
    ConversationManager,
    SupportsMessages,
    _raise_cannot_reduce,
)
from perdure.agent.conversation.pairing import find_cut_index, find_latest_cut_index
from perdure.types import ContentBlock, Message

__all__ = ["SlidingWindowConversationManager"]

logger = logging.getLogger(__name__)

MIN_TRUNCATABLE_CHARS = 200
"""A tool result is truncated by ``reduce_context`` only if its text is longer than this."""


class SlidingWindowConversationManager(ConversationManager):
    """Keep at most ``window_size`` messages, dropping the oldest ones first.

    Every cut falls where the first kept message is a user message with no
    ``toolResult`` block — the start of a fresh user turn — so the kept history has
    no ``toolResult`` without its ``toolUse`` and no ``toolUse`` without its result.
    Validity wins over the window: when no such cut leaves ``window_size`` messages
    or fewer (one user prompt followed by a long tool loop, say), the manager cuts at
    the latest valid point and keeps **more** than ``window_size`` messages, or cuts
    nothing if there is no valid point at all.

    Args:
        window_size: The most messages to keep, an int ``>= 1``.
        should_truncate_results: Whether :meth:`reduce_context` first tries to replace
            the largest tool result with a short ``[truncated: N characters]`` note
            before dropping messages.

    Raises:
        ValueError: ``window_size`` is not an int ``>= 1``.
    """

    def __init__(self, window_size: int = 40, should_truncate_results: bool = True) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"window_size must be an int >= 1, got {window_size!r}")
        super().__init__()
        self.window_size = window_size
        self.should_truncate_results = should_truncate_results

    def apply_management(self, agent: SupportsMessages) -> None:
        """Drop the oldest messages in place until at most ``window_size`` remain.

        Cuts at the valid point that keeps the most messages within the window; if
        there is none, at the latest valid point before it (more than ``window_size``
        messages stay); if there is none either, nothing changes.
        ``removed_message_count`` grows by the number of messages dropped.
        """
        messages = agent.messages
        excess = len(messages) - self.window_size
        if excess <= 0:
            return
        cut = find_cut_index(messages, excess)
        if cut is None:
            cut = find_latest_cut_index(messages, excess - 1)
        if cut is None:
            logger.debug(
                "no valid cut point in %d messages; keeping more than window_size=%d",
                len(messages),
                self.window_size,
            )
            return
        self._remove_leading(messages, cut)

    def reduce_context(self, agent: SupportsMessages, exception: Exception | None = None) -> None:
        """Shrink the history in place after a context-window overflow.

        With ``should_truncate_results``, the content of the largest tool result (by
        text length, when longer than :data:`MIN_TRUNCATABLE_CHARS`) is first replaced
        by a ``[truncated: N characters]`` note and nothing else changes; the pair
        stays intact. Otherwise roughly the older half of the messages is dropped at a
        valid cut point, and ``removed_message_count`` grows accordingly.

        Raises:
            Exception: ``exception`` when nothing can be truncated or dropped, or
                ``ValueError`` in that case if no exception was given.
        """
        messages = agent.messages
        if self.should_truncate_results and _truncate_largest_tool_result(messages):
            return
        half = max(1, len(messages) // 2)
        cut = find_cut_index(messages, half)
        if cut is None:
            cut = find_latest_cut_index(messages, half - 1)
        if cut is None:
            _raise_cannot_reduce(
                exception,
                f"cannot reduce the context: no tool result to truncate and no valid cut "
                f"point in {len(messages)} messages",
            )
        self._remove_leading(messages, cut)

    def _remove_leading(self, messages: list[Message], count: int) -> None:
        # Slice assignment keeps the list object: the agent and its hooks hold it.
        messages[:] = messages[count:]
        self.removed_message_count += count


def _result_text_size(content: list[ContentBlock]) -> int:
    return sum(len(block["text"]) for block in content if "text" in block)


def _truncate_largest_tool_result(messages: list[Message]) -> bool:
    """Replace the largest tool result's content with a note; say whether one was found."""
    best: tuple[int, int, int] | None = None  # (size, message index, block index)
    for message_index, message in enumerate(messages):
        for block_index, block in enumerate(message["content"]):
            if "toolResult" not in block:
                continue
            size = _result_text_size(block["toolResult"]["content"])
            if size > MIN_TRUNCATABLE_CHARS and (best is None or size > best[0]):
                best = (size, message_index, block_index)
    if best is None:
        return False
    size, message_index, block_index = best
    message = messages[message_index]
    result = message["content"][block_index]["toolResult"]
    content = list(message["content"])
    content[block_index] = {
        "toolResult": {
            "toolUseId": result["toolUseId"],
            "status": result["status"],
            "content": [{"text": f"[truncated: {size} characters]"}],
        }
    }
    # A new message object rather than an edit: others (a session, a snapshot) may
    # still hold the original message.
    messages[message_index] = {"role": message["role"], "content": content}
    return True
