"""The agent runtime: Agent, its loop, checkpoints, snapshots, conversation managers."""

from perdure.agent.agent import Agent, Prompt
from perdure.agent.checkpoint import CHECKPOINT_SCHEMA_VERSION, Checkpoint, CheckpointPosition
from perdure.agent.conversation import (
    ConversationManager,
    NullConversationManager,
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from perdure.agent.events import (
    AgentEvent,
    CheckpointEvent,
    ModelMessageEvent,
    ReasoningDeltaEvent,
    ResultEvent,
    TextDeltaEvent,
    ToolEndEvent,
    ToolInterruptedEvent,
    ToolStartEvent,
)
from perdure.agent.interrupt_state import InterruptState
from perdure.agent.plugin import Plugin
from perdure.agent.result import AgentResult
from perdure.agent.snapshot import (
    SNAPSHOT_PRESETS,
    SNAPSHOT_SCHEMA_VERSION,
    Snapshot,
    SnapshotField,
    resolve_snapshot_fields,
)
from perdure.tools import Interrupt

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "SNAPSHOT_PRESETS",
    "SNAPSHOT_SCHEMA_VERSION",
    "Agent",
    "AgentEvent",
    "AgentResult",
    "Checkpoint",
    "CheckpointEvent",
    "CheckpointPosition",
    "ConversationManager",
    "Interrupt",
    "InterruptState",
    "ModelMessageEvent",
    "NullConversationManager",
    "Plugin",
    "Prompt",
    "ReasoningDeltaEvent",
    "ResultEvent",
    "SlidingWindowConversationManager",
    "Snapshot",
    "SnapshotField",
    "SummarizingConversationManager",
    "TextDeltaEvent",
    "ToolEndEvent",
    "ToolInterruptedEvent",
    "ToolStartEvent",
    "resolve_snapshot_fields",
]
