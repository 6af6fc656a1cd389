"""Where a file store keeps a session, and the format of its ``meta.json`` (SPEC §7.1).

Pure names and checks, no I/O but :func:`head_ends`' one read; the store
(:mod:`perdure.stores.file.store`) moves the bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
        head = journal.decode_head((sdir / HEAD).read_bytes())
    except FileNotFoundError:
        return []
    return head[1] if head is not None else []
