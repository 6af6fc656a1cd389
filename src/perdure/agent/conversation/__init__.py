"""Conversation managers: policies that keep an agent's history within the model's reach."""

from perdure.agent.conversation.base import ConversationManager, SupportsMessages
from perdure.agent.conversation.null import NullConversationManager
from perdure.agent.conversation.pairing import repair_tool_pairs
from perdure.agent.conversation.sliding_window import SlidingWindowConversationManager
from perdure.agent.conversation.summarizing import SummarizingConversationManager

__all__ = [
    "ConversationManager",
    "NullConversationManager",
    "SlidingWindowConversationManager",
    "SummarizingConversationManager",
    "SupportsMessages",
    "repair_tool_pairs",
]
