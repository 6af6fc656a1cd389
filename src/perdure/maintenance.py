"""Store maintenance: verify every session, repair file journals, expire and prune (SPEC §7, §9).

The ``perdure verify``, ``repair`` and ``gc`` commands are thin faces over these
coroutines; scripts and servers call them directly::

    report = await verify_store(store)               # reads everything, changes nothing
    report = await repair_store("./data")            # dry run: what quarantine would move
    report = await repair_store("./data", dry_run=False)
    report = await gc_store(store, ttl_seconds=30 * 86400, keep_checkpoints=5)  # dry run
    report = await gc_store(store, max_checkpoint_age=7 * 86400, dry_run=False)
    report = await gc_checkpoints(postgres_checkpoints, max_checkpoint_age=90 * 86400)

Guarantees:

- :func:`verify_store` only reads, through the store's own verifying ``get`` (the
  hash chain, every segment, attachments, the agent state) and every checkpoint's
  ``get`` (its sha256). It never stops at the first damage: each damaged session and
  checkpoint is reported with the kind of damage and where it is (file and byte
  offset, or row); a damaged checkpoint hides none of the others. An encrypted
  store (SPEC §9) verifies without its keys: every hash covers the ciphertext and
  is checked before anything is decrypted, so a ``DecryptionError`` from a read
  without the key means the bytes matched their hashes.
- :func:`repair_store` in dry run (the default) writes nothing to the store: it
  runs the store's own quarantine on a scratch copy of each damaged session, so what
  it reports is exactly what ``dry_run=False`` would move. Applied, it reads each
  damaged session through a ``FileSessionStore(recovery="quarantine")``, which moves
  provably bad records out under the session's writer lock and rewrites the rest
  atomically (a crash leaves the old or the healed journal, never half of one).
  A damaged checkpoint file is moved, under the same lock, to
  ``<quarantine_dir>/<session_id>/checkpoints/`` (written there durably before it
  is unlinked: a crash leaves it in both places, never in none); one written by
  perdure 0.1 without a hash is sealed in place instead, its content unchanged.
  Records already gone from the files (lines deleted by hand) are reported as gaps
  (``missing_record``), never blamed on the intact record after them, which is kept:
  the repaired history is what remains, in order, with the gap closed.
- :func:`gc_store` in dry run (the default) deletes nothing. Applied, each deletion
  is the store's own ``delete`` (a session with its checkpoints, atomically and
  idempotently); a session whose writer lock is held elsewhere is skipped, not
  waited for. Pruning keeps the newest readable checkpoints: a damaged one never
  counts as kept; one older than every kept checkpoint is deleted with the others,
  a newer one is left for ``repair`` and reported.

Reports are frozen dataclasses of plain values; ``to_dict()`` gives JSON-ready data.
None of them holds message content: kinds, positions, counts and ids only.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as _dt
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from perdure._runtime.fs import atomic_write, fsync_dir
from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    ListsCheckpointIds,
    ListsCheckpointSessions,
    checkpoint_names,
    get_named_checkpoint,
    scan_checkpoints,
    seal_checkpoint_bytes,
    stored_meta,
)
from perdure.errors import (
    CheckpointNotFoundError,
    DecryptionError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.session.ids import validate_session_id
from perdure.session.rules import check_max_checkpoint_age, evicted_checkpoints
from perdure.session.store import SessionMeta, SessionStore, SupportsExpiry
from perdure.session.ulid import is_ulid, ulid_timestamp_ms
from perdure.stores.file.store import FileSessionStore, SessionRecoveryReport, StoreLeftovers
from perdure.stores.sqlite import SQLiteSessionStore

__all__ = [
    "CheckpointRepair",
    "Damage",
    "ExpiredSession",
    "GcReport",
    "ProgressCallback",
    "PrunedCheckpoint",
    "RepairReport",
    "SessionRepair",
    "SkippedSession",
    "VerifyReport",
    "gc_checkpoints",
    "gc_store",
    "parse_duration",
    "repair_store",
    "verify_store",
]

PAGE_SIZE = 500
"""Sessions per ``store.list`` page while walking a store."""

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` after each session is verified."""


# ----------------------------------------------------------------------------- reports


@dataclass(frozen=True)
class Damage:
    """One damaged thing found by :func:`verify_store`: where it is and what is wrong.

    Attributes:
        session_id: the damaged session, or ``None`` when the store as a whole is
            unreadable (a damaged SQLite file, say).
        kind: the kind of damage as the store names it (``bad_hash``, ``bad_line``,
            ``bad_payload``, ``bad_sequence``, ``missing_record`` (records gone
            before an intact one), ``broken_chain``, ``bad_state``,
            ``bad_checkpoint``, ``unsealed_checkpoint`` (written by perdure 0.1
            without a sha256, so it cannot be checked), ``bad_database``,
            ``truncated``: a journal ending before the end its head file records,
            ``bad_id``: stored under an id this version refuses), or
            ``unreadable`` for an I/O error.
        detail: the store's one-line description (never message content).
        file: the damaged file (file stores) or database file, when known.
        offset: the byte offset of the damage in ``file`` (file stores).
        row: the damaged message row (SQLite stores).
        checkpoint_id: set when the damage is in one of the session's checkpoints.
    """

    session_id: str | None
    kind: str
    detail: str
    file: str | None = None
    offset: int | None = None
    row: int | None = None
    checkpoint_id: str | None = None

    @property
    def position(self) -> str:
        """Where the damage is, for people: ``journal.jsonl byte 812``, ``row 3``, …"""
        if self.checkpoint_id is not None:
            return f"checkpoint {self.checkpoint_id}"
        if self.row is not None:
            return f"row {self.row}"
        if self.file is None:
            return "-"
        where = Path(self.file)
        name = f"segments/{where.name}" if where.parent.name == "segments" else where.name
        return name if self.offset is None else f"{name} byte {self.offset}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, plus ``position``."""
        return {**asdict(self), "position": self.position}


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_store` found.

    Attributes:
        sessions_checked: sessions read in full.
        checkpoints_checked: checkpoints read in full.
        damage: every damaged session and checkpoint, in session id order.
        missing: session ids asked for that the store does not hold.
    """

    sessions_checked: int
    checkpoints_checked: int
    damage: tuple[Damage, ...]
    missing: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """True when nothing is damaged."""
        return not self.damage

    @property
    def damaged_sessions(self) -> tuple[str, ...]:
        """Ids of the sessions with any damage (journal or checkpoints), sorted."""
        return tuple(sorted({d.session_id for d in self.damage if d.session_id is not None}))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "clean": self.clean,
            "sessions_checked": self.sessions_checked,
            "checkpoints_checked": self.checkpoints_checked,
            "damaged_sessions": list(self.damaged_sessions),
            "damage": [d.to_dict() for d in self.damage],
            "missing": list(self.missing),
        }


RepairStatus = Literal["would_repair", "repaired", "unrepairable", "locked", "clean"]


@dataclass(frozen=True)
class SessionRepair:
    """What quarantine did (or would do) to one damaged session: counts and positions.

    Attributes:
        session_id: the session.
        status: ``would_repair`` (dry run), ``repaired``, ``unrepairable`` (the
            damage is not in records quarantine can prove bad: a manifest, an
            attachment), ``locked`` (another writer holds the session;
            try again later) or ``clean`` (healed meanwhile).
        damage: the damage :func:`verify_store` found first.
        quarantined: records moved (or that would be moved).
        positions: their line numbers, counted from 1 across the session's files in
            order (sealed segments, then the journal).
        kinds: the kind of each moved record (``bad_hash``, ``bad_line`` or
            ``unverifiable``: it follows missing records and nothing vouches for it).
        quarantine_path: the file the records were moved to (``None`` in a dry run,
            or when nothing was moved).
        detail: why the session was not repaired, for ``unrepairable`` and ``locked``;
            what was (or would be) done outside quarantine: a ``meta.json`` rebuilt
            from the journal, a truncated journal accepted with how many messages
            were lost.
        gaps: ``(line, count)`` for each gap: ``count`` records were already
            missing from the files just before that line. They cannot come back;
            the records on both sides are kept (see :class:`SessionRecoveryReport`).
    """

    session_id: str
    status: RepairStatus
    damage: Damage
    quarantined: int = 0
    positions: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()
    quarantine_path: str | None = None
    detail: str | None = None
    gaps: tuple[tuple[int, int], ...] = ()

    @property
    def missing_records(self) -> int:
        """Records found missing, over every gap."""
        return sum(count for _, count in self.gaps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data; ``gaps`` as ``[{"line": …, "records": …}]``."""
        return {
            **asdict(self),
            "damage": self.damage.to_dict(),
            "positions": list(self.positions),
            "kinds": list(self.kinds),
            "gaps": [{"line": line, "records": count} for line, count in self.gaps],
            "missing_records": self.missing_records,
        }


CheckpointRepairStatus = Literal[
    "would_quarantine", "would_seal", "quarantined", "sealed", "locked", "clean"
]


@dataclass(frozen=True)
class CheckpointRepair:
    """What repair did (or would do) to one damaged checkpoint of a file store.

    Attributes:
        session_id: its session.
        checkpoint_id: the checkpoint.
        status: ``would_quarantine`` / ``quarantined`` (moved out of the store: its
            bytes do not match its sha256 or are no checkpoint), ``would_seal`` /
            ``sealed`` (written by perdure 0.1 without a hash: sealed in place,
            content unchanged), ``locked`` (another writer holds the session; try
            again later) or ``clean`` (readable, or gone, by the time it was fixed).
        damage: the damage :func:`verify_store` found.
        quarantine_path: where the file was moved (``None`` unless quarantined).
        detail: why it was not repaired, for ``locked``.
    """

    session_id: str
    checkpoint_id: str
    status: CheckpointRepairStatus
    damage: Damage
    quarantine_path: str | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {**asdict(self), "damage": self.damage.to_dict()}


@dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_store` found and did.

    Attributes:
        dry_run: nothing was written.
        store: the store's directory.
        quarantine_dir: where quarantined records go (one directory per session).
        sessions_checked: sessions verified.
        sessions: one entry per session with damage in its journal.
        remaining: every damage left in the store after this run: what repair
            does not handle (an unreadable file or store: delete or restore those by
            hand), and the damage of each session in ``sessions`` and each checkpoint
            in ``checkpoints`` that was not repaired (a dry run repairs none). Empty
            exactly when ``clean``.
        checkpoints: one entry per damaged checkpoint (quarantined or sealed).
        missing: session ids asked for that the store does not hold.
        moved_files: store-level files moved to quarantine (or that would be, in a
            dry run): a damaged SQLite WAL set aside when it was found.
    """

    dry_run: bool
    store: str
    quarantine_dir: str
    sessions_checked: int
    sessions: tuple[SessionRepair, ...]
    remaining: tuple[Damage, ...] = ()
    checkpoints: tuple[CheckpointRepair, ...] = ()
    missing: tuple[str, ...] = ()
    moved_files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # ``remaining`` and ``clean`` must never disagree, whoever builds the report:
        # a session or checkpoint that was not repaired leaves its damage behind.
        left = [*self.remaining]
        left.extend(
            s.damage
            for s in self.sessions
            if s.status not in ("repaired", "clean") and s.damage not in left
        )
        left.extend(
            c.damage
            for c in self.checkpoints
            if c.status not in ("quarantined", "sealed", "clean") and c.damage not in left
        )
        left.sort(key=lambda d: (d.session_id or "", d.checkpoint_id or ""))
        object.__setattr__(self, "remaining", tuple(left))

    @property
    def quarantined(self) -> int:
        """Records moved (or that would be moved), over every session."""
        return sum(s.quarantined for s in self.sessions)

    @property
    def missing_records(self) -> int:
        """Records found missing from journals, over every session."""
        return sum(s.missing_records for s in self.sessions)

    @property
    def clean(self) -> bool:
        """True when no damage is left in the store after this run."""
        return not self.remaining

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "dry_run": self.dry_run,
            "store": self.store,
            "quarantine_dir": self.quarantine_dir,
            "sessions_checked": self.sessions_checked,
            "quarantined": self.quarantined,
            "missing_records": self.missing_records,
            "clean": self.clean,
            "sessions": [s.to_dict() for s in self.sessions],
            "checkpoints": [c.to_dict() for c in self.checkpoints],
            "remaining": [d.to_dict() for d in self.remaining],
            "missing": list(self.missing),
            "moved_files": list(self.moved_files),
        }


@dataclass(frozen=True)
class ExpiredSession:
    """A session :func:`gc_store` deleted (or would delete): inactive past the TTL.

    ``updated_at`` is its last update (``ttl_seconds``), or its last use when the
    store's own ``ttl`` expired it. ``checkpoints`` counts the checkpoints deleted
    with it (``ttl_seconds`` deletes a session with its checkpoints, damaged ones
    included; the store's own ``ttl`` keeps them: ``0``).
    """

    session_id: str
    updated_at: str
    idle_seconds: float
    message_count: int
    checkpoints: int = 0


@dataclass(frozen=True)
class PrunedCheckpoint:
    """A checkpoint :func:`gc_store` deleted (or would delete): older than the newest N,
    or than the age limit.

    A damaged one has ``damaged`` set, ``trigger`` ``"unknown"`` and the time its
    id was made as ``created_at``.
    """

    session_id: str
    checkpoint_id: str
    trigger: str
    created_at: str
    damaged: bool = False


@dataclass(frozen=True)
class SkippedSession:
    """A session (or one of its checkpoints) :func:`gc_store` left alone; ``code`` says why."""

    session_id: str | None
    code: str
    detail: str
    checkpoint_id: str | None = None


@dataclass(frozen=True)
class GcReport:
    """What :func:`gc_store` deleted, or would delete in a dry run.

    Attributes:
        dry_run: nothing was deleted.
        now: the time inactivity was measured against (ISO-8601 UTC).
        ttl_seconds: the TTL applied (``None``: sessions were not expired).
        keep_checkpoints: checkpoints kept per session (``None``: none pruned).
        max_checkpoint_age: seconds; older checkpoints were pruned (``None``: none
            pruned by age).
        sessions_checked: sessions looked at.
        expired: sessions inactive for longer than the TTL, each with the number of
            checkpoints deleted with it.
        pruned: checkpoints beyond the newest ``keep_checkpoints`` of a session.
        skipped: sessions left alone (locked by a writer, damaged metadata).
        temp_files: temp files of writes a kill interrupted (file stores: a seal's
            ``.manifest.json.<hex>.tmp``, …), removed under the session's writer lock.
        orphans: sessions a fork killed halfway left without their history (file
            stores: created provisionally, never committed), deleted likewise.
    """

    dry_run: bool
    now: str
    ttl_seconds: float | None
    keep_checkpoints: int | None
    sessions_checked: int
    expired: tuple[ExpiredSession, ...]
    pruned: tuple[PrunedCheckpoint, ...]
    skipped: tuple[SkippedSession, ...] = ()
    temp_files: tuple[str, ...] = ()
    orphans: tuple[str, ...] = ()
    max_checkpoint_age: float | None = None

    @property
    def checkpoints_deleted(self) -> int:
        """Every checkpoint deleted (or that would be): those pruned, and those
        deleted with an expired session."""
        return len(self.pruned) + sum(e.checkpoints for e in self.expired)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "dry_run": self.dry_run,
            "now": self.now,
            "ttl_seconds": self.ttl_seconds,
            "keep_checkpoints": self.keep_checkpoints,
            "max_checkpoint_age": self.max_checkpoint_age,
            "sessions_checked": self.sessions_checked,
            "checkpoints_deleted": self.checkpoints_deleted,
            "expired": [asdict(e) for e in self.expired],
            "pruned": [asdict(p) for p in self.pruned],
            "skipped": [asdict(s) for s in self.skipped],
            "temp_files": list(self.temp_files),
            "orphans": list(self.orphans),
        }


# ----------------------------------------------------------------------------- durations

_DURATION = re.compile(r"([0-9]+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``3600s``, ``90m``, ``12h``, ``30d`` or ``2w``.

    Strict: one whole number greater than zero, then one unit; no spaces, sign or
    fraction.

    Raises:
        ValueError: ``text`` is not such a duration (the message shows the forms).
    """
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"{text!r} is not a duration; use a whole number > 0 and a unit: "
            "3600s, 90m, 12h, 30d or 2w"
        )
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


# ----------------------------------------------------------------------------- verify


async def verify_store(
    store: SessionStore,
    *,
    session_ids: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
) -> VerifyReport:
    """Read every session (or those named) and its checkpoints in full; report all damage.

    Sessions are found through ``store.list`` pages; each is read with
    ``store.get`` (which verifies the hash chain) and each of its checkpoints with
    ``store.checkpoints.get`` when the store keeps checkpoints. Nothing is written.
    A session whose metadata is too damaged to list is reported and the walk goes on.

    Args:
        store: the store to verify. A ``FileSessionStore`` must be strict: one opened
            with ``recovery="quarantine"`` would heal what it reads.
        session_ids: verify only these sessions (absent ones are reported in
            ``missing``); ``None`` walks the whole store.
        progress: called as ``progress(done, total)`` after each session.

    Raises:
        ValueError: ``store`` heals on read, or a session id is malformed.
    """
    if getattr(store, "recovery", "strict") != "strict":
        raise ValueError(
            "store must be opened with recovery='strict' to be verified "
            "(a quarantine store changes what it reads); use repair_store to heal"
        )
    damage: list[Damage] = []
    if session_ids is None:
        metas, listing_damage = await _walk(store)
        ids = [m.session_id for m in metas]
        damage.extend(listing_damage)
        explicit = False
        # A session too damaged to list is a session checked (and found damaged).
        listed_damaged = {d.session_id for d in listing_damage if d.session_id is not None}
    else:
        ids = [validate_session_id(s, "session_ids") for s in dict.fromkeys(session_ids)]
        explicit = True
        listed_damaged = set()
    checkpoints = _checkpoint_store(store)
    missing: list[str] = []
    sessions_checked = len(listed_damaged - set(ids)) if not explicit else 0
    checkpoints_checked = 0
    for done, session_id in enumerate(ids, start=1):
        try:
            await store.get(session_id)
        except ValueError as exc:  # listed under an id this version refuses
            damage.append(Damage(session_id, "bad_id", str(exc)))
            sessions_checked += 1
            if progress is not None:
                progress(done, len(ids))
            continue
        except SessionNotFoundError:
            if explicit:
                missing.append(session_id)
            # else: deleted since it was listed
            if progress is not None:
                progress(done, len(ids))
            continue
        except SessionCorruptedError as exc:
            damage.append(_damage(exc, session_id))
        except DecryptionError:
            pass  # encrypted, read without its key: raised only once the hashes held
        except OSError as exc:
            damage.append(Damage(session_id, "unreadable", str(exc)))
        sessions_checked += 1
        if checkpoints is not None:
            found, count = await _verify_checkpoints(store, checkpoints, session_id)
            damage.extend(found)
            checkpoints_checked += count
        if progress is not None:
            progress(done, len(ids))
    damage.sort(key=lambda d: (d.session_id or "", d.checkpoint_id or ""))
    return VerifyReport(sessions_checked, checkpoints_checked, tuple(damage), tuple(missing))


async def _walk(store: SessionStore) -> tuple[list[SessionMeta], list[Damage]]:
    """Every session's metadata, page by page, stepping over sessions too damaged to list.

    A page that fails names the damaged session in the error's details; the walk
    then goes one session at a time up to it, reports it, and carries on after it.
    Damage that names no session (an unreadable store) ends the walk.
    """
    metas: list[SessionMeta] = []
    damage: list[Damage] = []
    cursor: str | None = None
    culprit: str | None = None  # while set, list one session at a time up to it
    while True:
        step = 1 if culprit is not None else PAGE_SIZE
        try:
            page = await store.list(limit=step, after=cursor)
        except SessionCorruptedError as exc:
            bad = exc.details.get("session_id")
            if not isinstance(bad, str) or (cursor is not None and bad <= cursor):
                damage.append(_damage(exc, None))
                break
            if step > 1:
                culprit = bad
                continue
            damage.append(_damage(exc, bad))
            cursor = bad
            if culprit is not None and bad >= culprit:
                culprit = None
            continue
        metas.extend(page)
        if page:
            cursor = page[-1].session_id
            if culprit is not None and cursor >= culprit:
                culprit = None
        if len(page) < step:
            break
    return metas, damage


def _checkpoint_store(store: SessionStore) -> CheckpointStore | None:
    found = getattr(store, "checkpoints", None)
    return found if isinstance(found, CheckpointStore) else None


async def _verify_checkpoints(
    store: SessionStore, checkpoints: CheckpointStore, session_id: str
) -> tuple[list[Damage], int]:
    """Read each of a session's checkpoints; the damage found and how many were read."""
    damage: list[Damage] = []
    try:
        # Named without being read (a list may stop at the first damaged one), then
        # each read once.
        ids = await checkpoint_names(checkpoints, session_id)
    except SessionCorruptedError as exc:  # not even the ids can be read
        return [_damage(exc, session_id, checkpoint=True)], 0
    except OSError as exc:
        return [Damage(session_id, "unreadable", str(exc))], 0
    checked = 0
    for checkpoint_id in ids:
        try:
            await get_named_checkpoint(checkpoints, session_id, checkpoint_id)
        except CheckpointNotFoundError:
            continue  # deleted since it was listed
        except SessionCorruptedError as exc:
            damage.append(_damage(exc, session_id, checkpoint_id=checkpoint_id))
        except DecryptionError:
            pass  # encrypted, read without its key: its sha256 held
        except OSError as exc:
            damage.append(Damage(session_id, "unreadable", str(exc), checkpoint_id=checkpoint_id))
        checked += 1
    return damage, checked


def _damage(
    exc: SessionCorruptedError,
    session_id: str | None,
    *,
    checkpoint_id: str | None = None,
    checkpoint: bool = False,
) -> Damage:
    """A :class:`Damage` from the facts a store put in the error's ``details``."""
    details = exc.details

    def text(key: str) -> str | None:
        value = details.get(key)
        return value if isinstance(value, str) else None

    def number(key: str) -> int | None:
        value = details.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    checkpoint_id = text("checkpoint_id") or checkpoint_id
    kind = text("kind")
    if checkpoint_id is not None or checkpoint:
        kind = "bad_checkpoint" if kind in (None, "bad_payload") else kind
    return Damage(
        session_id=text("session_id") or session_id,
        kind=kind or "damaged",
        detail=exc.message,
        file=text("file"),
        offset=number("offset"),
        row=number("row"),
        checkpoint_id=checkpoint_id,
    )


# ----------------------------------------------------------------------------- repair


async def repair_store(
    store: FileSessionStore | SQLiteSessionStore | str | os.PathLike[str],
    *,
    dry_run: bool = True,
    quarantine_dir: str | os.PathLike[str] | None = None,
    session_ids: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
) -> RepairReport:
    """Heal a file store's damaged journals by quarantine, or (dry run) say what would move.

    Finds damaged sessions with :func:`verify_store`. In a dry run each one is healed
    on a scratch copy outside the store, by the store's own quarantine, and the
    report says which records that moved; the store is not written. Otherwise each
    is read through ``FileSessionStore(recovery="quarantine")``: provably bad
    records (altered bytes, lines that are no record) go to
    ``<quarantine_dir>/<session_id>/``, the rest is rewritten atomically, and the
    session reads cleanly again. Damage quarantine cannot pin on single records is
    reported, never guessed at. A damaged checkpoint file moves to
    ``<quarantine_dir>/<session_id>/checkpoints/``; one written by perdure 0.1,
    which has no sha256, is sealed in place (``RepairReport.checkpoints``).

    A :class:`SQLiteSessionStore` is repaired in place by
    :meth:`SQLiteSessionStore.quarantine`: each damaged session keeps its
    verifiable prefix of rows, the rows from the first bad one go to
    ``<quarantine_dir>/<session_id>/`` (a dry run writes nothing), and a damaged
    WAL set aside when it was found moves to ``quarantine_dir`` first.

    Args:
        store: a :class:`FileSessionStore` or its directory, or a
            :class:`SQLiteSessionStore`.
        dry_run: report without writing (the default).
        quarantine_dir: where moved records go (default: the store's,
            ``<dir>/.session-recovery-quarantine``).
        session_ids: repair only these sessions; ``None`` for the whole store.
        progress: called as ``progress(done, total)`` as sessions are verified.

    Raises:
        TypeError: ``store`` is neither a file store nor a SQLite store.
        ValueError: the directory does not exist, or a session id is malformed.
    """
    if isinstance(store, SQLiteSessionStore):
        return await _repair_sqlite(store, dry_run, quarantine_dir, session_ids, progress)
    if isinstance(store, str | os.PathLike):
        root = Path(store)
        strict = FileSessionStore(root)
    elif isinstance(store, FileSessionStore):
        root = store.root
        strict = (
            store if store.recovery == "strict" else FileSessionStore(root, cipher=store.cipher)
        )
    else:
        raise TypeError(
            f"repair works on file and SQLite stores only (quarantine moves records), "
            f"got {type(store).__name__}"
        )
    if not root.is_dir():
        raise ValueError(f"store directory {root} does not exist")
    qdir = Path(quarantine_dir) if quarantine_dir is not None else strict.quarantine_dir
    verified = await verify_store(strict, session_ids=session_ids, progress=progress)
    journal_damage = [d for d in verified.damage if d.checkpoint_id is None and d.session_id]
    checkpoint_damage = [
        d
        for d in verified.damage
        if d.checkpoint_id is not None and d.session_id and d.kind in _FIXABLE_CHECKPOINT
    ]
    remaining = [d for d in verified.damage if d not in journal_damage + checkpoint_damage]
    reports: list[SessionRecoveryReport] = []
    healer = FileSessionStore(
        root,
        durability=strict.durability,
        recovery="quarantine",
        on_recovery=reports.append,
        quarantine_dir=qdir,
        cipher=strict.cipher,  # an encrypted store heals with its key
    )
    repairs: list[SessionRepair] = []
    checkpoint_repairs: list[CheckpointRepair] = []
    try:
        for found in journal_damage:
            assert found.session_id is not None
            if dry_run:
                repairs.append(await _plan(strict, found))
            else:
                repairs.append(await _heal(healer, found, reports))
        for found in checkpoint_damage:
            checkpoint_repairs.append(await _fix_checkpoint(strict, found, qdir, dry_run))
    finally:
        healer.close()
        if strict is not store:
            strict.close()
    return RepairReport(
        dry_run=dry_run,
        store=str(root),
        quarantine_dir=str(qdir),
        sessions_checked=verified.sessions_checked,
        sessions=tuple(repairs),
        remaining=tuple(remaining),
        checkpoints=tuple(checkpoint_repairs),
        missing=verified.missing,
    )


_FIXABLE_CHECKPOINT = frozenset({"bad_checkpoint", "unsealed_checkpoint"})


async def _fix_checkpoint(
    store: FileSessionStore, found: Damage, qdir: Path, dry_run: bool
) -> CheckpointRepair:
    """Quarantine a damaged checkpoint file, or seal an unsealed one (dry run: say which)."""
    session_id, checkpoint_id = found.session_id, found.checkpoint_id
    assert session_id is not None
    assert checkpoint_id is not None
    path = store.checkpoints.checkpoint_path(session_id, checkpoint_id)

    def result(status: CheckpointRepairStatus, **extra: Any) -> CheckpointRepair:
        return CheckpointRepair(session_id, checkpoint_id, status, found, **extra)

    if dry_run:
        data = await asyncio.to_thread(_read_if_damaged, path, session_id, checkpoint_id)
        if data is None:
            return result("clean")
        sealed = _sealed_or_none(data, session_id, checkpoint_id)
        return result("would_quarantine" if sealed is None else "would_seal")
    try:
        # Under the writer lock, like every session write: a restore or fork that
        # is reading this checkpoint right now finishes first.
        async with store.writer_lock(session_id):
            done = await asyncio.to_thread(
                _quarantine_or_seal, path, qdir / session_id / "checkpoints", session_id
            )
    except SessionLockedError as exc:
        return result("locked", detail=exc.message)
    if done is None:
        return result("clean")
    if isinstance(done, Path):
        return result("quarantined", quarantine_path=str(done))
    return result("sealed")


def _read_if_damaged(path: Path, session_id: str, checkpoint_id: str) -> bytes | None:
    """The checkpoint file's bytes, or ``None`` if it is gone or reads cleanly now."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        meta = CheckpointRecord.from_json_bytes(data).meta
    except DecryptionError:  # encrypted: its sha256 and meta are checked without the key
        try:
            meta = stored_meta(data)
        except ValueError:
            return data
    except ValueError:
        return data
    intact = (meta.session_id, meta.checkpoint_id) == (session_id, checkpoint_id)
    return None if intact else data


def _sealed_or_none(data: bytes, session_id: str, checkpoint_id: str) -> bytes | None:
    """``data`` sealed, when it is an intact unsealed record of this checkpoint."""
    try:
        sealed = seal_checkpoint_bytes(data)
    except (ValueError, DecryptionError):  # damaged, or encrypted: nothing to seal
        return None
    meta = CheckpointRecord.from_json_bytes(sealed).meta
    return sealed if (meta.session_id, meta.checkpoint_id) == (session_id, checkpoint_id) else None


def _quarantine_or_seal(path: Path, qdir: Path, session_id: str) -> Path | bool | None:
    """Seal the file in place (``True``), move it to ``qdir`` (its new path), or ``None``.

    The quarantine copy is written durably before the original is unlinked: a crash
    in between leaves the checkpoint in both places, never in none.
    """
    checkpoint_id = path.stem
    data = _read_if_damaged(path, session_id, checkpoint_id)
    if data is None:
        return None
    sealed = _sealed_or_none(data, session_id, checkpoint_id)
    if sealed is not None:
        atomic_write(path, sealed)
        return True
    qdir.mkdir(parents=True, exist_ok=True)
    target = qdir / path.name
    if target.exists():  # quarantined before under this id (a crash, or a second damage)
        target = qdir / f"{checkpoint_id}.{os.urandom(4).hex()}.json"
    atomic_write(target, data)
    path.unlink(missing_ok=True)  # a delete_checkpoint (which takes no lock) may have won
    fsync_dir(path.parent)
    return target


async def _repair_sqlite(
    store: SQLiteSessionStore,
    dry_run: bool,
    quarantine_dir: str | os.PathLike[str] | None,
    session_ids: Sequence[str] | None,
    progress: ProgressCallback | None = None,
) -> RepairReport:
    """:func:`repair_store` for a SQLite store: rows and a damaged WAL, in place."""
    if not store.path.is_file():
        raise ValueError(f"SQLite database {store.path} does not exist")
    qdir = (
        Path(quarantine_dir)
        if quarantine_dir is not None
        else store.path.parent / ".session-recovery-quarantine"
    )
    moved_files: list[str] = []
    verified = await verify_store(store, session_ids=session_ids, progress=progress)
    if any(d.kind == "bad_wal" and d.session_id is None for d in verified.damage):
        if dry_run:
            moved_files.append(str(store.damaged_wal_path))
        else:
            moved = await asyncio.to_thread(store.release_damaged_wal, qdir)
            if moved is not None:
                moved_files.append(str(moved))
            verified = await verify_store(store, session_ids=session_ids)
    row_damage: dict[str, Damage] = {}
    for found in verified.damage:
        if found.session_id is not None and found.checkpoint_id is None:
            row_damage.setdefault(found.session_id, found)
    repairs: list[SessionRepair] = []
    for session_id, found in row_damage.items():
        try:
            report = await store.quarantine(session_id, qdir, dry_run=dry_run)
        except SessionLockedError as exc:
            repairs.append(SessionRepair(session_id, "locked", found, detail=exc.message))
            continue
        except (SessionCorruptedError, SessionNotFoundError) as exc:
            repairs.append(_repair(session_id, "unrepairable", found, [], detail=exc.message))
            continue
        if report is None:
            detail = "the damage is not in rows quarantine can move"
            repairs.append(_repair(session_id, "unrepairable", found, [], detail=detail))
        elif dry_run:
            repairs.append(_repair(session_id, "would_repair", found, [report], plan=True))
        else:
            repairs.append(_repair(session_id, "repaired", found, [report]))
    handled = set(row_damage)
    remaining = [
        d for d in verified.damage if not (d.session_id in handled and d.checkpoint_id is None)
    ]
    repaired = [r.session_id for r in repairs if r.status == "repaired"]
    if repaired:
        # Rows moved, yet the database may still be damaged below them (a B-tree
        # page SQLite cannot read): what a second look finds is left to report.
        again = await verify_store(store, session_ids=repaired)
        remaining.extend(d for d in again.damage if d.checkpoint_id is None)
    return RepairReport(
        dry_run=dry_run,
        store=str(store.path),
        quarantine_dir=str(qdir),
        sessions_checked=verified.sessions_checked,
        sessions=tuple(repairs),
        remaining=tuple(remaining),
        missing=verified.missing,
        moved_files=tuple(moved_files),
    )


async def _heal(
    healer: FileSessionStore, found: Damage, reports: list[SessionRecoveryReport]
) -> SessionRepair:
    session_id = found.session_id
    assert session_id is not None
    reports.clear()
    try:
        detail = await _fix_outside_records(healer, found, plan=False)
        await healer.get(session_id)
    except SessionLockedError as exc:
        return SessionRepair(session_id, "locked", found, detail=exc.message)
    except (SessionCorruptedError, SessionNotFoundError) as exc:
        return _repair(session_id, "unrepairable", found, reports, detail=exc.message)
    status: RepairStatus = "repaired" if reports or detail else "clean"
    return _repair(session_id, status, found, reports, detail=detail)


async def _fix_outside_records(store: FileSessionStore, found: Damage, *, plan: bool) -> str | None:
    """Repair what lies outside the journal's records; say what was (would be) done.

    A lost or unreadable ``meta.json`` is rebuilt from the journal's first record. A
    journal that ends before its head (``truncated``), or whose head file is lost,
    and is otherwise intact is accepted as it is: the lost records cannot come back,
    and the report says how many messages were lost. Quarantine handles the rest.
    """
    session_id = found.session_id
    assert session_id is not None
    if _is_meta_damage(found) and await store.rebuild_meta(session_id):
        return (
            "meta.json would be rebuilt from the journal's first record"
            if plan
            else "meta.json rebuilt from the journal's first record"
        )
    if found.kind == "truncated" or (found.file is not None and Path(found.file).name == "head"):
        accepted = await store.accept_journal_end(session_id)
        if accepted is not None:
            recorded, held = accepted
            verb = "would accept" if plan else "accepted"
            if recorded is None:
                return f"{verb} the journal as it ends ({held} messages): its head file was lost"
            return (
                f"{verb} the journal as it ends: {held} messages; its head recorded "
                f"{recorded}, so {max(recorded - held, 0)} acknowledged messages are lost"
            )
    return None


def _is_meta_damage(found: Damage) -> bool:
    """Damage in a session's ``meta.json`` (missing or unreadable): rebuilt, not quarantined."""
    return found.file is not None and Path(found.file).name == "meta.json"


async def _plan(strict: FileSessionStore, found: Damage) -> SessionRepair:
    """Run the store's quarantine on a scratch copy of the session: what would move."""
    session_id = found.session_id
    assert session_id is not None
    reports: list[SessionRecoveryReport] = []
    with tempfile.TemporaryDirectory(prefix="perdure-repair-") as scratch:
        copy_root = Path(scratch) / "store"
        source = strict.session_dir(session_id)

        def skip_checkpoints(directory: str, names: builtins.list[str]) -> builtins.list[str]:
            # Quarantine reads journals and attachments, never the session's checkpoints.
            return ["checkpoints"] if Path(directory) == source else []

        try:
            await asyncio.to_thread(
                shutil.copytree,
                source,
                copy_root / "sessions" / session_id,
                symlinks=True,
                ignore=skip_checkpoints,
            )
        except (OSError, shutil.Error) as exc:
            # Gone meanwhile, or a file the OS will not read (no permission, a FIFO):
            # what --apply would leave alone, so the rehearsal says the same.
            return SessionRepair(session_id, "unrepairable", found, detail=_copy_failure(exc))
        rehearsal = FileSessionStore(
            copy_root,
            cipher=strict.cipher,
            durability="none",
            recovery="quarantine",
            on_recovery=reports.append,
            quarantine_dir=Path(scratch) / "quarantine",
        )
        try:
            detail = await _fix_outside_records(rehearsal, found, plan=True)
            await rehearsal.get(session_id)
        except (SessionCorruptedError, SessionNotFoundError) as exc:
            return _repair(session_id, "unrepairable", found, reports, detail=exc.message)
        finally:
            rehearsal.close()
    status: RepairStatus = "would_repair" if reports or detail else "clean"
    return _repair(session_id, status, found, reports, detail=detail, plan=True)


def _copy_failure(exc: BaseException) -> str:
    """What stopped a session's scratch copy, in one line (``shutil.Error`` lists files)."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        failures = exc.args[0]
        first = failures[0] if failures else None
        if isinstance(first, tuple) and len(first) == 3:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            return f"cannot read {first[0]}: {first[2]}{more}"
    return str(exc)


def _repair(
    session_id: str,
    status: RepairStatus,
    found: Damage,
    reports: Sequence[SessionRecoveryReport],
    *,
    detail: str | None = None,
    plan: bool = False,
) -> SessionRepair:
    mine = [r for r in reports if r.session_id == session_id]
    positions = tuple(p for r in mine for p in r.positions)
    rebuilt = sorted({name for r in mine for name in r.rebuilt})
    if rebuilt:
        verb = "would be rebuilt" if plan else "rebuilt"
        said = f"{', '.join(rebuilt)} {verb} from the verified records"
        detail = f"{detail}; {said}" if detail else said
    return SessionRepair(
        session_id,
        status,
        found,
        quarantined=sum(r.quarantined for r in mine),
        positions=positions,
        kinds=tuple(k for r in mine for k in r.kinds),
        quarantine_path=None if plan or not mine else mine[-1].quarantine_path,
        detail=detail,
        gaps=tuple(gap for r in mine for gap in r.gaps),
    )


# ----------------------------------------------------------------------------- gc


async def gc_store(
    store: SessionStore,
    *,
    ttl_seconds: float | None = None,
    keep_checkpoints: int | None = None,
    dry_run: bool = True,
    now: _dt.datetime | None = None,
    max_checkpoint_age: float | None = None,
    progress: ProgressCallback | None = None,
) -> GcReport:
    """Expire inactive sessions and prune old checkpoints (SPEC §9); a dry run by default.

    A store with its own ``ttl`` (file, SQLite, memory, PostgreSQL) deletes the
    messages and state of every session its ttl expired (measured on its own clock,
    not ``now``), keeping their tombstones and checkpoints (SPEC §9), and the
    tombstones whose time is over (:meth:`SupportsExpiry.collect_expired`); a
    Redis store expires by itself. Besides, a session whose ``updated_at`` is more
    than ``ttl_seconds`` before ``now`` is deleted with its checkpoints and its
    tombstone. Every other session keeps its newest ``keep_checkpoints``
    checkpoints, and loses those older than ``max_checkpoint_age`` — by default the
    age limit the store's checkpoints were opened with, so that what a store evicts
    on write, gc evicts from sessions nobody writes to any more (one rule:
    :func:`~perdure.session.rules.evicted_checkpoints`, ``now`` for the clock).
    Pruned checkpoints go whatever their trigger.
    What killed writers left is collected too: in a file store
    (:meth:`FileSessionStore.collect_leftovers`) temp files of interrupted writes and
    sessions a killed fork left without their history; in an SQLite store
    (:meth:`SQLiteSessionStore.collect_leftovers`) new databases a killed process
    never linked into place.

    Args:
        store: the store to clean.
        ttl_seconds: seconds of inactivity after which a session is deleted
            (``None``: only what the store's own ttl expired).
        keep_checkpoints: readable checkpoints to keep per session, newest first
            (``None``: keep all; ``0``: delete all, damaged ones too). A damaged
            checkpoint newer than the oldest kept one is kept and reported in
            ``skipped``; an older one is pruned (``PrunedCheckpoint.damaged``).
        dry_run: report what would be deleted, delete nothing (the default).
        now: the time to measure inactivity and ages against (aware; default: now).
        max_checkpoint_age: seconds; older checkpoints are pruned (``None``: the
            store's checkpoints' own ``max_checkpoint_age``, if any). A damaged
            checkpoint's age is read from its id.
        progress: called as ``progress(done, total)`` as sessions are examined.

    Raises:
        ValueError: no limit given nor configured on the store (no ttl, no
            checkpoint age), a limit is out of range, or ``now`` is naive.
    """
    max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
    if max_checkpoint_age is None:
        configured = getattr(_checkpoint_store(store), "max_checkpoint_age", None)
        max_checkpoint_age = check_max_checkpoint_age(configured)
    own_ttl = store.ttl if isinstance(store, SupportsExpiry) else None
    if (
        ttl_seconds is None
        and keep_checkpoints is None
        and max_checkpoint_age is None
        and own_ttl is None
    ):
        raise ValueError(
            "gc_store needs ttl_seconds, keep_checkpoints or max_checkpoint_age "
            "(or a store opened with a ttl or a max_checkpoint_age)"
        )
    if ttl_seconds is not None and (
        isinstance(ttl_seconds, bool)
        or not isinstance(ttl_seconds, int | float)
        or not ttl_seconds > 0
    ):
        raise ValueError(f"ttl_seconds must be a number > 0, got {ttl_seconds!r}")
    if keep_checkpoints is not None and (
        isinstance(keep_checkpoints, bool)
        or not isinstance(keep_checkpoints, int)
        or keep_checkpoints < 0
    ):
        raise ValueError(f"keep_checkpoints must be an int >= 0, got {keep_checkpoints!r}")
    if now is None:
        now = _dt.datetime.now(_dt.UTC)
    elif not isinstance(now, _dt.datetime) or now.utcoffset() is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {now!r}")
    pruning = keep_checkpoints is not None or max_checkpoint_age is not None
    own_checkpoints = _checkpoint_store(store)
    checkpoints = own_checkpoints if pruning else None
    now_ms = int(now.timestamp() * 1000)
    leftovers = (
        await store.collect_leftovers(dry_run=dry_run)
        if isinstance(store, FileSessionStore | SQLiteSessionStore)
        else StoreLeftovers((), (), ())
    )
    expired: list[ExpiredSession] = []
    if own_ttl is not None and isinstance(store, SupportsExpiry):
        for info in await store.collect_expired(dry_run=dry_run):
            try:
                idle = (now - _parse_time(info.used_at)).total_seconds()
            except ValueError:
                idle = own_ttl
            expired.append(ExpiredSession(info.session_id, info.used_at, idle, info.message_count))
    collected = len(expired)  # the store's own expired sessions, which list() leaves out
    metas, listing_damage = await _walk(store)
    # An orphan is gone; a locked session is skipped once, below, for its leftovers.
    passed_over = {*leftovers.orphans, *leftovers.locked}
    metas = [m for m in metas if m.session_id not in passed_over]
    skipped = [
        SkippedSession(d.session_id, "session_store_corrupted", d.detail) for d in listing_damage
    ]
    skipped.extend(
        SkippedSession(sid, "session_locked", "leftovers of a killed writer; a writer holds it")
        for sid in leftovers.locked
    )
    pruned: list[PrunedCheckpoint] = []
    for done, meta in enumerate(metas):
        if progress is not None:
            progress(done, len(metas))
        if meta.damaged is not None:  # never expired nor pruned on guessed metadata
            skipped.append(SkippedSession(meta.session_id, "session_store_corrupted", meta.damaged))
            continue
        try:
            idle = (now - _parse_time(meta.updated_at)).total_seconds()
        except ValueError as exc:
            skipped.append(SkippedSession(meta.session_id, "session_store_corrupted", str(exc)))
            continue
        try:
            if ttl_seconds is not None and idle > ttl_seconds:
                # Counted before: the session's delete takes its checkpoints with it.
                count = await _checkpoint_count(own_checkpoints, meta.session_id)
                if not dry_run:
                    await store.delete(meta.session_id)
                expired.append(
                    ExpiredSession(
                        meta.session_id, meta.updated_at, idle, meta.message_count, count
                    )
                )
            elif checkpoints is not None:
                gone, left = await _prune(
                    checkpoints,
                    meta.session_id,
                    keep_checkpoints,
                    max_checkpoint_age,
                    now_ms,
                    dry_run,
                )
                pruned.extend(gone)
                skipped.extend(left)
        except (SessionLockedError, SessionCorruptedError) as exc:
            skipped.append(SkippedSession(meta.session_id, exc.code, exc.message))
    if progress is not None:
        progress(len(metas), len(metas))
    return GcReport(
        dry_run=dry_run,
        now=now.astimezone(_dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        ttl_seconds=ttl_seconds if ttl_seconds is not None else own_ttl,
        keep_checkpoints=keep_checkpoints,
        sessions_checked=len(metas) + collected,
        expired=tuple(expired),
        pruned=tuple(pruned),
        skipped=tuple(skipped),
        temp_files=leftovers.temp_files,
        orphans=leftovers.orphans,
        max_checkpoint_age=max_checkpoint_age,
    )


async def gc_checkpoints(
    checkpoints: CheckpointStore,
    *,
    keep_checkpoints: int | None = None,
    max_checkpoint_age: float | None = None,
    dry_run: bool = True,
    now: _dt.datetime | None = None,
) -> GcReport:
    """Prune a checkpoint store of its own, session by session; a dry run by default.

    For checkpoints kept apart from their sessions' log —
    ``Session(RedisSessionStore(url, ttl=…), id, checkpoints=PostgresCheckpointStore(dsn))``
    — whose sessions may be long gone from the session store: :func:`gc_store` walks
    the sessions a session store lists, this walks those the checkpoint store names
    (:class:`~perdure.checkpoints.store.ListsCheckpointSessions`). The rule is
    :func:`gc_store`'s: each session keeps its newest ``keep_checkpoints`` and
    loses those older than ``max_checkpoint_age`` (by default the store's own
    limit); a damaged one goes only when its id says it is old enough.

    Raises:
        TypeError: ``checkpoints`` cannot name its sessions.
        ValueError: no limit given nor configured on the store, a limit out of
            range, or ``now`` naive.
    """
    if not isinstance(checkpoints, ListsCheckpointSessions):
        raise TypeError(
            f"checkpoints must be a checkpoint store that names its sessions "
            f"(checkpoint_sessions), got {type(checkpoints).__name__}"
        )
    max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
    if max_checkpoint_age is None:
        configured = getattr(checkpoints, "max_checkpoint_age", None)
        max_checkpoint_age = check_max_checkpoint_age(configured)
    if keep_checkpoints is None and max_checkpoint_age is None:
        raise ValueError(
            "gc_checkpoints needs keep_checkpoints or max_checkpoint_age "
            "(or a store opened with max_checkpoint_age)"
        )
    if keep_checkpoints is not None and (
        isinstance(keep_checkpoints, bool)
        or not isinstance(keep_checkpoints, int)
        or keep_checkpoints < 0
    ):
        raise ValueError(f"keep_checkpoints must be an int >= 0, got {keep_checkpoints!r}")
    if now is None:
        now = _dt.datetime.now(_dt.UTC)
    elif not isinstance(now, _dt.datetime) or now.utcoffset() is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {now!r}")
    now_ms = int(now.timestamp() * 1000)
    sessions = await checkpoints.checkpoint_sessions()
    pruned: list[PrunedCheckpoint] = []
    skipped: list[SkippedSession] = []
    for session_id in sessions:
        gone, left = await _prune(
            checkpoints, session_id, keep_checkpoints, max_checkpoint_age, now_ms, dry_run
        )
        pruned.extend(gone)
        skipped.extend(left)
    return GcReport(
        dry_run=dry_run,
        now=now.astimezone(_dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        ttl_seconds=None,
        keep_checkpoints=keep_checkpoints,
        sessions_checked=len(sessions),
        expired=(),
        pruned=tuple(pruned),
        skipped=tuple(skipped),
        max_checkpoint_age=max_checkpoint_age,
    )


async def _prune(
    checkpoints: CheckpointStore,
    session_id: str,
    keep: int | None,
    max_age: float | None,
    now_ms: int,
    dry_run: bool,
) -> tuple[list[PrunedCheckpoint], list[SkippedSession]]:
    """Delete the checkpoints retention evicts (see :func:`gc_store`): the stores' rule
    on the readable ones; a damaged one goes when its id is past the age limit or
    older than the oldest readable one kept."""
    found = await scan_checkpoints(checkpoints, session_id)  # oldest first
    intact = [item.checkpoint_id for item in found if isinstance(item, CheckpointMeta)]
    if keep == 0:
        evicted = set(intact)
    else:
        evicted = set(evicted_checkpoints(intact, keep, max_age, now_ms=now_ms))
    kept = [cid for cid in intact if cid not in evicted]
    by_count = keep is not None and (keep == 0 or bool(kept))
    aged = set(
        evicted_checkpoints([item.checkpoint_id for item in found], None, max_age, now_ms=now_ms)
    )
    pruned: list[PrunedCheckpoint] = []
    left: list[SkippedSession] = []
    for item in found:
        if isinstance(item, CheckpointMeta):
            if item.checkpoint_id in evicted:
                pruned.append(
                    PrunedCheckpoint(session_id, item.checkpoint_id, item.trigger, item.created_at)
                )
        elif is_ulid(item.checkpoint_id) and (
            item.checkpoint_id in aged or (by_count and (keep == 0 or item.checkpoint_id < kept[0]))
        ):
            pruned.append(
                PrunedCheckpoint(
                    session_id,
                    item.checkpoint_id,
                    "unknown",
                    _ulid_time(item.checkpoint_id),
                    damaged=True,
                )
            )
        else:
            left.append(
                SkippedSession(
                    session_id,
                    item.error.code,
                    f"checkpoint {item.checkpoint_id} is damaged ({item.kind}); "
                    "kept for `perdure repair`",
                    checkpoint_id=item.checkpoint_id,
                )
            )
    if not dry_run:
        for stale in pruned:
            await checkpoints.delete(session_id, stale.checkpoint_id)
    return pruned, left


async def _checkpoint_count(checkpoints: CheckpointStore | None, session_id: str) -> int:
    """How many checkpoints ``session_id`` has in ``checkpoints``, damaged ones included."""
    if checkpoints is None:
        return 0
    if isinstance(checkpoints, ListsCheckpointIds):
        return len(await checkpoints.checkpoint_ids(session_id))
    return len(await scan_checkpoints(checkpoints, session_id))


def _ulid_time(checkpoint_id: str) -> str:
    """When a ULID was made, as ISO-8601 UTC (what a damaged checkpoint still tells)."""
    moment = _dt.datetime.fromtimestamp(ulid_timestamp_ms(checkpoint_id) / 1000, _dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_time(text: str) -> _dt.datetime:
    """An ISO-8601 timestamp as an aware datetime (naive ones are UTC)."""
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(f"updated_at {text!r} is not an ISO-8601 time") from None
    return parsed if parsed.utcoffset() is not None else parsed.replace(tzinfo=_dt.UTC)
