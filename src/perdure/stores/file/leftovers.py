"""What killed writers leave in a file store, told apart from sessions (SPEC §7.1).

An interrupted ``create`` leaves a directory without ``meta.json``; a killed
atomic write a temp file; a fork killed halfway a provisional session whose
history never came. These checks say which is which, so that only such leftovers
are ever cleared and a damaged session is never taken for one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from perdure.session.ids import validate_session_id
from perdure.stores.file import journal
from perdure.stores.file.journal import JournalDamage
from perdure.stores.file.layout import (
    ATTACHMENTS,
    HEAD,
    JOURNAL,
    META,
    REWRITE_TMP,
    head_ends,
    read_regular,
)

# atomic_write's temp names (see perdure._runtime.fs): ".<name>.<32 hex>.tmp".
ATOMIC_TEMP = re.compile(r"\.(.+)\.[0-9a-f]{32}\.tmp")
GENESIS_MAX = 1024  # bytes: more than any genesis record's line
# Deleted sessions used to wait inside sessions/ under this name before the trash
# existed; a crash could leave one there. No id starts with "." (see ids.py).
LEGACY_TRASH = re.compile(r"\.deleted-.+-[0-9a-f]{32}")


@dataclass(frozen=True)
class StoreLeftovers:
    """What killed writers left in a file store (see ``collect_leftovers``)."""

    temp_files: tuple[str, ...]
    """Paths of temp files of interrupted writes."""
    orphans: tuple[str, ...]
    """Ids of provisional sessions whose history never came (a fork killed halfway)."""
    locked: tuple[str, ...]
    """Ids of sessions with leftovers, left alone because a writer holds them."""


def create_leftovers(sdir: Path) -> bool:
    """Whether ``sdir`` holds only what an interrupted :meth:`FileSessionStore.create`
    leaves: nothing, temp files, or a journal of the one empty record create writes —
    plus, maybe, checkpoints put under that id while no session had it (a new session
    starts without them, in every store).

    Only such a directory may be removed by a create or read as no session: anything
    else (a message, a rewrite, a segment, an attachment, any other file) is data
    perdure did not write in that create — a session whose ``meta.json`` was lost —
    and must be reported, never deleted.
    """
    try:
        names = os.listdir(sdir)
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        return False
    for name in names:
        temp = ATOMIC_TEMP.fullmatch(name)
        if (temp and temp.group(1) in (JOURNAL, META)) or name == "checkpoints":
            continue
        if name == HEAD:
            if any(seq != 0 for seq, _, _ in head_ends(sdir)):
                return False
            continue
        if name != JOURNAL:
            return False
        try:
            scanned = journal.scan(read_regular(sdir / name))
        except (JournalDamage, OSError):
            return False
        if len(scanned.records) > 1:
            return False
        if scanned.records:
            body = scanned.records[0].body
            if body.get("t") != "s" or body.get("c") != 0 or body.get("s") != {}:
                return False
            if not isinstance(body.get("created"), str):
                return False
    return True


def temp_files(sdir: Path) -> list[Path]:
    """Temp files killed writers left in a session directory and its attachments."""
    found: list[Path] = []
    for directory in (sdir, sdir / ATTACHMENTS):
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        found.extend(
            directory / name
            for name in names
            if ATOMIC_TEMP.fullmatch(name) or (directory == sdir and name == REWRITE_TMP)
        )
    return sorted(found)


def is_provisional_orphan(sdir: Path) -> bool:
    """Whether ``sdir`` is a provisional session (see ``FileSessionStore._create``) whose
    history never came: its journal holds only the genesis record marked provisional,
    and the directory nothing but that journal, its head, meta.json and temp files."""
    try:
        names = set(os.listdir(sdir))
    except (FileNotFoundError, NotADirectoryError):
        return False
    names = {name for name in names if not ATOMIC_TEMP.fullmatch(name)}
    if not names <= {META, JOURNAL, HEAD} or META not in names or JOURNAL not in names:
        return False
    try:
        # A genesis record is a couple of hundred bytes: a longer journal holds a
        # history, and gc need not read (and verify) it whole to learn so.
        if (sdir / JOURNAL).stat().st_size > GENESIS_MAX:
            return False
        scanned = journal.scan(read_regular(sdir / JOURNAL))
    except (JournalDamage, OSError):
        return False
    records = scanned.records
    return len(records) == 1 and records[0].type == "s" and records[0].body.get("provisional") == 1


def is_session_name(name: str) -> bool:
    """Whether a directory under ``sessions/`` can be a session: its name is a valid id.

    Deleted sessions used to wait inside ``sessions/`` as ``.deleted-<id>-<hex>``; a
    crash could leave one there, and it is no session (ids never start with ``.``).
    """
    try:
        validate_session_id(name)
    except ValueError:
        return False
    return True


def is_renamed_session(sdir: Path) -> bool:
    """A session stored under an id this version refuses (over 200 bytes, or hidden):
    not a deleted session's leftovers, and holding a ``meta.json``."""
    return not LEGACY_TRASH.fullmatch(sdir.name) and (sdir / META).is_file()


def invalid_id(name: str) -> str:
    try:
        validate_session_id(name)
    except ValueError as exc:
        return f"{exc}; rename the directory {name!r} under sessions/ to a valid id to read it"
    return ""  # pragma: no cover - only called for invalid names
