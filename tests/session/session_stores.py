"""The session stores under test, by kind (shared by fixtures and child processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perdure.session import FileSessionStore, SessionStore

STORE_KINDS = ["file", "sqlite", "memory"]


def make_store(kind: str, path: Path, **options: Any) -> SessionStore:
    """A fresh store of ``kind`` rooted at ``path``."""
    if kind == "file":
        return FileSessionStore(path / "file-store", **options)
    if kind == "sqlite":
        from perdure.stores.sqlite import SQLiteSessionStore

        return SQLiteSessionStore(path / "sessions.db", **options)
    if kind == "memory":
        from perdure.stores.memory import MemorySessionStore

        return MemorySessionStore(**options)
    raise ValueError(kind)
