"""The one rule by which a storage's blobs are encrypted (SPEC §9), and ``EncryptedStorage``.

Every blob is stored as a cipher envelope (a fresh nonce each write, the key id
inside), so the backend only ever sees ciphertext: :func:`seal_blob` is what a write
stores, :func:`open_blob` what a read returns. Each of perdure's storages takes
``cipher=`` and calls these two; :class:`EncryptedStorage` calls them around any
other storage (a third party's). Keys and listing stay in clear: a key is a name the
layers above choose (session ids, checkpoint ids), never content.

A ciphertext cannot grow in place, so a storage with a cipher refuses
:class:`~perdure.storage.AppendStorage`'s ``append`` and ``replace``
(:func:`append_refused`); callers ask :func:`~perdure.storage.can_append` first.
"""

from __future__ import annotations

import builtins
from typing import Any

from perdure.crypto import Cipher
from perdure.storage.keys import check_data
from perdure.storage.protocol import ConditionalStorage, Storage

__all__ = ["EncryptedStorage", "append_refused", "open_blob", "seal_blob"]


def seal_blob(cipher: Cipher | None, data: Any) -> bytes:
    """What a storage stores for ``data``: its bytes, encrypted when there is a cipher.

    Each call encrypts afresh (a new nonce), so equal data is stored as different bytes.

    Raises:
        TypeError: ``data`` is not bytes-like.
    """
    blob = check_data(data)
    return blob if cipher is None else cipher.encrypt(blob)


def open_blob(cipher: Cipher | None, stored: bytes | None) -> bytes | None:
    """What a read returns for the ``stored`` bytes (``None``: no blob).

    Raises:
        DecryptionError: with a cipher, ``stored`` does not decrypt — a wrong or
            unknown key, altered bytes, or a blob written without encryption
            (``details["reason"] == "not_encrypted"``); never garbage.
    """
    return stored if cipher is None or stored is None else cipher.decrypt(stored)


def append_refused(storage: object, method: str) -> TypeError:
    """The error of ``append``/``replace`` on a storage that has a cipher."""
    return TypeError(
        f"{type(storage).__name__}.{method}: the storage has a cipher, and a ciphertext "
        "cannot grow or be checked in place; write whole blobs (callers test "
        "perdure.storage.can_append first)"
    )


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
        ValueError: ``storage`` encrypts already (built with its own ``cipher=``, or an
            ``EncryptedStorage``): every blob would be encrypted twice, and readable
            only through both.
    """

    def __init__(self, storage: Storage, cipher: Cipher) -> None:
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(storage).__name__}")
        if not isinstance(cipher, Cipher):
            raise TypeError(f"cipher must be a Cipher, got {type(cipher).__name__}")
        if getattr(storage, "cipher", None) is not None:
            raise ValueError(
                f"storage {storage!r} encrypts already (it has a cipher of its own): give "
                "the cipher once, to the storage or to what wraps it, not to both"
            )
        self.storage = storage
        self.cipher = cipher

    def __repr__(self) -> str:
        return f"EncryptedStorage({self.storage!r}, {self.cipher!r})"

    async def write(self, key: str, data: bytes) -> None:
        """Encrypt ``data`` and write it under ``key`` (see :meth:`Storage.write`)."""
        await self.storage.write(key, seal_blob(self.cipher, data))

    async def read(self, key: str) -> bytes | None:
        """The decrypted blob under ``key``, or ``None``.

        Raises:
            DecryptionError: the blob does not decrypt with this cipher.
        """
        return open_blob(self.cipher, await self.storage.read(key))

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
        blob = seal_blob(self.cipher, data)
        return await self._conditional().write_if(key, blob, expected=expected)

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
