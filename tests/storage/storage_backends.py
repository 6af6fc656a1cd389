"""The Storage backends under test; a later backend joins by adding a kind here."""

from __future__ import annotations

from pathlib import Path

from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage, Storage

STORAGE_KINDS = ("memory", "local_file", "sqlite")

_MEMORY: dict[Path, MemoryStorage] = {}


def make_storage(kind: str, path: Path) -> Storage:
    """A backend of ``kind`` over the data in ``path`` (same path, same data)."""
    if kind == "memory":
        return _MEMORY.setdefault(path, MemoryStorage())
    if kind == "local_file":
        return LocalFileStorage(path / "blobs")
    if kind == "sqlite":
        return SQLiteStorage(path / "blobs.db")
    raise ValueError(f"unknown storage kind {kind!r}")


def close_storage(storage: Storage) -> None:
    """Release what a backend holds (connections)."""
    if isinstance(storage, SQLiteStorage):
        storage.close()
