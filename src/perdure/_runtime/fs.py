"""Durable file primitives: what "written" means on a local disk."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and creations in it survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically: temp file, fsync, rename, dir fsync.

    After return (with ``durable``) the new content survives a crash; at any crash
    point a reader sees either the old file or the new one, never a mix. The temp
    name is unique, so concurrent writers never share a temp file.
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def append_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (looping over short writes)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
