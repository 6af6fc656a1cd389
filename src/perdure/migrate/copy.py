"""Copy sessions, with their checkpoints, from one store to another, verified.

``copy_sessions(source, target)`` moves sessions between any two stores — a file
store to PostgreSQL, SQLite to a file store, … — through the public store API
(``perdure copy --from URL --to URL``). For each session:

1. its writer lock is taken in the source, so no turn runs while it is read (a
   session another writer holds is skipped, ``session_locked``, never read half-way);
2. it is read whole and verified by the source (a damaged session is not copied:
   damage is never spread), with its agent state and every checkpoint;
3. under the target's writer lock, it is created there (an existing session is
   skipped unless ``overwrite``, which deletes it, checkpoints and all, first) and
   written in one commit, then each checkpoint is put with its own id and meta;
4. the target is read back: the history, the state and every checkpoint must equal
   what was read from the source, else the session is reported ``failed``.

The history copied is the one the source's reads return: a redacted message is
copied as its replacement (the original stays behind). A session keeps its creation
time (``created_at``); checkpoints keep their ids, triggers, labels and times.
Nothing is deleted from the source. A dry run reads and checks everything and writes
nothing.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from perdure.checkpoints.store import (
    CheckpointRecord,
    CheckpointStore,
    checkpoint_names,
    get_named_checkpoint,
)
from perdure.errors import (
    CheckpointNotFoundError,
    PerdureError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.session.ids import validate_session_id
from perdure.session.rules import creation_time
from perdure.session.store import SessionRecord, SessionStore

__all__ = ["CopiedSession", "CopyReport", "CopyStatus", "copy_sessions"]

CopyStatus = Literal["copied", "would_copy", "skipped", "failed"]

_PAGE = 200


@dataclass(frozen=True)
class CopiedSession:
    """What became of one session.

    Attributes:
        session_id: the session.
        status: ``copied``; ``would_copy`` (a dry run); ``skipped`` (``reason``:
            ``exists`` in the target, ``session_locked`` by another writer in the
            source or target, ``session_not_found`` deleted meanwhile); ``failed``
            (``reason``: the error code, e.g. ``session_store_corrupted``;
            ``verify_mismatch`` when the copy read back differs; ``bad_created_at``
            when the source's creation time names no instant).
        reason: why it was skipped or failed (``None`` when copied).
        detail: the error's message, when there was one.
        messages: messages in the history copied (or that would be).
        checkpoints: checkpoints copied (or that would be).
    """

    session_id: str
    status: CopyStatus
    reason: str | None = None
    detail: str | None = None
    messages: int = 0
    checkpoints: int = 0


@dataclass(frozen=True)
class CopyReport:
    """What :func:`copy_sessions` did (or would do, with ``dry_run``)."""

    dry_run: bool
    sessions: tuple[CopiedSession, ...]

    @property
    def ok(self) -> bool:
        """Every session was copied (or would be)."""
        return all(s.status in ("copied", "would_copy") for s in self.sessions)

    def count(self, status: CopyStatus) -> int:
        """How many sessions ended with ``status``."""
        return sum(1 for s in self.sessions if s.status == status)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "dry_run": self.dry_run,
            "ok": self.ok,
            "sessions": [asdict(s) for s in self.sessions],
        }


async def copy_sessions(
    source: SessionStore,
    target: SessionStore,
    *,
    session_ids: Sequence[str] | None = None,
    overwrite: bool = False,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CopyReport:
    """Copy sessions and their checkpoints from ``source`` to ``target``, verified.

    See the module docstring for what happens to each session.

    Args:
        source: the store to copy from (only read).
        target: the store to copy into.
        session_ids: the sessions to copy (``None``: every session of ``source``).
        overwrite: replace sessions that exist in ``target`` (else they are skipped).
        dry_run: read and check everything, write nothing.
        progress: called as ``progress(done, total)`` after each session.

    Raises:
        ValueError: ``source`` and ``target`` are the same object, or a session id
            is malformed.
    """
    if source is target:
        raise ValueError("source and target are the same store")
    if session_ids is None:
        ids = await _every_session(source)
    else:
        ids = [validate_session_id(s, "session_ids") for s in dict.fromkeys(session_ids)]
    done: list[CopiedSession] = []
    for index, session_id in enumerate(ids, start=1):
        done.append(await _copy_one(source, target, session_id, overwrite, dry_run))
        if progress is not None:
            progress(index, len(ids))
    return CopyReport(dry_run, tuple(done))


async def _every_session(store: SessionStore) -> builtins.list[str]:
    ids: builtins.list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list(limit=_PAGE, after=cursor)
        ids.extend(meta.session_id for meta in page)
        if len(page) < _PAGE:
            return ids
        cursor = page[-1].session_id


def _checkpoints(store: SessionStore) -> CheckpointStore | None:
    found = getattr(store, "checkpoints", None)
    return found if isinstance(found, CheckpointStore) else None


async def _copy_one(
    source: SessionStore, target: SessionStore, session_id: str, overwrite: bool, dry_run: bool
) -> CopiedSession:
    try:
        async with source.writer_lock(session_id):
            record, records = await _read(source, session_id)
    except SessionLockedError as exc:
        return CopiedSession(session_id, "skipped", exc.code, exc.message)
    except SessionNotFoundError as exc:
        return CopiedSession(session_id, "skipped", exc.code, exc.message)
    except PerdureError as exc:
        return CopiedSession(session_id, "failed", exc.code, exc.message)

    def result(
        status: CopyStatus, reason: str | None = None, detail: str | None = None
    ) -> CopiedSession:
        return CopiedSession(session_id, status, reason, detail, len(record.messages), len(records))

    target_checkpoints = _checkpoints(target)
    if records and target_checkpoints is None:
        return result("failed", "no_checkpoint_store", "the target keeps no checkpoints")
    try:
        created = creation_time(record.meta.created_at)
    except ValueError as exc:  # stored by something else than perdure: not guessed at
        return result("failed", "bad_created_at", str(exc))
    try:
        exists = await _exists(target, session_id)
        if exists and not overwrite:
            return result("skipped", "exists")
        if dry_run:
            return result("would_copy")
        async with target.writer_lock(session_id):
            if exists:
                await target.delete(session_id)
            await target.create(session_id, created_at=created)
            await target.commit(session_id, record.messages, agent_state=record.agent_state)
            for checkpoint in records:
                assert target_checkpoints is not None
                await target_checkpoints.put(checkpoint)
        mismatch = await _verify(target, target_checkpoints, record, records, created)
    except PerdureError as exc:
        status: CopyStatus = "skipped" if isinstance(exc, SessionLockedError) else "failed"
        return result(status, exc.code, exc.message)
    if mismatch is not None:
        return result("failed", "verify_mismatch", mismatch)
    return result("copied")


async def _read(
    store: SessionStore, session_id: str
) -> tuple[SessionRecord, builtins.list[CheckpointRecord]]:
    """The whole session and every checkpoint, verified by the store's reads."""
    record = await store.get(session_id)
    checkpoints = _checkpoints(store)
    records: builtins.list[CheckpointRecord] = []
    if checkpoints is not None:
        for checkpoint_id in await checkpoint_names(checkpoints, session_id):
            try:
                records.append(await get_named_checkpoint(checkpoints, session_id, checkpoint_id))
            except CheckpointNotFoundError:
                continue  # deleted meanwhile
    return record, records


async def _exists(store: SessionStore, session_id: str) -> bool:
    try:
        await store.get(session_id, offset=2**62)  # the metadata, no message
    except SessionNotFoundError:
        return False
    return True


async def _verify(
    store: SessionStore,
    checkpoints: CheckpointStore | None,
    record: SessionRecord,
    records: builtins.list[CheckpointRecord],
    created: str,
) -> str | None:
    """What differs between the copy, read back, and what was read (None: nothing)."""
    session_id = record.meta.session_id
    copy = await store.get(session_id)
    if copy.meta.created_at != created:
        return "the creation time read back differs from the source's"
    if copy.messages != record.messages:
        return "the history read back differs from the source's"
    if copy.agent_state != record.agent_state:
        return "the agent state read back differs from the source's"
    for original in records:
        assert checkpoints is not None
        back = await checkpoints.get(session_id, original.meta.checkpoint_id)
        if (back.meta, back.messages, back.agent_state) != (
            original.meta,
            original.messages,
            original.agent_state,
        ):
            return f"checkpoint {original.meta.checkpoint_id} read back differs from the source's"
    return None
