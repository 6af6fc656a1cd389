"""``EncryptedStorage``: any :class:`~perdure.storage.Storage` with its blobs encrypted.

The one place a storage's bytes are encrypted (SPEC §9): wrap any backend — memory,
local file, SQLite, PostgreSQL, Redis, S3, a third party's — and every blob is stored
as a cipher envelope (a fresh nonce each write, the key id inside), so the backend
only ever sees ciphertext. Keys and listing stay in clear: a key is a name the layers
above choose (session ids, checkpoint ids), never content.
"""

from __future__ import annotations

import builtins

from perdure.crypto import Cipher
from perdure.storage.protocol import ConditionalStorage, Storage

__all__ = ["EncryptedStorage"]


class EncryptedStorage:
    """A :class:`~perdure.storage.ConditionalStorage` that encrypts every blob of another.

    ``write``/``write_if`` store ``cipher.encrypt(data)``; ``read`` decrypts, and a
    blob that does not decrypt (a wrong or missing key, altered bytes, a blob written
    without encryption) raises :class:`~perdure.errors.DecryptionError` — never
    garbage. Versions, keys, ``list`` and ``delete`` are the inner storage's. The
    guarantees of the inner storage (atomic, durable on return) hold unchanged. It
    is not an :class:`~perdure.storage.AppendStorage` (a ciphertext cannot grow in
    place): callers fall back to whole-blob writes.

    Args:
        storage: the backend that keeps the ciphertext.
        cipher: a :class:`~perdure.crypto.Cipher` (e.g.
            :class:`~perdure.crypto.AESGCMCipher`).

    Raises:
        TypeError: ``storage`` is not a Storage or ``cipher`` not a Cipher.
    """

    def __init__(self, storage: Storage, cipher: Cipher) -> None:
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(storage).__name__}")
        if not isinstance(cipher, Cipher):
            raise TypeError(f"cipher must be a Cipher, got {type(cipher).__name__}")
        self.storage = storage
        self.cipher = cipher

    def __repr__(self) -> str:
        return f"EncryptedStorage({self.storage!r}, {self.cipher!r})"

    async def write(self, key: str, data: bytes) -> None:
        """Encrypt ``data`` and write it under ``key`` (see :meth:`Storage.write`)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        await self.storage.write(key, self.cipher.encrypt(bytes(data)))

    async def read(self, key: str) -> bytes | None:
        """The decrypted blob under ``key``, or ``None``.

        Raises:
            DecryptionError: the blob does not decrypt with this cipher.
        """
        data = await self.storage.read(key)
        return None if data is None else self.cipher.decrypt(data)

    async def read_encrypted(self, key: str) -> bytes | None:
        """The blob as stored (the envelope), for tools that need no key (rotation)."""
        return await self.storage.read(key)

    async def delete(self, key: str) -> None:
        """Delete ``key`` (idempotent)."""
        await self.storage.delete(key)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> builtins.list[str]:
        """The inner storage's keys (see :meth:`Storage.list`)."""
        return await self.storage.list(prefix, limit=limit, start_after=start_after)

    async def version(self, key: str) -> str | None:
        """The inner blob's version (see :meth:`ConditionalStorage.version`).

        Raises:
            TypeError: the inner storage has no versions.
        """
        return await self._conditional().version(key)

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Encrypt ``data`` and write it if the blob is at ``expected`` (compare-and-set).

        Raises:
            StorageConflictError: as :meth:`ConditionalStorage.write_if` says.
            TypeError: ``data`` is not bytes, or the inner storage has no versions.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        inner = self._conditional()
        return await inner.write_if(key, self.cipher.encrypt(bytes(data)), expected=expected)

    def _conditional(self) -> ConditionalStorage:
        if not isinstance(self.storage, ConditionalStorage):
            raise TypeError(
                f"{type(self.storage).__name__} has no versions (not a ConditionalStorage)"
            )
        return self.storage

    def close(self) -> None:
        """Close the inner storage, if it has a ``close``."""
        close = getattr(self.storage, "close", None)
        if close is not None:
            close()

    async def aclose(self) -> None:
        """Close the inner storage's async resources, if it has an ``aclose``."""
        aclose = getattr(self.storage, "aclose", None)
        if aclose is not None:
            await aclose()
