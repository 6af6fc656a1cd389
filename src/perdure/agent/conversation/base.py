"""The conversation-manager contract: keep an agent's history within the model's reach.

A conversation manager owns one policy for shrinking ``agent.messages``. The agent
calls :meth:`ConversationManager.apply_management` after every invocation and
:meth:`ConversationManager.reduce_context` when the model reports that the context
window overflowed. Messages are always changed in place (``agent.messages[:] = ...``),
so every holder of the list sees the same history.

``removed_message_count`` is the number of leading messages the manager has dropped
so far. A session stores it with :meth:`ConversationManager.get_state` and, on
resume, reloads the message log from that offset (seed 000 §5.4).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import Any, NoReturn, Protocol

from perdure.types import Message

__all__ = ["ConversationManager", "SupportsMessages"]


class SupportsMessages(Protocol):
    """Anything with a mutable ``messages`` list — an agent, as far as a manager cares."""

    @property
    def messages(self) -> list[Message]: ...


class ConversationManager(ABC):
    """Base class of conversation managers.

    Subclasses implement :meth:`apply_management` and :meth:`reduce_context`, and may
    extend :meth:`get_state`/:meth:`restore_from_session` with their own keys (calling
    ``super()``). Every change to the history must keep it model-valid: no
    ``toolResult`` without its ``toolUse`` and no ``toolUse`` cut off from its result
    (see :mod:`perdure.agent.conversation.pairing`).
    """

    removed_message_count: int
    """How many leading messages this manager has removed from the history so far."""

    def __init__(self) -> None:
        self.removed_message_count = 0

    @abstractmethod
    def apply_management(self, agent: SupportsMessages) -> Awaitable[None] | None:
        """Bring ``agent.messages`` within this manager's limits, in place.

        Called after every invocation. Never raises because the history cannot be
        reduced: it leaves the history as it is instead. May be a coroutine (a
        manager that asks a model for a summary); the agent awaits it.
        """

    def maybe_compact(self, agent: SupportsMessages) -> Awaitable[None] | None:
        """Called before every model call; a manager may shrink the context here.

        The default does nothing. May be a coroutine; the loop awaits it.
        """
        return None

    @abstractmethod
    def reduce_context(
        self, agent: SupportsMessages, exception: Exception | None = None
    ) -> Awaitable[None] | None:
        """Make ``agent.messages`` smaller, in place, after a context-window overflow.

        Args:
            agent: The agent whose history is reduced.
            exception: The overflow error the model raised, if any.

        Raises:
            Exception: ``exception`` itself when nothing can be reduced, or
                ``ValueError`` when nothing can be reduced and no exception was given.
        """

    def get_state(self) -> dict[str, Any]:
        """Return this manager's JSON-compatible state for a session to store.

        Holds at least ``{"__name__": <class name>, "removed_message_count": n}``.
        """
        return {
            "__name__": type(self).__name__,
            "removed_message_count": self.removed_message_count,
        }

    def restore_from_session(self, state: dict[str, Any]) -> list[Message] | None:
        """Restore the state :meth:`get_state` returned, possibly in another process.

        Returns:
            Messages to put in front of the restored history, or ``None`` (the default)
            when there are none.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: ``state`` was written by another manager class (the message
                names both), or its ``removed_message_count`` is missing or not an int
                ``>= 0``.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        name = state.get("__name__")
        if name != type(self).__name__:
            raise ValueError(
                f"conversation manager state was written by {name!r}, "
                f"cannot restore it into {type(self).__name__!r}"
            )
        count = state.get("removed_message_count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(
                f"conversation manager state removed_message_count must be an int >= 0, "
                f"got {count!r}"
            )
        self.removed_message_count = count
        return None


def _raise_cannot_reduce(exception: Exception | None, reason: str) -> NoReturn:
    """Raise ``exception`` if given, else a ``ValueError`` carrying ``reason``."""
    if exception is not None:
        raise exception
    raise ValueError(reason)
