"""Sessions: message-log stores, the Session manager, paging (SPEC §7)."""

from perdure.session.checkpoints import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    DamagedCheckpoint,
    FileCheckpointStore,
    MemoryCheckpointStore,
    scan_checkpoints,
)
from perdure.session.export import EXPORT_FORMAT
from perdure.session.file_store import FileSessionStore, Segmentation, SessionRecoveryReport
from perdure.session.ids import new_session_id, validate_session_id
from perdure.session.maintenance import (
    GcReport,
    RepairReport,
    VerifyReport,
    gc_store,
    repair_store,
    verify_store,
)
from perdure.session.migrate_strands import MigrationReport, migrate_strands
from perdure.session.open_store import open_store
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
    "DamagedCheckpoint",
    "FileCheckpointStore",
    "FileSessionStore",
    "GcReport",
    "HistoryPage",
    "MemoryCheckpointStore",
    "MigrationReport",
    "MultiAgentSaveLatestStrategy",
    "RepairReport",
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
    "VerifyReport",
    "gc_store",
    "migrate_strands",
    "new_session_id",
    "open_store",
    "read_history_page",
    "repair_store",
    "scan_checkpoints",
    "validate_session_id",
    "verify_store",
]
