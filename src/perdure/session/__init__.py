"""Sessions: message-log stores, the Session manager, paging (SPEC §7)."""

from perdure.session.file_store import FileSessionStore, Segmentation, SessionRecoveryReport
from perdure.session.ids import new_session_id, validate_session_id
from perdure.session.session import Session, read_history_page
from perdure.session.snapshot_manager import (
    BidiAgentSaveLatestStrategy,
    MultiAgentSaveLatestStrategy,
    SaveLatestStrategy,
    SnapshotSessionManager,
    SnapshotTrigger,
)
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
    "BidiAgentSaveLatestStrategy",
    "CommitResult",
    "FileSessionStore",
    "HistoryPage",
    "MultiAgentSaveLatestStrategy",
    "SaveLatestStrategy",
    "Segmentation",
    "Session",
    "SessionMeta",
    "SessionRecord",
    "SessionRecoveryReport",
    "SessionStore",
    "SnapshotSessionManager",
    "SnapshotTrigger",
    "SupportsFlush",
    "SupportsHistoryPage",
    "new_session_id",
    "read_history_page",
    "validate_session_id",
]
