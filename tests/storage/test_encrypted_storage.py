"""EncryptedStorage: every backend's contract holds with its blobs encrypted (SPEC §9).

The wrapper is kept for third-party storages (perdure's own take ``cipher=``; see
test_storage_cipher.py, which also runs CipherStorageSuite over the wrapper)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from storage_backends import make_storage

from perdure.crypto import AESGCMCipher, envelope_key_id
from perdure.errors import DecryptionError
from perdure.storage import (
    EncryptedStorage,
    LocalFileStorage,
    MemoryStorage,
    SQLiteStorage,
    open_storage,
)
from perdure.testing.storage import ConditionalStorageSuite, StorageFactory
from pii import files_under

K1 = bytes(range(32))
CIPHER = AESGCMCipher(keys={"k1": K1}, active="k1")


class TestEncryptedMemoryStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: EncryptedStorage(make_storage("memory", tmp_path), CIPHER)


class TestEncryptedLocalFileStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: EncryptedStorage(make_storage("local_file", tmp_path), CIPHER)


class TestEncryptedSQLiteStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: EncryptedStorage(make_storage("sqlite", tmp_path), CIPHER)


async def test_the_backend_only_ever_holds_ciphertext(tmp_path: Path) -> None:
    storage = EncryptedStorage(open_storage(f"file:{tmp_path}"), CIPHER)
    await storage.write("a/b", b"alice@example.com")
    assert await storage.read("a/b") == b"alice@example.com"
    written = b"".join(path.read_bytes() for path in files_under(tmp_path))
    assert written
    assert b"alice" not in written
    assert envelope_key_id(await storage.read_encrypted("a/b") or b"") == "k1"
    # Without the key, or with another: an error, never the ciphertext as if it were data.
    other = EncryptedStorage(LocalFileStorage(tmp_path), AESGCMCipher({"k1": K1[::-1]}, "k1"))
    with pytest.raises(DecryptionError):
        await other.read("a/b")


async def test_sqlite_rows_hold_ciphertext(tmp_path: Path) -> None:
    inner = SQLiteStorage(tmp_path / "b.db")
    storage = EncryptedStorage(inner, CIPHER)
    await storage.write("k", b"alice@example.com")
    inner.close()
    with sqlite3.connect(tmp_path / "b.db") as db:
        dump = "\n".join(db.iterdump())
    assert "alice" not in dump


async def test_a_plain_blob_read_through_the_cipher_is_refused() -> None:
    inner = MemoryStorage()
    await inner.write("k", b"plain")
    with pytest.raises(DecryptionError, match="not an encrypted"):
        await EncryptedStorage(inner, CIPHER).read("k")


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="storage must be a Storage"):
        EncryptedStorage(object(), CIPHER)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cipher must be a Cipher"):
        EncryptedStorage(MemoryStorage(), object())  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["memory", "local_file", "sqlite"])
def test_a_storage_that_encrypts_already_is_refused_not_encrypted_twice(
    tmp_path: Path, kind: str
) -> None:
    from perdure.session import SnapshotSessionManager

    storage = {
        "memory": lambda: MemoryStorage(cipher=CIPHER),
        "local_file": lambda: LocalFileStorage(tmp_path / "blobs", cipher=CIPHER),
        "sqlite": lambda: SQLiteStorage(tmp_path / "blobs.db", cipher=CIPHER),
    }[kind]()
    with pytest.raises(ValueError, match="encrypts already"):
        EncryptedStorage(storage, CIPHER)
    with pytest.raises(ValueError, match="encrypts already"):
        SnapshotSessionManager("s", storage=storage, cipher=CIPHER)
    with pytest.raises(ValueError, match="encrypts already"):
        EncryptedStorage(EncryptedStorage(MemoryStorage(), CIPHER), CIPHER)
    SnapshotSessionManager("s", storage=storage)  # the storage's own cipher alone is fine
    SnapshotSessionManager("s", storage=MemoryStorage(), cipher=CIPHER)
    if isinstance(storage, SQLiteStorage):
        storage.close()
