"""Sessions (SPEC §7): the public face of the session layer.

Everything a user names is importable from here; nothing inside perdure imports from
this face (it re-exports lazily, so importing one module of the layer does not load
every backend). The map of the layer:

- :mod:`perdure.session` — :class:`Session` (the message-log manager for one agent,
  :mod:`~perdure.session.session`), the :class:`SessionStore` protocol
  (:mod:`~perdure.session.store`) and the pure rules every store obeys
  (:mod:`~perdure.session.rules`: commit planning, conflicts, validation and
  encoding, chain hashing; :mod:`~perdure.session.paging`, ids and ULIDs), and
  :func:`open_store` (:mod:`~perdure.session.urls`: a store chosen by URL).
- :mod:`perdure.stores` — the backends: the file store (:mod:`perdure.stores.file`,
  with the journal format), SQLite, memory, PostgreSQL (``perdure[postgres]``:
  importing its names imports psycopg) and Redis (``perdure[redis]``).
- :mod:`perdure.checkpoints` — the checkpoint stores and the export format.
- :mod:`perdure.snapshots` — :class:`SnapshotSessionManager` and its format.
- :mod:`perdure.maintenance` — verify, repair and gc over any store.
- :mod:`perdure.migrate` — migration from Strands.
"""

from __future__ import annotations

import typing as _typing

from perdure._runtime.lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from perdure.checkpoints.export import EXPORT_FORMAT as EXPORT_FORMAT
    from perdure.checkpoints.storage import StorageCheckpointStore as StorageCheckpointStore
    from perdure.checkpoints.store import CheckpointMeta as CheckpointMeta
    from perdure.checkpoints.store import CheckpointRecord as CheckpointRecord
    from perdure.checkpoints.store import CheckpointStore as CheckpointStore
    from perdure.checkpoints.store import DamagedCheckpoint as DamagedCheckpoint
    from perdure.checkpoints.store import FileCheckpointStore as FileCheckpointStore
    from perdure.checkpoints.store import MemoryCheckpointStore as MemoryCheckpointStore
    from perdure.checkpoints.store import scan_checkpoints as scan_checkpoints
    from perdure.maintenance import GcReport as GcReport
    from perdure.maintenance import RepairReport as RepairReport
    from perdure.maintenance import VerifyReport as VerifyReport
    from perdure.maintenance import gc_checkpoints as gc_checkpoints
    from perdure.maintenance import gc_store as gc_store
    from perdure.maintenance import repair_store as repair_store
    from perdure.maintenance import verify_store as verify_store
    from perdure.migrate.strands import MigrationReport as MigrationReport
    from perdure.migrate.strands import migrate_strands as migrate_strands
    from perdure.session.ids import new_session_id as new_session_id
    from perdure.session.ids import validate_session_id as validate_session_id
    from perdure.session.results import CompactResult as CompactResult
    from perdure.session.results import RestoreResult as RestoreResult
    from perdure.session.session import Session as Session
    from perdure.session.session import read_history_page as read_history_page
    from perdure.session.store import CommitResult as CommitResult
    from perdure.session.store import HistoryPage as HistoryPage
    from perdure.session.store import SessionMeta as SessionMeta
    from perdure.session.store import SessionRecord as SessionRecord
    from perdure.session.store import SessionStore as SessionStore
    from perdure.session.store import StoreBase as StoreBase
    from perdure.session.store import SupportsFlush as SupportsFlush
    from perdure.session.store import SupportsHistoryPage as SupportsHistoryPage
    from perdure.session.urls import open_store as open_store
    from perdure.snapshots.manager import (
        BidiAgentSaveLatestStrategy as BidiAgentSaveLatestStrategy,
    )
    from perdure.snapshots.manager import (
        MultiAgentSaveLatestStrategy as MultiAgentSaveLatestStrategy,
    )
    from perdure.snapshots.manager import SaveLatestStrategy as SaveLatestStrategy
    from perdure.snapshots.manager import SnapshotSessionManager as SnapshotSessionManager
    from perdure.snapshots.manager import SnapshotTrigger as SnapshotTrigger
    from perdure.stores.file.store import FileSessionStore as FileSessionStore
    from perdure.stores.file.store import Segmentation as Segmentation
    from perdure.stores.file.store import SessionRecoveryReport as SessionRecoveryReport
    from perdure.stores.memory import MemorySessionStore as MemorySessionStore
    from perdure.stores.postgres.checkpoints import (
        PostgresCheckpointStore as PostgresCheckpointStore,
    )
    from perdure.stores.postgres.sessions import PostgresSessionStore as PostgresSessionStore
    from perdure.stores.redis.sessions import RedisSessionStore as RedisSessionStore
    from perdure.stores.sqlite import SQLiteCheckpointStore as SQLiteCheckpointStore
    from perdure.stores.sqlite import SQLiteSessionStore as SQLiteSessionStore

_EXPORTS: dict[str, str] = {
    "BidiAgentSaveLatestStrategy": "perdure.snapshots.manager",
    "CheckpointMeta": "perdure.checkpoints.store",
    "CheckpointRecord": "perdure.checkpoints.store",
    "CheckpointStore": "perdure.checkpoints.store",
    "CommitResult": "perdure.session.store",
    "CompactResult": "perdure.session.results",
    "DamagedCheckpoint": "perdure.checkpoints.store",
    "EXPORT_FORMAT": "perdure.checkpoints.export",
    "FileCheckpointStore": "perdure.checkpoints.store",
    "FileSessionStore": "perdure.stores.file.store",
    "GcReport": "perdure.maintenance",
    "HistoryPage": "perdure.session.store",
    "MemoryCheckpointStore": "perdure.checkpoints.store",
    "MemorySessionStore": "perdure.stores.memory",
    "MigrationReport": "perdure.migrate.strands",
    "MultiAgentSaveLatestStrategy": "perdure.snapshots.manager",
    "PostgresCheckpointStore": "perdure.stores.postgres.checkpoints",
    "PostgresSessionStore": "perdure.stores.postgres.sessions",
    "RedisSessionStore": "perdure.stores.redis.sessions",
    "RepairReport": "perdure.maintenance",
    "RestoreResult": "perdure.session.results",
    "SQLiteCheckpointStore": "perdure.stores.sqlite",
    "SQLiteSessionStore": "perdure.stores.sqlite",
    "SaveLatestStrategy": "perdure.snapshots.manager",
    "Segmentation": "perdure.stores.file.store",
    "Session": "perdure.session.session",
    "SessionMeta": "perdure.session.store",
    "SessionRecord": "perdure.session.store",
    "SessionRecoveryReport": "perdure.stores.file.store",
    "SessionStore": "perdure.session.store",
    "StoreBase": "perdure.session.store",
    "SnapshotSessionManager": "perdure.snapshots.manager",
    "SnapshotTrigger": "perdure.snapshots.manager",
    "StorageCheckpointStore": "perdure.checkpoints.storage",
    "SupportsFlush": "perdure.session.store",
    "SupportsHistoryPage": "perdure.session.store",
    "VerifyReport": "perdure.maintenance",
    "gc_checkpoints": "perdure.maintenance",
    "gc_store": "perdure.maintenance",
    "migrate_strands": "perdure.migrate.strands",
    "new_session_id": "perdure.session.ids",
    "open_store": "perdure.session.urls",
    "read_history_page": "perdure.session.session",
    "repair_store": "perdure.maintenance",
    "scan_checkpoints": "perdure.checkpoints.store",
    "validate_session_id": "perdure.session.ids",
    "verify_store": "perdure.maintenance",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
