"""The SessionStore contract (SPEC §7): each of perdure's stores runs the suite in
``perdure.testing`` exactly as a third-party store would."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from session_stores import make_store

from perdure.session import FileSessionStore, SessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing import SessionStoreSuite
from perdure.testing.sessions import StoreFactory


class TestFileSessionStore(SessionStoreSuite):
    durability_options = ("commit", "invocation", "none")
    supports_history_page = True
    supports_checkpoints = True
    supports_ttl = True

    def stored_message_count(self, store: SessionStore, needle: str) -> int | None:
        assert isinstance(store, FileSessionStore)
        found = 0
        for path in (store.root / "sessions").rglob("*"):
            if path.is_file() and "checkpoints" not in path.relative_to(store.root).parts:
                found += path.read_bytes().count(needle.encode())
        return found

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: make_store("file", tmp_path, **options)


class TestSQLiteSessionStore(SessionStoreSuite):
    durability_options = ("commit", "invocation", "none")
    supports_history_page = True
    supports_checkpoints = True
    supports_ttl = True

    def stored_message_count(self, store: SessionStore, needle: str) -> int | None:
        assert isinstance(store, SQLiteSessionStore)
        with contextlib.closing(sqlite3.connect(store.path)) as conn:
            row = conn.execute(
                "SELECT count(*) FROM perdure_messages WHERE body LIKE ?", (f"%{needle}%",)
            ).fetchone()
        return int(row[0])

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: make_store("sqlite", tmp_path, **options)


class TestMemorySessionStore(SessionStoreSuite):
    durable_across_reopen = False
    supports_history_page = True
    supports_checkpoints = True
    supports_ttl = True

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        def factory(**options: object) -> SessionStore:
            return make_store("memory", Path(), **options)

        return factory


# Encryption at rest (SPEC §9): the same contract with every body, state and
# checkpoint encrypted; the suite sees no difference.


def _cipher() -> object:
    from perdure.crypto import AESGCMCipher

    return AESGCMCipher(keys={"k1": bytes(range(32))}, active="k1")


class TestEncryptedSQLiteSessionStore(TestSQLiteSessionStore):
    def stored_message_count(self, store: SessionStore, needle: str) -> int | None:
        return None  # the bodies are ciphertext: no needle to find

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: make_store("sqlite", tmp_path, cipher=_cipher(), **options)


class TestEncryptedMemorySessionStore(TestMemorySessionStore):
    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        def factory(**options: object) -> SessionStore:
            return make_store("memory", Path(), cipher=_cipher(), **options)

        return factory


class TestEncryptedFileSessionStore(TestFileSessionStore):
    def stored_message_count(self, store: SessionStore, needle: str) -> int | None:
        return None  # the bodies are ciphertext: no needle to find

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: make_store("file", tmp_path, cipher=_cipher(), **options)
