"""The operations the front ends share: ``perdure`` commands and ``perdure serve`` routes.

Each is one async call over the library (a dormant :class:`~perdure.session.Session`,
the store, the checkpoint store), with no output and no click: the CLI prints what
they return, the server answers it as JSON. One implementation of each, so the two
faces cannot drift apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from perdure.checkpoints.export import ImportProgress
from perdure.checkpoints.store import (
    DamagedCheckpoint,
    ListsCheckpointIds,
    scan_checkpoints,
)
from perdure.errors import SessionCorruptedError, SessionNotFoundError
from perdure.session import (
    CheckpointMeta,
    HistoryPage,
    Session,
    SessionMeta,
    SessionStore,
    read_history_page,
)
from perdure.session.expiry import epoch_of
from perdure.session.results import RestoreResult
from perdure.session.session import verify_export


async def existing_session(store: SessionStore, session_id: str) -> Session:
    """A :class:`Session` for ``session_id``, which must exist.

    Only whether it exists is asked: a store that finds its history damaged (a
    truncated journal, a lost head or metadata file) has found the session, so a
    session whose history is damaged still reaches its checkpoints (to list, export
    or fork them); what needs the history itself (a restore, a new checkpoint) still
    refuses it, with the store's error.

    Raises:
        SessionNotFoundError: no such session.
        ValueError: ``session_id`` is not a valid session id.
    """
    with contextlib.suppress(SessionCorruptedError):  # damaged, but there
        await read_history_page(store, session_id, offset=0, limit=0)
    return Session(store, session_id)


async def session_checkpoints(session: Session) -> list[CheckpointMeta | DamagedCheckpoint]:
    """The session's checkpoints, oldest first, a damaged one marked rather than failing."""
    if session.checkpoints is None:
        return []
    return await scan_checkpoints(session.checkpoints, session.session_id)


async def list_checkpoints(
    store: SessionStore, session_id: str
) -> list[CheckpointMeta | DamagedCheckpoint]:
    """The checkpoints of ``session_id``, which must exist."""
    return await session_checkpoints(await existing_session(store, session_id))


def checkpoint_dict(item: CheckpointMeta | DamagedCheckpoint) -> dict[str, Any]:
    """A listed checkpoint as JSON: its fields and ``damaged`` (with the error if so)."""
    if isinstance(item, DamagedCheckpoint):
        return item.to_dict()
    return {**item.to_dict(), "damaged": False}


async def describe_session(
    store: SessionStore, session_id: str, *, verify_history: bool = True
) -> dict[str, Any]:
    """What ``sessions show`` tells: the metadata, a summary of the state, checkpoints.

    The agent state is summarised (key names and counts), never its values. With
    ``verify_history`` the whole history is read and checked against its hash chain
    (a damaged one raises :class:`~perdure.errors.SessionCorruptedError`); without,
    only the metadata and state are read, at a cost that does not grow with the
    history (the web page pages the history itself, verified page by page).
    """
    if verify_history:
        record = await store.get(session_id)
    else:
        total = (await read_history_page(store, session_id, offset=0, limit=0)).total
        record = await store.get(session_id, offset=total)
    checkpoints = await session_checkpoints(Session(store, session_id))
    return {
        **dataclasses.asdict(record.meta),
        "agent_state": state_summary(record.agent_state),
        "checkpoints": len(checkpoints),
        "damaged_checkpoints": sum(isinstance(c, DamagedCheckpoint) for c in checkpoints),
        "latest_checkpoint_id": checkpoints[-1].checkpoint_id if checkpoints else None,
    }


def expires_in(meta: SessionMeta, now: float | None = None) -> float | None:
    """Seconds before ``meta``'s session expires unless used (``None``: no ttl)."""
    if meta.expires_at is None:
        return None
    at = epoch_of(meta.expires_at)
    now = time.time() if now is None else now
    return None if at is None else round(max(at - now, 0.0), 3)


def session_dict(meta: SessionMeta, now: float | None = None) -> dict[str, Any]:
    """A listed session as JSON: ``SessionMeta``'s fields and ``expires_in``."""
    return {**dataclasses.asdict(meta), "expires_in": expires_in(meta, now)}


async def create_checkpoint(
    store: SessionStore, session_id: str, label: str | None
) -> CheckpointMeta:
    """Checkpoint the stored session now (a ``manual`` checkpoint, under its lock)."""
    return await (await existing_session(store, session_id)).checkpoint(label)


async def restore_checkpoint(
    store: SessionStore, session_id: str, checkpoint_id: str, *, checkpoint: bool = True
) -> RestoreResult:
    """Roll the session back to ``checkpoint_id``, a ``pre_restore`` checkpoint first."""
    session = await existing_session(store, session_id)
    return await session.restore(checkpoint_id, checkpoint=checkpoint)


async def delete_checkpoint(store: SessionStore, session_id: str, checkpoint_id: str) -> bool:
    """Delete a checkpoint; whether it existed (a damaged one is deletable too)."""
    session = await existing_session(store, session_id)
    checkpoints = session.checkpoints
    if checkpoints is None:
        return False
    # By id, never by reading it: a damaged checkpoint must be deletable.
    if isinstance(checkpoints, ListsCheckpointIds):
        existed = checkpoint_id in await checkpoints.checkpoint_ids(session_id)
    else:
        existed = any(m.checkpoint_id == checkpoint_id for m in await checkpoints.list(session_id))
    await session.delete_checkpoint(checkpoint_id)
    return existed


async def export_checkpoint(
    store: SessionStore, session_id: str, checkpoint_id: str, key: bytes | None = None
) -> bytes:
    """The checkpoint as a self-contained, verifiable export (signed with ``key``)."""
    session = await existing_session(store, session_id)
    return await session.export_checkpoint(checkpoint_id, signing_key=key)


async def import_checkpoint(
    store: SessionStore,
    session_id: str,
    data: bytes,
    create_session: bool,
    key: bytes | None = None,
    progress: ImportProgress | None = None,
) -> CheckpointMeta:
    """Add an exported checkpoint to the session, verified in full before anything is written.

    With ``create_session`` a missing session is created, after the export verified.
    ``progress(done, total)`` follows the checks; the write comes after its last call.
    """
    try:
        session = await existing_session(store, session_id)
    except SessionNotFoundError:
        if not create_session:
            raise
        # Verified before anything is created, and only once.
        imported = await verify_export(data, key, progress=progress)
        await store.create(session_id, exist_ok=True)
        return await Session(store, session_id).import_checkpoint(imported)
    return await session.import_checkpoint(data, verify_key=key, progress=progress)


async def fork_checkpoint(store: SessionStore, session_id: str, checkpoint_id: str) -> str:
    """Start a new session from a checkpoint; the new session's id."""
    return await (await existing_session(store, session_id)).fork(checkpoint_id)


async def read_history(
    store: SessionStore, session_id: str, offset: int, limit: int, read_all: bool = False
) -> HistoryPage:
    """One page, or (``read_all``) every page from ``offset`` joined into one."""
    page = await read_history_page(store, session_id, offset=offset, limit=limit)
    if not read_all:
        return page
    messages = list(page.messages)
    position = page.next_offset
    while position < page.total:
        more = await read_history_page(store, session_id, offset=position, limit=limit)
        # Pages align on tool pairs, so a later page may start before ``position``.
        messages.extend(more.messages[position - more.offset :])
        position = more.next_offset
    return HistoryPage(messages, page.offset, position, page.total)


async def message_count(store: SessionStore, session_id: str) -> int | None:
    """The session's message count; ``None`` when it does not exist, -1 when damaged."""
    try:
        page = await read_history_page(store, session_id, offset=0, limit=0)
    except SessionNotFoundError:
        return None
    except SessionCorruptedError:
        return -1
    return page.total


def state_summary(agent_state: dict[str, Any]) -> dict[str, Any]:
    """What is told of a stored agent state: names and counts, never values."""
    state = agent_state.get("state")
    internal = agent_state.get("internal_state")
    interrupts = internal.get("interrupt_state") if isinstance(internal, dict) else None
    pending = interrupts.get("interrupts") if isinstance(interrupts, dict) else None
    manager = agent_state.get("conversation_manager_state")
    manager = manager if isinstance(manager, dict) else {}
    return {
        "agent_id": agent_state.get("agent_id"),
        "state_keys": sorted(map(str, state)) if isinstance(state, dict) else [],
        "conversation_manager": manager.get("__name__"),
        "removed_message_count": manager.get("removed_message_count", 0),
        "interrupts": len(pending) if isinstance(pending, dict) else 0,
    }
