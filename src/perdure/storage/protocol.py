"""The ``Storage`` protocol: an async byte-blob store that only moves bytes (SPEC §6).

Higher layers (the snapshot session manager, memory, …) own their key layout and
formats; a backend stores opaque bytes under string keys. The contract every backend
keeps, checked by one shared test suite (``tests/storage/test_storage_contract.py``):

* ``write`` is an atomic replace: a reader sees the old bytes or the new bytes, never
  a mix, and after a crash (even SIGKILL or power loss, on a durable backend) the key
  holds one or the other. When ``write`` returns, the bytes are durable.
* ``read`` returns the bytes last written, or ``None`` for a missing key.
* ``delete`` is idempotent: deleting a missing key is not an error.
* ``list`` returns keys (not values) starting with ``prefix``, sorted by code point
  (the order of Python's ``sorted``), after ``start_after`` if given (exclusive),
  at most ``limit`` of them.
* Keys follow :func:`perdure.storage.validate_key`; a bad key raises ``ValueError``
  naming it, before any I/O.
* Every coroutine may be awaited from any event loop and any thread: a backend binds
  nothing to one loop.

:class:`ConditionalStorage` adds versions and conditional writes (obstore's
``PutMode`` is the model), so that two processes writing one blob never silently
overwrite each other; its suite is ``ConditionalStorageSuite`` in
:mod:`perdure.testing`. Every backend of perdure implements it.
A backend may also implement :class:`AppendStorage` (optional): conditional appends and
replaces, for formats that grow a blob by small records (the snapshot manager's
``snapshot_latest`` log). ``MemoryStorage`` and ``LocalFileStorage`` do — unless built
with a ``cipher``: a ciphertext cannot grow in place, so :func:`can_append` is how a
caller asks.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["AppendStorage", "ConditionalStorage", "Storage", "can_append"]


@runtime_checkable
class Storage(Protocol):
    """An async byte-blob store: atomic ``write``, ``read``, idempotent ``delete``, ``list``."""

    async def write(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, atomically replacing any previous value.

        After return the new bytes are durable; after a crash the key holds either the
        old or the new bytes, never a partial blob.

        Raises:
            ValueError: ``key`` is invalid (the message names it).
            TypeError: ``data`` is not bytes.
        """
        ...

    async def read(self, key: str) -> bytes | None:
        """Return the bytes stored under ``key``, or ``None`` if there are none.

        Raises:
            ValueError: ``key`` is invalid.
        """
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error (idempotent).

        Raises:
            ValueError: ``key`` is invalid.
        """
        ...

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        """Return the keys that start with ``prefix``, sorted, after ``start_after``.

        Args:
            prefix: Keys must start with this string (``""`` matches every key).
            limit: At most this many keys (``None``: all).
            start_after: Exclusive cursor: only keys sorting after it are returned.

        Raises:
            ValueError: ``prefix`` is invalid or ``limit`` is negative.
        """
        ...


@runtime_checkable
class ConditionalStorage(Storage, Protocol):
    """A :class:`Storage` whose blobs carry versions, with a compare-and-set write.

    Every write of a key — plain :meth:`~Storage.write` or :meth:`write_if` — gives
    it a version it never had before (a blob deleted and written again gets a new
    one too), so a version names one write, and an equal version means nothing was
    written since. Versions are opaque strings: compare them for equality only.
    """

    async def version(self, key: str) -> str | None:
        """The version of the blob under ``key``, or ``None`` when there is none.

        Raises:
            ValueError: ``key`` is invalid.
        """
        ...

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version is ``expected``.

        ``expected=None`` creates the blob and requires that there is none. The check
        and the write are one atomic step with respect to every other write and
        delete, in any process sharing the backend: of two writers that expect one
        version, one succeeds. Durable on return, like :meth:`~Storage.write`.

        Returns:
            The blob's new version.

        Raises:
            StorageConflictError: the blob's version is not ``expected`` (it exists
                when ``None`` was expected, is gone, or was written since); nothing
                was written.
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes, or ``expected`` neither a str nor None.
        """
        ...


@runtime_checkable
class AppendStorage(Protocol):
    """Optional beside :class:`Storage`: extend or replace a blob only if it ends as expected.

    Where a replace costs a temp file, two syncs and a rename (a local file), an append
    costs one write and one sync. Callers test :func:`can_append` (not a bare
    ``isinstance``: a storage with a cipher has the methods but refuses them) and fall
    back to :meth:`Storage.write` when it says no.

    Both methods compare and set on the blob's *end*: they act only if the blob is
    exactly ``size`` bytes long and its last bytes are ``tail`` (``size=None``: only if
    there is no blob); otherwise they raise
    :class:`~perdure.errors.StorageConflictError` and write nothing. The end
    identifies the content as well as the caller's format makes it: when each record
    ends with a hash chained over everything before it, an equal end means equal
    content; ``tail`` may also be the whole blob. The check and the change are atomic
    with respect to every other ``append`` and ``replace`` of the key, in any process
    sharing the backend, so of two writers that read the same end only one succeeds.
    (Plain ``write`` and ``delete`` are atomic but take no part in the check: they
    are ordered before or after an append as a whole.)
    """

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        """Add ``data`` at the end of the blob under ``key`` if it ends as expected.

        After return the whole blob is durable. A crash during the call leaves the old
        bytes followed by a prefix of ``data`` (none, some or all of it): a format
        that appends must recognise an incomplete last record. If the call raises, the
        blob is cut back to its old end first (should that fail as well, the blob is
        as a crash would leave it).

        Raises:
            StorageConflictError: the blob is missing or does not end as expected;
                nothing was written.
            ValueError: ``key`` is invalid, ``size`` negative or shorter than ``tail``.
            TypeError: ``data`` or ``tail`` is not bytes.
        """
        ...

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        """Atomically replace the blob under ``key`` with ``data`` if it ends as expected.

        ``size=None`` (and an empty ``tail``) creates the blob and requires that
        there is none. Durable on return; a crash leaves the old blob or the new one.

        Raises:
            StorageConflictError: the blob is not as expected (exists, is missing, or
                ends otherwise); nothing was written.
            ValueError: ``key`` is invalid, or ``size`` and ``tail`` disagree.
            TypeError: ``data`` or ``tail`` is not bytes.
        """
        ...


def can_append(storage: object) -> bool:
    """Whether ``storage`` takes :class:`AppendStorage` calls: it has the methods and
    no ``cipher`` (an encrypted blob is rewritten whole, never appended to)."""
    return isinstance(storage, AppendStorage) and getattr(storage, "cipher", None) is None
