"""Backends by URL (STYLE §8): ``file:DIR``, ``sqlite:PATH``, ``memory:`` and friends."""

from __future__ import annotations

from pathlib import Path

from perdure.storage.local_file import LocalFileStorage
from perdure.storage.memory import MemoryStorage
from perdure.storage.protocol import Storage
from perdure.storage.sqlite import SQLiteStorage

STORAGE_SCHEMES = ("file", "sqlite", "memory")


def split_url(url: object, schemes: tuple[str, ...], what: str) -> tuple[str, Path | None]:
    """Split ``scheme:path`` into the scheme and its path (``None`` for ``memory:``).

    Raises:
        ValueError: not a string, no scheme, an unknown scheme, or no path where one
            is needed (the message names ``what`` and the known schemes).
    """
    known = ", ".join(f"{s}:" for s in schemes)
    if not isinstance(url, str) or ":" not in url:
        raise ValueError(f"{what} URL {url!r} has no scheme; use one of {known}")
    scheme, _, rest = url.partition(":")
    if scheme not in schemes:
        raise ValueError(f"unknown {what} scheme {scheme!r} in {url!r}; known: {known}")
    if scheme == "memory":
        return scheme, None
    if rest.startswith("//"):
        rest = rest[2:]
    if not rest:
        raise ValueError(f"{what} URL {url!r} names no path")
    return scheme, Path(rest).expanduser()


def open_storage(url: str) -> Storage:
    """Open the blob :class:`Storage` a URL names (nothing is created until written).

    ``file:DIR`` → :class:`LocalFileStorage`, ``sqlite:PATH`` → :class:`SQLiteStorage`,
    ``memory:`` → a new :class:`MemoryStorage`.

    Raises:
        ValueError: the URL is malformed or its scheme unknown.
    """
    scheme, path = split_url(url, STORAGE_SCHEMES, "storage")
    if scheme == "memory":
        return MemoryStorage()
    assert path is not None
    return LocalFileStorage(path) if scheme == "file" else SQLiteStorage(path)
