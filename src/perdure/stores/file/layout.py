"""Where a file store keeps a session, and the format of its ``meta.json`` (SPEC §7.1).

Pure names and checks, and how a session's files are opened for reading
(:func:`open_regular`: never a FIFO or a device, so no read hangs); the store
(:mod:`perdure.stores.file.store`) moves the bytes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from perdure.stores.file import journal
from perdure.stores.file.journal import End

META = "meta.json"
HEAD = "head"  # where the journal ends, kept outside it (see journal.encode_head_slot)
JOURNAL = "journal.jsonl"
MANIFEST = "manifest.json"
REWRITE = "rewrite.jsonl"
REWRITE_TMP = "rewrite.jsonl.tmp"
SEGMENTS = "segments"
ATTACHMENTS = "attachments"
TRASH = ".trash"  # under the store root: deleted sessions on their way out
META_FORMAT = "perdure-session/1"
META_FIELDS = frozenset({"format", "session_id", "created_at", "head"})
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")


def meta_bytes(session_id: str, created: str, *, head: bool = True) -> bytes:
    meta: dict[str, Any] = {"format": META_FORMAT, "session_id": session_id, "created_at": created}
    if head:
        meta["head"] = 1  # a head file is kept: one missing is damage
    meta["sha256"] = meta_digest(meta)
    return json.dumps(meta).encode()


def meta_digest(meta: Mapping[str, Any]) -> str:
    """The sha256 ``meta.json`` carries over its other fields (a flipped date is damage)."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def check_meta(meta: Any, session_id: str) -> str:
    """The creation time of a parsed ``meta.json``; ``ValueError`` when it is damaged.

    Since head files, ``meta.json`` carries a sha256 of its fields; one written
    before them has neither and is checked by shape alone.
    """
    if not isinstance(meta, dict):
        raise ValueError("not an object")
    fields = dict(meta)
    digest = fields.pop("sha256", None)
    if not set(fields) <= META_FIELDS:
        raise ValueError(f"unexpected fields {sorted(set(fields) - META_FIELDS)}")
    if digest is not None and digest != meta_digest(fields):
        raise ValueError("it does not match its sha256")
    if digest is None and "head" in fields:
        raise ValueError("its sha256 is missing")
    if fields.get("format") != META_FORMAT or fields.get("session_id") != session_id:
        raise ValueError("unexpected format or session id")
    if fields.get("head") not in (None, 1):
        raise ValueError("unexpected head flag")
    created = fields.get("created_at")
    if not isinstance(created, str) or not TIMESTAMP.fullmatch(created):
        raise ValueError("created_at is not a UTC timestamp")
    return created


def head_ends(sdir: Path) -> list[End]:
    """The ends ``sdir``'s head file names now; none when it is absent or unreadable."""
    try:
        head = journal.decode_head(read_regular(sdir / HEAD))
    except OSError:
        return []
    return head[1] if head is not None else []


TRANSIENT_ERRNOS = frozenset(
    {errno.EINTR, errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOMEM, errno.ENOBUFS}
    | {errno.EMFILE, errno.ENFILE}
)
"""Errors that say nothing about the file (the process ran short of something):
raised as they are, never reported as damage."""


class NotRegularFileError(OSError):
    """A FIFO, a directory, a socket or a device where a session keeps a regular file."""

    def __init__(self, path: Path, mode: int) -> None:
        what = f"{_file_type(mode)}, not a regular file"
        super().__init__(f"{os.fspath(path)}: {what}")
        self.strerror = what
        self.filename = os.fspath(path)


def is_transient(exc: OSError) -> bool:
    """Whether ``exc`` is a passing shortage, not something wrong with the file."""
    return exc.errno in TRANSIENT_ERRNOS


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, when it is a regular file (symlinks followed).

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before anything is read, so
    a FIFO in place of a journal is refused at once instead of blocking forever.

    Raises:
        NotRegularFileError: ``path`` is a FIFO, a directory, a socket or a device.
        OSError: it cannot be opened (missing, permission denied, a symlink loop).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(path, mode)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, a regular file (see :func:`open_regular`)."""
    with open_regular(path) as handle:
        return handle.read()


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"
