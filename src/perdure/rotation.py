"""Key rotation: re-encrypt a store's records under a new key, in place (SPEC §9).

``perdure rotate-keys`` is a thin face over :func:`rotate_keys` (a session store) and
:func:`rotate_storage_keys` (a blob storage: a ``SnapshotSessionManager``'s snapshots,
chunks and runs, a LangGraph saver's checkpoints). Every session whose
records are not all under the target key is rewritten whole — one atomic rewrite
commit per session, under its writer lock — and every checkpoint not under it is
written again under its own id (an atomic replace). A process killed at any moment
leaves each session and checkpoint under its old key or its new one, never a mix
within one write, and never anything unreadable while the old key is still held: run
it again and it picks up where it stopped, skipping what is done.

Which key a record is under is seen while reading it: the store is opened with a
cipher that notes the key id of every envelope it opens (:class:`KeyTally`), so
nothing else needs to know the store's layout.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perdure.checkpoints.store import CheckpointStore, checkpoint_names, get_named_checkpoint
from perdure.crypto import Cipher, envelope_key_id
from perdure.errors import CheckpointNotFoundError, SessionNotFoundError, StorageConflictError
from perdure.session.store import SessionStore
from perdure.snapshots.io import list_all
from perdure.storage import ConditionalStorage, Storage

__all__ = ["BlobRotationReport", "KeyTally", "RotationReport", "rotate_keys", "rotate_storage_keys"]

_PAGE = 200


class KeyTally:
    """A :class:`~perdure.crypto.Cipher` that notes the key id of each envelope it opens.

    Encrypts with ``cipher`` (its active key); :meth:`reset` starts a new count.
    """

    def __init__(self, cipher: Cipher) -> None:
        self.cipher = cipher
        self.keys: set[str] = set()
        self.opened = 0

    @property
    def active(self) -> str:
        """The key new records are encrypted with (the rotation's target)."""
        return self.cipher.active

    def reset(self) -> None:
        """Forget what was opened so far."""
        self.keys = set()
        self.opened = 0

    def encrypt(self, plaintext: bytes) -> bytes:
        """``cipher.encrypt``."""
        return self.cipher.encrypt(plaintext)

    def decrypt(self, envelope: bytes) -> bytes:
        """``cipher.decrypt``, noting the envelope's key id."""
        plain = self.cipher.decrypt(envelope)
        self.keys.add(envelope_key_id(envelope))
        self.opened += 1
        return plain

    def fingerprint(self, data: bytes) -> str:
        """``cipher.fingerprint``."""
        return self.cipher.fingerprint(data)


@dataclass
class RotationReport:
    """What :func:`rotate_keys` did.

    Attributes:
        to: the key everything is under now.
        sessions_checked / sessions_rotated: sessions read / rewritten.
        checkpoints_checked / checkpoints_rotated: checkpoints read / written again.
        keys_seen: every key id found under the records before the rotation.
    """

    to: str
    sessions_checked: int = 0
    sessions_rotated: int = 0
    checkpoints_checked: int = 0
    checkpoints_rotated: int = 0
    keys_seen: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "to": self.to,
            "sessions_checked": self.sessions_checked,
            "sessions_rotated": self.sessions_rotated,
            "checkpoints_checked": self.checkpoints_checked,
            "checkpoints_rotated": self.checkpoints_rotated,
            "keys_seen": sorted(self.keys_seen),
        }


async def rotate_keys(
    open_store: Callable[[Cipher], SessionStore],
    cipher: Cipher,
    *,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RotationReport:
    """Re-encrypt every session and checkpoint of a store under ``cipher.active``.

    Args:
        open_store: opens the store with the cipher it is given (e.g.
            ``lambda c: open_store(url, cipher=c)``); the store is closed afterwards
            if it has a ``close``.
        cipher: holds the target key (active) and every key records may be under.
        force: rewrite every session and checkpoint, also those already under the
            target key — and those written before encryption was turned on, which a
            read cannot tell from encrypted ones (a plain message is no envelope).
        progress: called as ``progress(done, total)`` after each session.

    What a session holds is rewritten as it reads: a redaction replaces the
    original it hid, and the rewrite renews the session's TTL.

    Raises:
        DecryptionError: a record is under a key ``cipher`` does not hold (nothing of
            that session was written).
        SessionLockedError: another writer holds a session (run again later).
    """
    tally = KeyTally(cipher)
    store = open_store(tally)
    report = RotationReport(cipher.active)
    try:
        ids = await _session_ids(store)
        checkpoints = getattr(store, "checkpoints", None)
        for done, session_id in enumerate(ids, start=1):
            await _rotate_session(store, tally, session_id, force, report)
            if isinstance(checkpoints, CheckpointStore):
                await _rotate_checkpoints(checkpoints, tally, session_id, force, report)
            if progress is not None:
                progress(done, len(ids))
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
    return report


@dataclass
class BlobRotationReport:
    """What :func:`rotate_storage_keys` did.

    Attributes:
        to: the key the blobs are under now.
        blobs_checked / blobs_rotated: blobs read / written again.
        blobs_changed: blobs another writer replaced or deleted while they were
            rotated, left as that writer wrote them.
        keys_seen: every key id found under the blobs before the rotation.
    """

    to: str
    blobs_checked: int = 0
    blobs_rotated: int = 0
    blobs_changed: int = 0
    keys_seen: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "to": self.to,
            "blobs_checked": self.blobs_checked,
            "blobs_rotated": self.blobs_rotated,
            "blobs_changed": self.blobs_changed,
            "keys_seen": sorted(self.keys_seen),
        }


async def rotate_storage_keys(
    open_storage: Callable[[Cipher], Storage],
    cipher: Cipher,
    *,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> BlobRotationReport:
    """Re-encrypt every blob of a storage under ``cipher.active``.

    Each blob not under the target key is read and written again under its key, on
    condition that it is still the version read (``write_if``): a blob another
    writer replaced meanwhile (a snapshot manager saving ``latest``) is left as that
    writer wrote it and counted in ``blobs_changed``, and a manager that saved
    nothing meanwhile finds the new version at its next save and reports a conflict
    (``session_conflict``) rather than overwrite it: rotate while nothing writes.
    Each write is atomic, so a process killed at any moment leaves every blob under
    its old key or its new one; running again resumes, skipping what is done.

    Args:
        open_storage: opens the storage with the cipher it is given (e.g.
            ``lambda c: open_storage(url, cipher=c)``); closed afterwards if it has a
            ``close``.
        cipher: holds the target key (active) and every key blobs may be under.
        force: write every blob again, also those already under the target key.
        progress: called as ``progress(done, total)`` after each blob.

    Raises:
        DecryptionError: a blob is under a key ``cipher`` does not hold, or was
            written without encryption (nothing of it was written).
        TypeError: the storage is not a ``ConditionalStorage``.
    """
    tally = KeyTally(cipher)
    storage = open_storage(tally)
    report = BlobRotationReport(cipher.active)
    try:
        if not isinstance(storage, ConditionalStorage):
            raise TypeError(
                f"rotating keys needs a ConditionalStorage (write_if), got {type(storage).__name__}"
            )
        keys = await list_all(storage, "")
        for done, key in enumerate(keys, start=1):
            tally.reset()
            version = await storage.version(key)
            data = None if version is None else await storage.read(key)
            if data is not None:
                report.blobs_checked += 1
                report.keys_seen |= tally.keys
                if force or tally.keys != {tally.active}:
                    try:
                        await storage.write_if(key, data, expected=version)
                        report.blobs_rotated += 1
                    except StorageConflictError:
                        report.blobs_changed += 1
            if progress is not None:
                progress(done, len(keys))
    finally:
        close = getattr(storage, "close", None)
        if callable(close):
            close()
    return report


async def _session_ids(store: SessionStore) -> builtins.list[str]:
    ids: builtins.list[str] = []
    after: str | None = None
    while True:
        page = await store.list(limit=_PAGE, after=after)
        ids.extend(meta.session_id for meta in page)
        if len(page) < _PAGE:
            return ids
        after = page[-1].session_id


async def _rotate_session(
    store: SessionStore, tally: KeyTally, session_id: str, force: bool, report: RotationReport
) -> None:
    async with store.writer_lock(session_id):
        tally.reset()
        try:
            record = await store.get(session_id)
        except SessionNotFoundError:
            return  # deleted or expired since it was listed
        report.sessions_checked += 1
        report.keys_seen |= tally.keys
        if not record.messages and not record.agent_state:
            return
        if not force and tally.keys == {tally.active}:
            return
        await store.commit(
            session_id,
            record.messages,
            agent_state=record.agent_state,
            rewritten=True,
            expected_tail=record.tail,
        )
        report.sessions_rotated += 1


async def _rotate_checkpoints(
    checkpoints: CheckpointStore,
    tally: KeyTally,
    session_id: str,
    force: bool,
    report: RotationReport,
) -> None:
    for checkpoint_id in await checkpoint_names(checkpoints, session_id):
        tally.reset()
        try:
            record = await get_named_checkpoint(checkpoints, session_id, checkpoint_id)
        except CheckpointNotFoundError:
            continue
        report.checkpoints_checked += 1
        report.keys_seen |= tally.keys
        if force or tally.keys != {tally.active}:
            await checkpoints.put(record)
            report.checkpoints_rotated += 1
