"""Sessions: message-log stores, the Session manager, paging (SPEC §7)."""

from perdure.session.checkpoints import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
)
from perdure.session.export import EXPORT_FORMAT
from perdure.session.file_store import FileSessionStore, Segmentation, SessionRecoveryReport
from perdure.session.ids import new_session_id, validate_session_id
from perdure.session.results import CompactResult, RestoreResult
from perdure.session.session import Session, read_history_page
from perdure.session.snapshot_manager import (
    BidiAgentSaveLatestStrategy,
    MultiAgentSaveLatestStrategy,
    SaveLatestStrategy,
    SnapshotSessionManager,
    SnapshotTrigger,
)
from perdure.session.storage_checkpoints import StorageCheckpointStore
from perdure.session.store import (
    CommitResult,
    HistoryPage,
    SessionMeta,
    SessionRecord,
    SessionStore,
    SupportsFlush,
    SupportsHistoryPage,
)

__all__ = [
    "EXPORT_FORMAT",
    "BidiAgentSaveLatestStrategy",
    "CheckpointMeta",
    "CheckpointRecord",
    "CheckpointStore",
    "CommitResult",
    "CompactResult",
    "FileCheckpointStore",
    "FileSessionStore",
    "HistoryPage",
    "MemoryCheckpointStore",
    "MultiAgentSaveLatestStrategy",
    "RestoreResult",
    "SaveLatestStrategy",
    "Segmentation",
    "Session",
    "SessionMeta",
    "SessionRecord",
    "SessionRecoveryReport",
    "SessionStore",
    "SnapshotSessionManager",
    "SnapshotTrigger",
    "StorageCheckpointStore",
    "SupportsFlush",
    "SupportsHistoryPage",
    "new_session_id",
    "read_history_page",
    "validate_session_id",
]
