"""LocalFileStorage: one file per key under a root directory, replaced atomically.

On disk a key's segments become directories and its last segment a ``.blob`` file::

    key  sessions/my-session/agents/default/latest
    ->   <root>/sessions/my-session/agents/default/latest.blob

Segments are percent-encoded so that any valid key maps to one path and back, and a
file never collides with a directory: ``A-Z a-z 0-9 _ -`` are kept, every other
character (``.`` and ``%`` included) becomes ``%XX`` per UTF-8 byte. Temporary files
start with ``.`` (which no encoded name does), so ``list`` never sees them. An encoded
segment longer than 250 bytes is refused with ``ValueError``.

A write is: a temp file with a unique name in the target directory (``O_EXCL``),
write, ``fsync``, ``os.replace`` onto the target, ``fsync`` of the directory (and of
the parents of any directory it had to create). A killed process leaves either the
old or the new file, plus possibly a stray ``.tmp-*`` file that is never listed and
that :meth:`LocalFileStorage.remove_temp_files` removes. All blocking I/O runs in a
worker thread (``asyncio.to_thread``), so every coroutine works from any loop — but
for a ``stat`` that finds a blob missing and a small append's page-cache write
(below).

It is also an :class:`~perdure.storage.AppendStorage`. An append is one write at the
file's end and one ``fsync`` of the file — no directory sync, since no name changes
— taken under an exclusive ``flock`` of the file, which the expected-end check and
the write share: of two writers (threads or processes) that read the same end, one
appends and the other gets ``StorageConflictError``. A small append is written into
the page cache on the caller's thread and its fsync is handed to the kernel
(:func:`~perdure._runtime.fsync.start_fsync`), with no hop to a worker thread; the
lock is held until the fsync returns. A conditional replace writes and syncs a temp
file first, then, holding the old file's lock, checks its end and renames the temp
file over it (a create links the temp file to the name, which fails if it exists).

It is also a :class:`~perdure.storage.ConditionalStorage`. A blob's version is its
file's inode number, size and modification time, and every write (plain, conditional
or an append) sets that time to the current millisecond plus a random number of
nanoseconds: a file that reuses a freed inode, at the same size, in the same
millisecond, would need the same one of a million draws to repeat a version (on a
file system keeping nanosecond times: ext4, XFS, Btrfs, tmpfs, APFS; one with coarse
times, FAT say, makes a repeat likelier). A
conditional write writes and syncs a temp file, then, holding the current file's
``flock``, compares its version and renames the temp file over it (a create links
the temp file to the name, which fails if it exists). A plain ``write`` and a
``delete`` take that lock too before they rename or unlink, so none of them can
fall between another's check and its rename.

Keys that differ only by letter case collide on case-insensitive file systems.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import fcntl
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from perdure._runtime.fs import append_all
from perdure._runtime.fsync import start_fsync
from perdure.crypto import Cipher, check_cipher
from perdure.errors import StorageConflictError
from perdure.storage.encrypted import append_refused, open_blob, seal_blob
from perdure.storage.keys import (
    check_data,
    check_end,
    check_expected,
    validate_key,
    validate_list_args,
    version_conflict,
)

__all__ = ["LocalFileStorage"]

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SUFFIX = ".blob"
_TMP_PREFIX = ".tmp-"
_MAX_NAME = 250
_DEFAULT_ROOT = Path(".perdure") / "storage"
# Appends up to this size are written on the caller's thread (a page-cache copy of
# microseconds); larger ones, and any that must wait for another writer's lock, go to
# a worker thread.
_INLINE_MAX = 64 * 1024
_PATHS_KEPT = 256


def encode_segment(segment: str) -> str:
    """Return the file-system name of one key segment (percent-encoding, see module)."""
    out: list[str] = []
    for byte in segment.encode("utf-8"):
        out.append(chr(byte) if byte in _SAFE else f"%{byte:02X}")
    return "".join(out)


def decode_segment(name: str) -> str | None:
    """Return the key segment ``name`` encodes, or ``None`` if it is not an encoded name."""
    raw = bytearray()
    i = 0
    while i < len(name):
        char = name[i]
        if char == "%":
            digits = name[i + 1 : i + 3]
            if len(digits) != 2 or not all(c in "0123456789ABCDEF" for c in digits):
                return None
            raw.append(int(digits, 16))
            i += 3
            continue
        if ord(char) > 127 or ord(char) not in _SAFE:
            return None
        raw.append(ord(char))
        i += 1
    try:
        segment = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return segment if encode_segment(segment) == name else None


def _fsync_dir(path: Path, *, missing_ok: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        # A concurrent delete removed the directory (and so the entry): nothing to sync.
        if missing_ok:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _conflict(key: str, why: str) -> StorageConflictError:
    return StorageConflictError(f"blob {key!r} is not as expected: {why}")


def _open_expected(key: str, path: Path, size: int, tail: bytes, *, wait: bool) -> int | None:
    """Open ``path`` read-write under an exclusive ``flock`` if it ends as expected.

    Returns the descriptor (closing it releases the lock), or ``None`` when ``wait``
    is false and another writer holds the lock.

    Raises:
        StorageConflictError: the file is missing or does not end as expected.
    """
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _conflict(key, "it does not exist") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return None
            held = os.fstat(fd)
            try:
                named = os.stat(path)
            except FileNotFoundError:
                raise _conflict(key, "it does not exist") from None
            if (named.st_ino, named.st_dev) != (held.st_ino, held.st_dev):
                # Replaced between our open and our lock: look at the new file.
                os.close(fd)
                continue
            if held.st_size != size:
                raise _conflict(key, f"it is {held.st_size} bytes, not {size}")
            if tail and os.pread(fd, len(tail), size - len(tail)) != tail:
                raise _conflict(key, "its last bytes differ")
            return fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    raise _conflict(key, "it keeps being replaced")


def _stamp(fd: int) -> None:
    """Set the file's modification time to now (ms) plus random nanoseconds: a new version."""
    at = time.time_ns() // 1_000_000 * 1_000_000 + secrets.randbelow(1_000_000)
    os.utime(fd, ns=(at, at))


def _version(st: os.stat_result) -> str:
    """The version of the blob whose file has the status ``st`` (see the module)."""
    return f"{st.st_ino:x}.{st.st_size:x}.{st.st_mtime_ns:x}"


def _lock_named(path: Path) -> int | None:
    """Open the file named ``path`` under an exclusive ``flock``; ``None`` if there is none.

    The descriptor is the file the name holds once the lock is taken (closing it
    releases the lock).
    """
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                named = os.stat(path)
            except FileNotFoundError:
                os.close(fd)
                return None
            if (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
                return fd
            os.close(fd)  # replaced between our open and our lock: take the new file
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    raise OSError(f"{str(path)!r} keeps being replaced")


def _cut_back(fd: int, size: int) -> None:
    """After a failed append, cut the file back to its old end (best effort)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, size)


class LocalFileStorage:
    """Store each blob in its own file under ``root``; writes are atomic and durable.

    Args:
        root: The directory holding the blobs (created on first write). Default:
            ``.perdure/storage`` under the current working directory, resolved when
            the storage is built.
        cipher: a :class:`~perdure.crypto.Cipher`: every blob is written encrypted
            (:func:`~perdure.storage.encrypted.seal_blob`), and ``append``/``replace``
            raise ``TypeError`` (see :func:`~perdure.storage.can_append`).

    After ``write`` returns, the blob survives a crash or power loss (file and
    directory are fsynced); a crash during ``write`` leaves the previous blob. Several
    processes may share a root: each write is an atomic rename, so concurrent writers
    of one key are last-writer-wins (``write_if`` compares and sets) and readers never see
    a torn blob.
    """

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, cipher: Cipher | None = None
    ) -> None:
        if root is not None and not isinstance(root, str | os.PathLike):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        self.cipher = check_cipher(cipher)
        self.root = Path(_DEFAULT_ROOT if root is None else root).absolute()
        # key -> path of the keys used lately (a save touches the same few keys again).
        self._paths: dict[str, Path] = {}

    def __repr__(self) -> str:
        return f"LocalFileStorage({str(self.root)!r})"

    # ------------------------------------------------------------------ paths

    def _path(self, key: str) -> Path:
        if type(key) is str:
            known = self._paths.get(key)
            if known is not None:
                return known
        validate_key(key)
        names = [encode_segment(segment) for segment in key.split("/")]
        names[-1] += _SUFFIX
        for name in names:
            if len(name) > _MAX_NAME:
                raise ValueError(
                    f"key {key!r} is invalid for LocalFileStorage: a segment encodes to "
                    f"more than {_MAX_NAME} bytes"
                )
        path = self.root.joinpath(*names)
        if len(self._paths) >= _PATHS_KEPT:
            self._paths.clear()
        self._paths[key] = path
        return path

    def _ensure_dir(self, path: Path) -> None:
        """Create ``path`` and missing parents, fsyncing each new entry's parent."""
        if path.is_dir():
            return
        if path == self.root:
            path.mkdir(parents=True, exist_ok=True)
            _fsync_dir(path.parent)
            return
        self._ensure_dir(path.parent)
        try:
            path.mkdir()
        except FileExistsError:
            return
        _fsync_dir(path.parent)

    # ------------------------------------------------------------------ API

    async def write(self, key: str, data: bytes) -> None:
        """Atomically replace the blob under ``key`` and make it durable (see module)."""
        path = self._path(key)
        blob = seal_blob(self.cipher, data)
        await asyncio.to_thread(self._write_sync, path, blob)

    def _write_sync(self, path: Path, blob: bytes) -> None:
        tmp, fd = self._temp_file(path, blob)
        old: int | None = None
        try:
            try:
                old = _lock_named(path)  # no conditional write falls in between
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(path.parent, missing_ok=True)
        finally:
            if old is not None:
                os.close(old)
            os.close(fd)

    def _temp_file(self, path: Path, blob: bytes) -> tuple[Path, int]:
        """Write ``blob`` to a new, fsynced temp file beside ``path``.

        Returns its path and an open descriptor holding its ``flock``: the caller
        renames (or links) it into place, syncs the directory, then closes the
        descriptor. So no appender can extend the new file before its name is
        durable (an append acknowledged on a file that a power cut then unnames
        would be lost).
        """
        for attempt in range(10):
            self._ensure_dir(path.parent)
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                # A concurrent delete pruned the (empty) directory; make it again.
                if attempt == 9:
                    raise
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: never waits
                append_all(fd, blob)
                _stamp(fd)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return tmp, fd
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------- AppendStorage

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        """Add ``data`` at the end of the blob if it ends as expected (see ``AppendStorage``).

        One write and one fsync of the file, under its ``flock`` (see the module).
        """
        if self.cipher is not None:
            raise append_refused(self, "append")
        path = self._path(key)
        blob = check_data(data)
        _, tail = check_end(size, tail, absent_ok=False)
        if len(blob) <= _INLINE_MAX:
            fd = _open_expected(key, path, size, tail, wait=False)
            if fd is not None:
                try:
                    append_all(fd, blob)
                    _stamp(fd)
                    await start_fsync(fd)
                except BaseException:
                    _cut_back(fd, size)
                    raise
                finally:
                    os.close(fd)  # and with it the lock
                return
        await asyncio.to_thread(self._append_sync, key, path, blob, size, tail)

    @staticmethod
    def _append_sync(key: str, path: Path, blob: bytes, size: int, tail: bytes) -> None:
        fd = _open_expected(key, path, size, tail, wait=True)
        assert fd is not None
        try:
            append_all(fd, blob)
            _stamp(fd)
            os.fsync(fd)
        except BaseException:
            _cut_back(fd, size)
            raise
        finally:
            os.close(fd)

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        """Atomically replace the blob if it ends as expected (see ``AppendStorage``)."""
        if self.cipher is not None:
            raise append_refused(self, "replace")
        path = self._path(key)
        blob = check_data(data)
        expected, tail = check_end(size, tail, absent_ok=True)
        await asyncio.to_thread(self._replace_sync, key, path, blob, expected, tail)

    def _replace_sync(
        self, key: str, path: Path, blob: bytes, size: int | None, tail: bytes
    ) -> None:
        tmp, fd = self._temp_file(path, blob)
        old: int | None = None
        try:
            if size is None:
                try:
                    os.link(tmp, path)  # atomic, and refused if the name exists
                except FileExistsError:
                    raise _conflict(key, "it exists") from None
                os.unlink(tmp)
            else:
                old = _open_expected(key, path, size, tail, wait=True)
                os.replace(tmp, path)
            _fsync_dir(path.parent, missing_ok=True)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            if old is not None:
                os.close(old)
            os.close(fd)

    # -------------------------------------------------- ConditionalStorage

    async def version(self, key: str) -> str | None:
        """The version of the blob under ``key``, or ``None`` (see the module)."""
        path = self._path(key)
        try:
            return _version(await asyncio.to_thread(os.stat, path))
        except FileNotFoundError:
            return None

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version is ``expected``
        (``None``: only if there is none); return the new version (see the module).

        Raises:
            StorageConflictError: the version is not ``expected``; nothing was written.
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes, ``expected`` neither a str nor None.
        """
        path = self._path(key)
        blob = seal_blob(self.cipher, data)
        check_expected(expected)
        return await asyncio.to_thread(self._write_if_sync, key, path, blob, expected)

    def _write_if_sync(self, key: str, path: Path, blob: bytes, expected: str | None) -> str:
        tmp, fd = self._temp_file(path, blob)
        old: int | None = None
        try:
            if expected is None:
                try:
                    os.link(tmp, path)  # atomic, and refused if the name exists
                except FileExistsError:
                    found = None
                    with contextlib.suppress(FileNotFoundError):
                        found = _version(os.stat(path))
                    raise self._version_conflict(key, expected, found) from None
                os.unlink(tmp)
            else:
                old = _lock_named(path)
                found = None if old is None else _version(os.fstat(old))
                if found != expected:
                    raise self._version_conflict(key, expected, found)
                os.replace(tmp, path)
            _fsync_dir(path.parent, missing_ok=True)
            return _version(os.fstat(fd))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            if old is not None:
                os.close(old)
            os.close(fd)

    def _version_conflict(
        self, key: str, expected: str | None, found: str | None
    ) -> StorageConflictError:
        return version_conflict(f"file storage {str(self.root)!r}", key, expected, found)

    async def read(self, key: str) -> bytes | None:
        """Return the blob under ``key``, or ``None`` if there is none.

        A missing blob is answered on the caller's thread (one ``stat``, a few
        microseconds; the hop to a worker thread that a read takes costs 0.1-0.2 ms):
        the first restore of each new agent of a graph reads a ``latest`` that is not
        there.
        """
        path = self._path(key)
        try:
            os.stat(path)
        except FileNotFoundError:
            return None
        except OSError:
            pass  # the read says what is wrong
        return open_blob(self.cipher, await asyncio.to_thread(self._read_sync, path))

    @staticmethod
    def _read_sync(path: Path) -> bytes | None:
        try:
            with open(path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    async def delete(self, key: str) -> None:
        """Remove the blob under ``key`` (idempotent); durable when this returns.

        Directories left empty are removed too, up to ``root``.
        """
        path = self._path(key)
        await asyncio.to_thread(self._delete_sync, path)

    def _delete_sync(self, path: Path) -> None:
        old = _lock_named(path)  # no conditional write falls in between
        if old is None:
            return
        try:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            _fsync_dir(path.parent, missing_ok=True)
        finally:
            os.close(old)
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone): stop pruning
                break
            parent = parent.parent

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        """Return sorted keys starting with ``prefix`` after ``start_after`` (see ``Storage``).

        Walks only the directory the prefix names, in key order, and stops after
        ``limit`` keys.
        """
        validate_list_args(prefix, limit, start_after)
        if limit == 0:
            return []
        return await asyncio.to_thread(self._list_sync, prefix, limit, start_after)

    def _list_sync(
        self, prefix: str, limit: int | None, start_after: str | None
    ) -> builtins.list[str]:
        *complete, partial = prefix.split("/")
        base_key = "".join(f"{segment}/" for segment in complete)
        directory = self.root.joinpath(*(encode_segment(s) for s in complete))
        result: builtins.list[str] = []
        for key in self._walk(directory, base_key, partial, start_after):
            result.append(key)
            if limit is not None and len(result) >= limit:
                break
        return result

    def _walk(
        self, directory: Path, base_key: str, partial: str, start_after: str | None
    ) -> Iterator[str]:
        """Yield the keys under ``directory`` in sorted order (see the module's naming)."""
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        items: list[tuple[str, bool, str]] = []  # (sort key, is_dir, entry name)
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue  # temp files
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                segment = decode_segment(name)
                if segment is None:
                    continue
                items.append((f"{base_key}{segment}/", True, name))
            elif name.endswith(_SUFFIX):
                segment = decode_segment(name[: -len(_SUFFIX)])
                if segment is None:
                    continue
                items.append((f"{base_key}{segment}", False, name))
        items.sort()
        prefix = base_key + partial
        for sort_key, is_dir, name in items:
            if not sort_key.startswith(prefix):
                continue
            if start_after is not None:
                # Every key in a subtree starts with sort_key; skip the subtree when
                # all of them sort at or before the cursor.
                if is_dir:
                    if sort_key < start_after and not start_after.startswith(sort_key):
                        continue
                elif sort_key <= start_after:
                    continue
            if is_dir:
                yield from self._walk(directory / name, sort_key, "", start_after)
            else:
                yield sort_key

    async def remove_temp_files(self, *, older_than: float = 3600.0) -> int:
        """Delete temp files left by killed writers; return how many were removed.

        Only ``.tmp-*`` files last modified more than ``older_than`` seconds ago are
        removed, so writes in flight in other processes are left alone.

        Raises:
            ValueError: ``older_than`` is negative.
        """
        if isinstance(older_than, bool) or not isinstance(older_than, int | float):
            raise TypeError(f"older_than must be a number, got {type(older_than).__name__}")
        if older_than < 0:
            raise ValueError(f"older_than must be >= 0, got {older_than}")
        return await asyncio.to_thread(self._remove_temp_sync, float(older_than))

    def _remove_temp_sync(self, older_than: float) -> int:
        if not self.root.is_dir():
            return 0
        removed = 0
        cutoff = time.time() - older_than
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                if not name.startswith(_TMP_PREFIX):
                    continue
                path = Path(dirpath) / name
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime <= cutoff:
                        path.unlink()
                        removed += 1
        return removed
