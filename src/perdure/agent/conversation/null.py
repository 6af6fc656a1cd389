"""A conversation manager that never changes the history."""

from __future__ import annotations

from perdure.agent.conversation.base import (
    ConversationManager,
    SupportsMessages,
    _raise_cannot_reduce,
)

__all__ = ["NullConversationManager"]


class NullConversationManager(ConversationManager):
    """Keep every message; a context overflow is passed on to the caller unchanged."""

    def apply_management(self, agent: SupportsMessages) -> None:
        """Do nothing."""

    def reduce_context(self, agent: SupportsMessages, exception: Exception | None = None) -> None:
        """Refuse to reduce: re-raise ``exception``, or raise ``ValueError`` without one."""
        _raise_cannot_reduce(exception, "NullConversationManager never reduces the context")
