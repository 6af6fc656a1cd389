"""Pair-aligned history pages: the one rule every store uses (SPEC §7).

A page never splits a tool pair: if it would start on a user message carrying
``toolResult`` blocks, the start moves back one message to include the assistant
``toolUse`` they answer; if it would end on an assistant message with ``toolUse``
blocks, the end moves forward one message to include their results. Because a
result always sits in the message right after its call, one step is enough.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from perdure.session.rules import check_offset
from perdure.session.store import HistoryPage
from perdure.types import Message


def check_page_args(offset: int, limit: int) -> None:
    """Raise ``ValueError``/``TypeError`` naming a bad ``offset`` or ``limit``."""
    check_offset(offset)
    check_offset(limit, "limit")


def page_read_range(total: int, offset: int, limit: int) -> tuple[int, int]:
    """The message indexes ``[lo, hi)`` a store must read to align a page."""
    start = min(offset, total)
    if limit == 0:
        return start, start
    return max(0, start - 1), min(total, start + limit + 1)


def page_bounds(
    total: int, offset: int, limit: int, message_at: Callable[[int], Message]
) -> tuple[int, int]:
    """The aligned ``[start, end)`` of the page asked as ``offset``/``limit``.

    ``message_at(i)`` is only called for ``i`` inside :func:`page_read_range`.
    """
    check_page_args(offset, limit)
    start = min(offset, total)
    if limit == 0:
        return start, start
    end = min(start + limit, total)
    if 0 < start < total and _opens_with_results(message_at(start)):
        start -= 1
    if start < end < total and _asks_for_tools(message_at(end - 1)):
        end += 1
    return start, end


def page_of(total: int, offset: int, limit: int, lo: int, window: Sequence[Message]) -> HistoryPage:
    """The aligned page asked as ``offset``/``limit`` of ``total`` messages.

    ``window`` holds the messages ``lo..hi-1`` that :func:`page_read_range` named.
    """
    start, end = page_bounds(total, offset, limit, lambda i: window[i - lo])
    return HistoryPage(list(window[start - lo : end - lo]), start, end, total)


def _opens_with_results(message: Message) -> bool:
    return message["role"] == "user" and any("toolResult" in b for b in message["content"])


def _asks_for_tools(message: Message) -> bool:
    return message["role"] == "assistant" and any("toolUse" in b for b in message["content"])
