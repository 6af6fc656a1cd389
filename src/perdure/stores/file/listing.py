"""A file store's listing cache: each session's list row, kept while its files stand still.

Listing a session reads its ``meta.json``, its head file and its journal's last
record, and checks the first two against their hashes: at 100k sessions that is
seconds. A row (created, updated, message count) only changes when one of those
files does, so :class:`ListingCache` keeps each healthy session's row beside a
digest of the ``stat`` of its directory and of each file the row was read from
(inode, size, mode, mtime and ctime, in nanoseconds). While the digest matches, the
row is the one the files would give; any write, rename, truncation or in-place edit
changes a ctime, so the row is read again from the files. Rules:

- The files are the truth; the cache is never trusted over them. The stats are
  taken *before* the row is read, so a write racing the read leaves a digest that
  no longer matches. A file changed less than :data:`SETTLE_NS` before the read
  (a coarse clock could give two writes one timestamp) is not cached at all.
- A damaged session is never cached: it is read (and reported) every time.
- The cache lives in ``<root>/.listing.json``, written (atomically, without fsync)
  after a full listing that changed it. A missing, unreadable or malformed file is
  an empty cache, rebuilt by the next full listing: never an error, and no data is
  in it that the sessions do not hold. A store that cannot write it (read-only) just
  lists without keeping it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perdure.session.store import SessionMeta
from perdure.stores.file.layout import HEAD, JOURNAL, MANIFEST, META, REWRITE

CACHE_NAME = ".listing.json"
FORMAT = "perdure-listing/1"
SETTLE_NS = 2_000_000_000
"""A file whose ctime is this recent when its row is read is read again next time."""

_FILES = (META, HEAD, JOURNAL, MANIFEST, REWRITE)
"""The files a list row is read from (the session directory's stat covers which exist)."""

Row = tuple[str, str, int, int, str]  # created, updated, message count, files mask, digest


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)


class ListingCache:
    """The rows of the sessions whose files did not change since they were read."""

    def __init__(self, root: Path) -> None:
        self.path = root / CACHE_NAME
        self._rows: dict[str, Row] | None = None  # loaded at the first listing
        self._changed = False
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Row]:
        rows = self._rows
        if rows is None:
            rows = _read(self.path)
            with self._lock:
                if self._rows is None:
                    self._rows = rows
                rows = self._rows
        return rows

    def row(self, session_id: str, sdir: str, read: Callable[[], SessionMeta]) -> SessionMeta:
        """``session_id``'s list row: the cached one while its files stand still, else
        ``read()`` (which raises as the store does), remembered when healthy."""
        rows = self._load()
        cached = rows.get(session_id)
        if cached is not None:
            created, updated, count, mask, digest = cached
            if _digest(sdir, mask) == digest:
                return SessionMeta(session_id, created, updated, count)
        started = time.time_ns()
        seen = _snapshot(sdir)  # before the read: a write racing it changes the stats
        try:
            meta = read()
        except Exception:
            self._forget(session_id)  # gone or damaged: read every time
            raise
        if seen is None or meta.damaged:
            self._forget(session_id)
            return meta
        mask, digest, newest = seen
        with self._lock:
            if newest < started - SETTLE_NS:
                rows[session_id] = (
                    meta.created_at,
                    meta.updated_at,
                    meta.message_count,
                    mask,
                    digest,
                )
                self._changed = True
            elif rows.pop(session_id, None) is not None:
                self._changed = True
        return meta

    def _forget(self, session_id: str) -> None:
        with self._lock:
            if self._rows is not None and self._rows.pop(session_id, None) is not None:
                self._changed = True

    def keep_only(self, session_ids: set[str]) -> None:
        """After a full listing: forget the sessions that are gone."""
        rows = self._load()
        with self._lock:
            gone = [sid for sid in rows if sid not in session_ids]
            for sid in gone:
                del rows[sid]
            self._changed = self._changed or bool(gone)

    def save(self) -> None:
        """Write the cache if it changed (atomically; a failure is ignored)."""
        with self._lock:
            if not self._changed or self._rows is None:
                return
            data = json.dumps(
                {"format": FORMAT, "rows": self._rows}, separators=(",", ":")
            ).encode()
            self._changed = False
        tmp = self.path.with_name(f"{CACHE_NAME}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _snapshot(sdir: str) -> tuple[int, str, int] | None:
    """Which of the row's files exist (a mask), the digest of their stats and the
    directory's, and the newest ctime among them; ``None`` when the directory is gone."""
    try:
        stats = [os.stat(sdir)]
    except OSError:
        return None
    mask = 0
    for bit, name in enumerate(_FILES):
        try:
            st = os.stat(f"{sdir}{os.sep}{name}")
        except FileNotFoundError:
            continue
        except OSError:
            return None
        mask |= 1 << bit
        stats.append(st)
    keys = [_stat_key(st) for st in stats]
    newest = max(max(st.st_ctime_ns, st.st_mtime_ns) for st in stats)
    return mask, _hash(keys), newest


def _digest(sdir: str, mask: int) -> str | None:
    """The digest of the stats of ``sdir`` and of the files ``mask`` names, or
    ``None`` when one of them is gone (the directory's stat notes any new one)."""
    try:
        keys = [_stat_key(os.stat(sdir))]
        for bit, name in enumerate(_FILES):
            if mask & (1 << bit):
                keys.append(_stat_key(os.stat(f"{sdir}{os.sep}{name}")))
    except OSError:
        return None
    return _hash(keys)


def _hash(keys: list[tuple[int, ...]]) -> str:
    return hashlib.blake2b(repr(keys).encode(), digest_size=12).hexdigest()


def _read(path: Path) -> dict[str, Row]:
    """The rows in ``path``; an empty cache when it is missing or malformed."""
    try:
        doc: Any = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return {}
    raw = doc.get("rows")
    if not isinstance(raw, dict):
        return {}
    rows: dict[str, Row] = {}
    for sid, row in raw.items():
        if (
            isinstance(row, list)
            and len(row) == 5
            and isinstance(row[0], str)
            and isinstance(row[1], str)
            and type(row[2]) is int
            and row[2] >= 0
            and type(row[3]) is int
            and isinstance(row[4], str)
        ):
            rows[sid] = (row[0], row[1], row[2], row[3], row[4])
    return rows
