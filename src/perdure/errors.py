"""The exceptions perdure raises.

Every error perdure raises on purpose is a :class:`PerdureError` with a stable,
machine-readable ``code`` (a string). Codes are part of the public contract: match on
``err.code`` rather than on the message text. Misuse of an API (a wrong argument type
or value) raises the built-in ``TypeError``/``ValueError`` naming the argument instead.

The tree::

    PerdureError                      code
    ├── SessionNotFoundError          session_not_found
    ├── SessionCorruptedError         session_store_corrupted
    ├── SessionLockedError            session_locked
    ├── SessionConflictError          session_conflict
    ├── TurnRunningError              turn_running
    ├── SessionMismatchError          session_mismatch
    ├── StoreNotWiredError            store_not_wired
    ├── CheckpointNotFoundError       checkpoint_not_found
    ├── CheckpointImportError         checkpoint_import_invalid
    ├── CheckpointError               checkpoint_error
    ├── SnapshotError                 snapshot_error
    ├── FilterFailedError             filter_failed
    ├── StoreUnavailableError         store_unavailable   (also a ConnectionError)
    ├── SchemaVersionError            schema_version
    ├── MemoryStoreError              memory_store_error
    │   └── MemoryStoreLockedError    memory_store_locked
    ├── DecryptionError               decryption
    ├── StorageError                  storage_error
    │   ├── StorageLockedError        storage_locked
    │   └── StorageConflictError      storage_conflict
    └── ModelError                    model_error
        ├── ContextWindowOverflowError context_window_overflow
        ├── ModelAuthenticationError   model_authentication
        ├── ModelRateLimitError        model_rate_limited
        ├── ModelServerError           model_server_error
        └── ModelConnectionError       model_connection

Model adapters raise the ``ModelError`` subclasses: a provider failure never leaks as
the SDK's own exception (the SDK's error is kept as ``__cause__``). A plain
``ModelError`` covers the other refusals (a bad request, an unknown model id).
``ModelRateLimitError``, ``ModelServerError`` and ``ModelConnectionError`` are
transient: the adapters retry them with backoff before anything was streamed, and
raise them once the retries are spent.

Backends report their driver's errors in their own layer's words, and only damage as
damage: stored data that is not what perdure wrote is ``SessionCorruptedError``
wherever it is read (a session store, a snapshot's blob storage); a database another
connection keeps locked is the layer's "locked" error (``SessionLockedError`` for a
session's writer lock, ``StorageLockedError``, ``MemoryStoreLockedError``); an I/O
failure, a full disk or a file that cannot be opened is the layer's general error
(``StorageError``, ``MemoryStoreError``; ``OSError`` from a session store). A server
that cannot be reached (down, restarting, the connection lost) is
``StoreUnavailableError`` in every layer: a ``PerdureError`` and a ``ConnectionError``
(so an ``OSError`` too); its ``details["outcome"]`` says whether the write it
interrupted was applied (``"applied"`` never appears: that write is not an error),
was not (``"not_applied"``), or cannot be known (``"unknown"``).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CheckpointError",
    "CheckpointImportError",
    "CheckpointNotFoundError",
    "ContextWindowOverflowError",
    "DecryptionError",
    "FilterFailedError",
    "MemoryStoreError",
    "MemoryStoreLockedError",
    "ModelAuthenticationError",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimitError",
    "ModelServerError",
    "PerdureError",
    "SchemaVersionError",
    "SessionConflictError",
    "SessionCorruptedError",
    "SessionLockedError",
    "SessionMismatchError",
    "SessionNotFoundError",
    "SnapshotError",
    "StorageConflictError",
    "StorageError",
    "StorageLockedError",
    "StoreNotWiredError",
    "StoreUnavailableError",
    "TurnRunningError",
]


class PerdureError(Exception):
    """Base of every error perdure raises on purpose; ``code`` is stable."""

    code: ClassVar[str] = "perdure_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}
        """Machine-readable facts about the error (e.g. the position of damage)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class SessionNotFoundError(PerdureError):
    """A session id that must exist does not."""

    code = "session_not_found"


class SessionCorruptedError(PerdureError):
    """Stored session data is damaged; it is reported, never replaced by an empty session."""

    code = "session_store_corrupted"


class SessionLockedError(PerdureError):
    """Another writer holds the session's writer lock right now."""

    code = "session_locked"


class SessionConflictError(PerdureError):
    """The stored history moved on since this writer last saw it."""

    code = "session_conflict"


class TurnRunningError(PerdureError):
    """The operation cannot run while the agent is in the middle of a turn."""

    code = "turn_running"


class SessionMismatchError(PerdureError):
    """A checkpoint or record belongs to a different session."""

    code = "session_mismatch"


class StoreNotWiredError(PerdureError):
    """The operation needs a store that was not configured."""

    code = "store_not_wired"


class CheckpointNotFoundError(PerdureError):
    """A well-formed checkpoint id names no checkpoint."""

    code = "checkpoint_not_found"


class CheckpointImportError(PerdureError):
    """An exported checkpoint failed verification; nothing was written."""

    code = "checkpoint_import_invalid"


class CheckpointError(PerdureError):
    """A loop checkpoint is malformed, of another schema, or does not fit the history."""

    code = "checkpoint_error"


class SnapshotError(PerdureError):
    """A snapshot is malformed, of another schema, or asks for no or unknown fields."""

    code = "snapshot_error"


class FilterFailedError(PerdureError):
    """A persistence filter raised, or returned a value of the wrong type: nothing was written.

    The message names the filter (its position in ``filters`` and its name), the
    kind of value and where it was going, never the value itself; the filter's own
    exception is ``__cause__``.
    """

    code = "filter_failed"


class DecryptionError(PerdureError):
    """An encrypted record could not be decrypted: nothing garbled is ever returned.

    A wrong key, a key the cipher does not hold, altered bytes, or an encrypted
    record read without a cipher. ``details["reason"]`` says which
    (``"unknown_key"``, ``"authentication_failed"``, ``"no_cipher"``,
    ``"not_encrypted"``, …) and ``details["key_id"]`` names the record's key when it
    is known; the key itself is never in the message.
    """

    code = "decryption"


class StoreUnavailableError(PerdureError, ConnectionError):
    """The server a store, storage or memory store lives on cannot be reached.

    Down, restarting, refusing connections, or the connection was lost and did not
    come back within the store's reconnect timeout; or it could not serve the request
    in time: no pooled connection came free (``details["reason"] == "pool_busy"``),
    or the server cancelled the statement (``statement_timeout``:
    ``details["reason"] == "statement_timeout"``; its transaction rolled back, a
    write's outcome is ``"not_applied"``). Retrying later may succeed.
    ``details["outcome"]`` tells, for a write, whether it was applied:
    ``"not_applied"`` (provably not: nothing changed) or ``"unknown"`` (the server
    went away after the write was sent and never answered where it could be
    checked); reads carry no outcome. The driver's error is the ``__cause__``.
    """

    code = "store_unavailable"


class SchemaVersionError(PerdureError):
    """A database schema was made by another version of perdure than this one.

    Raised when a store opens a schema whose recorded version (the
    ``perdure_schema_version`` table) is not the one this perdure writes: it refuses
    to read or write it rather than guess. ``details`` hold ``component``, ``found``,
    ``supported`` and ``reason``: ``"newer"`` (upgrade perdure), ``"older"`` (run
    ``perdure migrate-schema``, which the message spells out; opening a store never
    upgrades by itself) or ``"too_old"`` (older than this perdure can upgrade).
    """

    code = "schema_version"


class ModelError(PerdureError):
    """The model failed to produce a response (adapters refine this per provider)."""

    code = "model_error"


class ContextWindowOverflowError(ModelError):
    """The request does not fit the model's context window.

    The agent loop answers it by asking the conversation manager to reduce the
    context and calling the model again.
    """

    code = "context_window_overflow"


class ModelAuthenticationError(ModelError):
    """The provider refused the credentials (HTTP 401/403), or none were found.

    Attributes:
        status_code: the HTTP status, or ``None`` when no request was made.
    """

    code = "model_authentication"

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ModelRateLimitError(ModelError):
    """The provider throttled the request (HTTP 429); retried before it is raised.

    Attributes:
        status_code: the HTTP status (429), or ``None`` for an error inside a stream.
        retry_after: the seconds the provider asked to wait, when it said.
    """

    code = "model_rate_limited"

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after


class ModelServerError(ModelError):
    """The provider failed or is overloaded (HTTP 5xx, 529); retried before it is raised.

    Attributes:
        status_code: the HTTP status, or ``None`` for an error inside a stream.
        retry_after: the seconds the provider asked to wait, when it said.
    """

    code = "model_server_error"

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after


class ModelConnectionError(ModelError):
    """The provider could not be reached, timed out, or cut the stream short.

    Retried like a server error when nothing was streamed yet.

    Attributes:
        retry_after: always ``None`` (no server said anything); present so every
            retryable error has it.
    """

    code = "model_connection"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_after: float | None = None


class MemoryStoreError(PerdureError):
    """A memory store's backend failed (a SQLite error, say); the driver error is the cause.

    Driver exceptions never leak from perdure's stores: they are translated into
    this error, with the original as ``__cause__``.
    """

    code = "memory_store_error"


class StorageError(PerdureError):
    """A blob ``Storage`` backend failed for a reason other than damage.

    I/O, a full disk, a file it cannot open; :class:`StorageLockedError` when another
    connection held the lock. The driver's own exception is kept as ``__cause__``.
    """

    code = "storage_error"


class StorageLockedError(StorageError):
    """Another connection kept a blob ``Storage`` locked past its timeout; nothing changed.

    Not damage, and not a session's writer lock: retrying later may succeed.
    """

    code = "storage_locked"


class StorageConflictError(StorageError):
    """A conditional write found the blob not as the caller expected; nothing was written.

    Another writer changed (or created, or deleted) the blob since the caller last
    read or wrote it. Not damage: read the blob again before deciding what to write.
    """

    code = "storage_conflict"


class MemoryStoreLockedError(MemoryStoreError):
    """Another connection kept a memory store's database locked past its timeout.

    Not damage: retrying later may succeed. The driver error is the ``__cause__``.
    """

    code = "memory_store_locked"
