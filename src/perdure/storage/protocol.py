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
:mod:`perdure.testing`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ConditionalStorage", "Storage"]


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
