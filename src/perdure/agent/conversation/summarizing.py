"""SummarizingConversationManager: fold the oldest history into a summary."""

from __future__ import annotations

import inspect
import json
from typing import Any

from perdure._runtime.checks import check_count
from perdure.agent.conversation.base import ConversationManager, SupportsMessages
from perdure.agent.conversation.pairing import find_cut_index, find_latest_cut_index
from perdure.agent.conversation.summarize import (
    SummaryError,
    summarize,
    summary_message,
)
from perdure.models import Model


class SummarizingConversationManager(ConversationManager):
    """Keeps the context small by summarising its oldest part.

    When the context passes ``context_threshold_tokens`` (estimated from the JSON
    size of the messages, ~4 characters a token) — checked before every model call,
    so also during a long turn — or when the model reports a context overflow, the
    oldest ``summary_ratio`` of the history (never splitting a tool pair, always
    keeping the last ``preserve_recent_messages``) is folded into one summary
    message made by ``summarization_model`` (default: the agent's model) under
    ``summarization_prompt``.

    With a ``Session``, the session applies the compaction: it writes a
    ``pre_compaction`` checkpoint first, then rewrites the stored history, exactly
    as ``session.compact()`` does. Without one, the agent's history is rewritten in
    memory.
    """

    def __init__(
        self,
        *,
        summary_ratio: float = 0.3,
        preserve_recent_messages: int = 10,
        summarization_model: Model | None = None,
        summarization_prompt: str | None = None,
        context_threshold_tokens: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(summary_ratio, bool) or not isinstance(summary_ratio, int | float):
            raise TypeError(
                f"summary_ratio must be a number, got {type(summary_ratio).__name__} "
                f"{summary_ratio!r}"
            )
        if not 0 < summary_ratio <= 1:
            raise ValueError(f"summary_ratio must be in (0, 1], got {summary_ratio!r}")
        check_count("preserve_recent_messages", preserve_recent_messages)
        if context_threshold_tokens is not None:
            check_count("context_threshold_tokens", context_threshold_tokens, minimum=1)
        if summarization_model is not None and not callable(
            getattr(summarization_model, "stream", None)
        ):
            raise TypeError("summarization_model must implement the Model protocol")
        self.summary_ratio = summary_ratio
        self.preserve_recent_messages = preserve_recent_messages
        self.summarization_model = summarization_model
        self.summarization_prompt = summarization_prompt
        self.context_threshold_tokens = context_threshold_tokens

    async def apply_management(self, agent: SupportsMessages) -> None:
        """After an invocation: compact if the context passed the threshold."""
        await self.maybe_compact(agent)

    async def maybe_compact(self, agent: SupportsMessages) -> None:
        """Before a model call: compact if the context passed the threshold."""
        if self.context_threshold_tokens is None:
            return
        if estimate_tokens(agent.messages) > self.context_threshold_tokens:
            await self.compact(agent, trigger="auto")

    async def reduce_context(
        self, agent: SupportsMessages, exception: Exception | None = None
    ) -> None:
        """The model reported an overflow: compact, or re-raise when nothing can go."""
        if not await self.compact(agent, trigger="overflow"):
            if exception is not None:
                raise exception
            raise ValueError("the history cannot be reduced any further")

    async def compact(self, agent: SupportsMessages, *, trigger: str = "auto") -> bool:
        """Fold the oldest part of the history; True when something was folded."""
        messages = agent.messages
        budget = len(messages) - self.preserve_recent_messages
        if budget < 1:
            return False
        wanted = max(1, int(len(messages) * self.summary_ratio))
        cut = find_cut_index(messages, min(wanted, budget))
        if cut is None or cut > budget:
            cut = find_latest_cut_index(messages, budget)
        if not cut:
            return False
        model = self.summarization_model or getattr(agent, "model", None)
        if model is None:
            raise TypeError("SummarizingConversationManager needs an agent with a model")
        try:
            text = await summarize(model, messages[:cut], prompt=self.summarization_prompt)
        except SummaryError:
            return False
        session = getattr(agent, "session_manager", None)
        apply = getattr(session, "apply_compaction", None)
        if apply is not None:
            outcome = apply(agent, cut, text, trigger=trigger)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return bool(getattr(outcome, "status", "compacted") == "compacted")
        agent.messages[:] = [summary_message(text), *messages[cut:]]
        return True


def estimate_tokens(messages: list[Any]) -> int:
    """A rough token count of ``messages`` (JSON characters / 4)."""
    return len(json.dumps(messages, default=str)) // 4
