"""perdure: an LLM agent runtime whose state survives crashes and restarts.

The everyday names are re-exported here; everything else lives in its layer's
sub-package (``perdure.agent``, ``perdure.tools``, ``perdure.models``, …).
Importing ``perdure`` never imports an optional dependency.
"""

from perdure.agent import (
    Agent,
    AgentResult,
    Checkpoint,
    NullConversationManager,
    SlidingWindowConversationManager,
    Snapshot,
    SnapshotField,
    SummarizingConversationManager,
    resolve_snapshot_fields,
)
from perdure.errors import PerdureError
from perdure.hooks import HookProvider, HookRegistry
from perdure.state import AgentState
from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage, Storage
from perdure.tools import ToolContext, tool

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentResult",
    "AgentState",
    "Checkpoint",
    "HookProvider",
    "HookRegistry",
    "LocalFileStorage",
    "MemoryStorage",
    "NullConversationManager",
    "PerdureError",
    "SQLiteStorage",
    "SlidingWindowConversationManager",
    "Snapshot",
    "SnapshotField",
    "Storage",
    "SummarizingConversationManager",
    "ToolContext",
    "__version__",
    "resolve_snapshot_fields",
    "tool",
]
