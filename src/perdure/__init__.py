"""perdure: an LLM agent runtime whose state survives crashes and restarts.

The everyday names are re-exported here; everything else lives in its layer's
sub-package (``perdure.agent``, ``perdure.tools``, ``perdure.models``, …).
Importing ``perdure`` never imports an optional dependency, and it stays cheap: the
session names (:class:`Session`, the stores, :func:`open_store`,
:class:`SnapshotSessionManager`) load their layer on first use, as
:mod:`perdure.session` does.

The map (SPEC §1; imports only point down, ``tests/test_layers.py`` holds it):

- ``_runtime`` (layer 0): the one event loop behind the sync calls, fork handling,
  the store writer thread, the fsync strategies, the SQLite error translation.
- ``types``, ``errors``, ``state``, ``storage`` (byte blobs), ``models``, ``tools``,
  ``hooks``, ``agent`` (the loop), ``injection``, ``memory``.
- ``session``: :class:`Session`, the ``SessionStore`` protocol and the rules every
  store obeys (``perdure.session.rules``); ``stores``: the backends, I/O only (the
  file store with its journal format, SQLite, memory); ``checkpoints``: the
  checkpoint stores; ``snapshots``: :class:`SnapshotSessionManager`;
  ``maintenance``: verify, repair, gc; ``migrate``: from Strands.
- ``cli`` and ``testing`` (the conformance suites every backend inherits).
"""

import typing as _typing

from perdure._runtime.lazy import lazy_exports as _lazy_exports
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
from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage, Storage, open_storage
from perdure.tools import ToolContext, tool

if _typing.TYPE_CHECKING:
    from perdure.session.session import Session as Session
    from perdure.session.urls import open_store as open_store
    from perdure.snapshots.manager import SnapshotSessionManager as SnapshotSessionManager
    from perdure.stores.file.store import FileSessionStore as FileSessionStore
    from perdure.stores.memory import MemorySessionStore as MemorySessionStore
    from perdure.stores.sqlite import SQLiteSessionStore as SQLiteSessionStore

__version__ = "0.1.0"

# Loaded on first use, from the modules that define them (never from the
# ``perdure.session`` face: nothing inside perdure imports from it).
_LAZY: dict[str, str] = {
    "FileSessionStore": "perdure.stores.file.store",
    "MemorySessionStore": "perdure.stores.memory",
    "SQLiteSessionStore": "perdure.stores.sqlite",
    "Session": "perdure.session.session",
    "SnapshotSessionManager": "perdure.snapshots.manager",
    "open_store": "perdure.session.urls",
}

__all__ = [
    "Agent",
    "AgentResult",
    "AgentState",
    "Checkpoint",
    "FileSessionStore",
    "HookProvider",
    "HookRegistry",
    "LocalFileStorage",
    "MemorySessionStore",
    "MemoryStorage",
    "NullConversationManager",
    "PerdureError",
    "SQLiteSessionStore",
    "SQLiteStorage",
    "Session",
    "SlidingWindowConversationManager",
    "Snapshot",
    "SnapshotField",
    "SnapshotSessionManager",
    "Storage",
    "SummarizingConversationManager",
    "ToolContext",
    "__version__",
    "open_storage",
    "open_store",
    "resolve_snapshot_fields",
    "tool",
]


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
