"""Storages built with ``cipher=`` (SPEC §9, issue 20): memory, local file, SQLite.

Each runs the plain contract suites with a cipher, and perdure.testing's
CipherStorageSuite (ciphertext at rest, a fresh nonce, a wrong or missing key, a plain
blob, altered bytes, no appends); EncryptedStorage, the wrapper kept for third-party
storages, runs the same suite. PostgreSQL, Redis and S3 do the same in their own
test modules. Then: ``open_storage(url, cipher=)`` builds the backend with the
cipher, and a snapshot manager over an encrypted file storage writes whole blobs,
restores, and leaves nothing readable on disk.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from storage_backends import MemoryView, make_cipher_storage, make_storage

from crypto_keys import cipher
from perdure import Agent
from perdure.crypto import Cipher, is_envelope
from perdure.errors import DecryptionError
from perdure.models import ScriptedModel
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.storage import (
    EncryptedStorage,
    LocalFileStorage,
    MemoryStorage,
    SQLiteStorage,
    Storage,
    can_append,
    open_storage,
)
from perdure.testing import (
    CipherStorageSuite,
    ConditionalStorageSuite,
    StorageSuite,
)
from perdure.testing.storage import CipherStorageFactory, StorageFactory
from pii import CARD, EMAIL, SECRETS, assert_found, assert_nothing_leaked, files_under


class TestMemoryStorageWithCipher(StorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_cipher_storage("memory", tmp_path, cipher())


class TestMemoryConditionalStorageWithCipher(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_cipher_storage("memory", tmp_path, cipher())


class TestMemoryStorageEncryption(CipherStorageSuite):
    @pytest.fixture
    def cipher_storage_factory(self, tmp_path: Path) -> CipherStorageFactory:
        return lambda c: make_cipher_storage("memory", tmp_path, c)


class TestLocalFileStorageWithCipher(StorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_cipher_storage("local_file", tmp_path, cipher())


class TestLocalFileConditionalStorageWithCipher(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_cipher_storage("local_file", tmp_path, cipher())


class TestLocalFileStorageEncryption(CipherStorageSuite):
    @pytest.fixture
    def cipher_storage_factory(self, tmp_path: Path) -> CipherStorageFactory:
        return lambda c: make_cipher_storage("local_file", tmp_path, c)


class TestSQLiteStorageWithCipher(StorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_cipher_storage("sqlite", tmp_path, cipher())


class TestSQLiteConditionalStorageWithCipher(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_cipher_storage("sqlite", tmp_path, cipher())


class TestSQLiteStorageEncryption(CipherStorageSuite):
    @pytest.fixture
    def cipher_storage_factory(self, tmp_path: Path) -> CipherStorageFactory:
        return lambda c: make_cipher_storage("sqlite", tmp_path, c)


class TestEncryptedStorageEncryption(CipherStorageSuite):
    """The wrapper keeps the same promises over a storage that has no cipher."""

    @pytest.fixture
    def cipher_storage_factory(self, tmp_path: Path) -> CipherStorageFactory:
        def factory(c: Cipher | None) -> Storage:
            inner = make_storage("local_file", tmp_path)
            return inner if c is None else EncryptedStorage(inner, c)

        return factory


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_bad_cipher_is_named() -> None:
    for build in (
        lambda bad: MemoryStorage(cipher=bad),
        lambda bad: LocalFileStorage("x", cipher=bad),
        lambda bad: SQLiteStorage("x.db", cipher=bad),
        lambda bad: open_storage("memory:", cipher=bad),
    ):
        with pytest.raises(TypeError, match=r"cipher must be a perdure\.crypto\.Cipher"):
            build(b"not a cipher")


def test_a_storage_appends_only_without_a_cipher(tmp_path: Path) -> None:
    assert can_append(MemoryStorage())
    assert can_append(LocalFileStorage(tmp_path))
    assert not can_append(MemoryStorage(cipher=cipher()))
    assert not can_append(LocalFileStorage(tmp_path, cipher=cipher()))
    assert not can_append(MemoryView(MemoryStorage(), cipher()))
    assert not can_append(EncryptedStorage(MemoryStorage(), cipher()))
    assert not can_append(SQLiteStorage(tmp_path / "b.db"))  # no append methods


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory:", MemoryStorage),
        ("file:{}/f", LocalFileStorage),
        ("sqlite:{}/s.db", SQLiteStorage),
    ],
)
def test_open_storage_builds_the_backend_with_the_cipher(
    url: str, kind: type, tmp_path: Path
) -> None:
    storage = open_storage(url.format(tmp_path), cipher=cipher())
    assert type(storage) is kind  # not wrapped: the backend itself encrypts
    run(storage.write("a/b", EMAIL.encode()))
    assert run(storage.read("a/b")) == EMAIL.encode()
    if isinstance(storage, SQLiteStorage):
        storage.close()
    plain = open_storage(url.format(tmp_path))
    if not isinstance(plain, MemoryStorage):  # a new memory: storage is empty
        stored = run(plain.read("a/b"))
        assert is_envelope(stored)
        assert EMAIL.encode() not in stored
        if isinstance(plain, SQLiteStorage):
            plain.close()
        assert_nothing_leaked(tmp_path)


def _agent(manager: SnapshotSessionManager, script: list[Any]) -> Agent:
    return Agent(agent_id="a1", model=ScriptedModel(script), session_manager=manager)


@pytest.mark.parametrize("where", ["storage", "manager"])
def test_a_snapshot_manager_over_an_encrypted_file_storage(where: str, tmp_path: Path) -> None:
    """Whole blobs are written (no appends to a ciphertext); it saves, restores, and
    nothing readable is on disk — the secrets in clear, compact, JSON or base64."""
    root = tmp_path / "blobs"

    def manager(c: Cipher | None) -> SnapshotSessionManager:
        if where == "storage":
            storage = LocalFileStorage(root, cipher=c)
            return SnapshotSessionManager("s1", storage=storage, save_latest_on="message")
        return SnapshotSessionManager(
            "s1", storage=LocalFileStorage(root), save_latest_on="message", cipher=c
        )

    first = manager(cipher())
    agent = _agent(first, [f"Noted: {CARD}.", "Done."])
    agent(f"I am {EMAIL}; my card is {CARD}.")
    agent("And again.")
    agent.state.set("contact", EMAIL)
    run(first.save_snapshot(agent, is_latest=False))
    run(first.save_snapshot(agent, is_latest=True))
    assert len(list(files_under(root))) >= 2
    assert_nothing_leaked(root)
    blobs = [path.read_bytes() for path in files_under(root)]
    assert all(is_envelope(blob) for blob in blobs)

    again = manager(cipher())
    resumed = _agent(again, ["ok"])
    text = json.dumps(resumed.messages)
    assert EMAIL in text
    assert CARD in text
    assert len(resumed.messages) == 4
    assert resumed.state.get("contact") == EMAIL
    resumed("one more")  # the restored history is saved again, still encrypted
    assert len(_agent(manager(cipher()), []).messages) == 6
    assert_nothing_leaked(root)

    # Without the key: an error, never the ciphertext read as a snapshot.
    with pytest.raises(DecryptionError):
        _agent(manager(None), [])


def test_the_leak_check_finds_a_plain_snapshot(tmp_path: Path) -> None:
    """The same run without a cipher does leave the secrets, and the check sees them."""
    manager = SnapshotSessionManager(
        "s1", storage=LocalFileStorage(tmp_path), save_latest_on="message"
    )
    agent = _agent(manager, ["Noted."])
    agent(f"I am {EMAIL}; my card is {CARD}.")
    written = b"".join(path.read_bytes() for path in files_under(tmp_path))
    for secret in (EMAIL, CARD):
        assert secret in SECRETS
        assert_found(written, secret)
