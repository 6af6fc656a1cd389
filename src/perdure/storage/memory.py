"""MemoryStorage: a :class:`~perdure.storage.Storage` in a dict, for tests and demos.

Versions (:class:`~perdure.storage.ConditionalStorage`) are the numbers of one counter
per storage, taken by every write, so a key never has a version twice.
"""

from __future__ import annotations

import bisect

from perdure._runtime.threads import ProcessLock
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

__all__ = ["MemoryStorage"]


class MemoryStorage:
    """Keep blobs in process memory; nothing survives the process.

    Thread-safe and loop-agnostic (a thread lock, free again in a forked child; no
    I/O). ``write`` is atomic for readers in this process. Useful in tests of code
    that takes a ``Storage``. Implements :class:`~perdure.storage.ConditionalStorage`
    and :class:`~perdure.storage.AppendStorage` too.

    Args:
        cipher: a :class:`~perdure.crypto.Cipher`: every blob is kept encrypted
            (:func:`~perdure.storage.encrypted.seal_blob`) and ``append``/``replace``
            raise ``TypeError`` (see :func:`~perdure.storage.can_append`).

    Raises:
        TypeError: ``cipher`` is not a Cipher.
    """

    def __init__(self, *, cipher: Cipher | None = None) -> None:
        self.cipher = check_cipher(cipher)
        self._lock = ProcessLock()
        self._blobs: dict[str, bytes] = {}
        self._sorted: list[str] = []
        self._versions: dict[str, int] = {}
        self._counter = 0

    def _put(self, key: str, blob: bytes) -> str:
        """Store ``blob`` under ``key`` with a new version (the lock held); return it."""
        if key not in self._blobs:
            bisect.insort(self._sorted, key)
        self._blobs[key] = blob
        self._counter += 1
        self._versions[key] = self._counter
        return str(self._counter)

    async def write(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any previous value (see ``Storage``)."""
        validate_key(key)
        blob = seal_blob(self.cipher, data)
        with self._lock:
            self._put(key, blob)

    async def version(self, key: str) -> str | None:
        """The version of the blob under ``key``, or ``None`` (see ``ConditionalStorage``)."""
        validate_key(key)
        with self._lock:
            found = self._versions.get(key)
        return None if found is None else str(found)

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version is ``expected``
        (see ``ConditionalStorage``); return the new version."""
        validate_key(key)
        blob = seal_blob(self.cipher, data)
        check_expected(expected)
        with self._lock:
            found = self._versions.get(key)
            current = None if found is None else str(found)
            if current != expected:
                raise version_conflict("memory storage", key, expected, current)
            return self._put(key, blob)

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        """Add ``data`` to the blob under ``key`` if it ends as expected (see ``AppendStorage``)."""
        if self.cipher is not None:
            raise append_refused(self, "append")
        validate_key(key)
        blob = check_data(data)
        _, tail = check_end(size, tail, absent_ok=False)
        with self._lock:
            self._put(key, self._expect(key, size, tail) + blob)

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        """Replace the blob under ``key`` if it ends as expected (see ``AppendStorage``)."""
        if self.cipher is not None:
            raise append_refused(self, "replace")
        validate_key(key)
        blob = check_data(data)
        size, tail = check_end(size, tail, absent_ok=True)
        with self._lock:
            self._expect(key, size, tail)
            self._put(key, blob)

    def _expect(self, key: str, size: int | None, tail: bytes) -> bytes:
        """The blob under ``key`` if it ends as expected (``b""`` for an expected absence)."""
        current = self._blobs.get(key)
        if current is None:
            if size is None:
                return b""
            raise StorageConflictError(f"blob {key!r} is not as expected: it does not exist")
        if size is None:
            raise StorageConflictError(f"blob {key!r} is not as expected: it exists")
        if len(current) != size:
            raise StorageConflictError(
                f"blob {key!r} is not as expected: it is {len(current)} bytes, not {size}"
            )
        if not current.endswith(tail):
            raise StorageConflictError(f"blob {key!r} is not as expected: its last bytes differ")
        return current

    async def read(self, key: str) -> bytes | None:
        """Return the bytes under ``key`` or ``None`` (see ``Storage``)."""
        validate_key(key)
        with self._lock:
            found = self._blobs.get(key)
        return open_blob(self.cipher, found)

    async def delete(self, key: str) -> None:
        """Remove ``key`` if present (idempotent)."""
        validate_key(key)
        with self._lock:
            self._versions.pop(key, None)
            if self._blobs.pop(key, None) is not None:
                del self._sorted[bisect.bisect_left(self._sorted, key)]

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        """Return sorted keys starting with ``prefix`` after ``start_after`` (see ``Storage``)."""
        validate_list_args(prefix, limit, start_after)
        result: list[str] = []
        if limit == 0:
            return result
        with self._lock:
            start = bisect.bisect_left(self._sorted, prefix)
            if start_after is not None:
                start = max(start, bisect.bisect_right(self._sorted, start_after))
            for key in self._sorted[start:]:
                if not key.startswith(prefix):
                    break
                result.append(key)
                if limit is not None and len(result) >= limit:
                    break
        return result
