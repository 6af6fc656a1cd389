"""The Storage backends under test; a later backend joins by adding a kind here."""

from __future__ import annotations

import builtins
from pathlib import Path

from perdure.crypto import Cipher
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


class MemoryView:
    """One :class:`MemoryStorage` seen through a cipher of its own (``None``: the bytes
    as stored), for suites that open a backend twice over the same data with different
    ciphers: memory data lives in one object, so each call first sets that object's
    public ``cipher`` to this view's. Calls must run one at a time (the cipher suite's do).
    """

    def __init__(self, shared: MemoryStorage, cipher: Cipher | None) -> None:
        self.shared = shared
        self.cipher = cipher

    def _as_mine(self) -> MemoryStorage:
        self.shared.cipher = self.cipher
        return self.shared

    async def write(self, key: str, data: bytes) -> None:
        await self._as_mine().write(key, data)

    async def read(self, key: str) -> bytes | None:
        return await self._as_mine().read(key)

    async def delete(self, key: str) -> None:
        await self._as_mine().delete(key)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> builtins.list[str]:
        return await self._as_mine().list(prefix, limit=limit, start_after=start_after)

    async def version(self, key: str) -> str | None:
        return await self._as_mine().version(key)

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        return await self._as_mine().write_if(key, data, expected=expected)

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        await self._as_mine().append(key, data, size=size, tail=tail)

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        await self._as_mine().replace(key, data, size=size, tail=tail)


def make_cipher_storage(kind: str, path: Path, cipher: Cipher | None) -> Storage:
    """A backend of ``kind`` built with ``cipher=`` over the data in ``path``."""
    if kind == "memory":
        shared = _MEMORY.setdefault(path, MemoryStorage())
        return MemoryView(shared, cipher)
    if kind == "local_file":
        return LocalFileStorage(path / "blobs", cipher=cipher)
    if kind == "sqlite":
        return SQLiteStorage(path / "blobs.db", cipher=cipher)
    raise ValueError(f"unknown storage kind {kind!r}")
