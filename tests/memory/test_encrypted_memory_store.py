"""Encrypted memory stores (SPEC §9): content and metadata stored as ciphertext, the
duplicate key keyed, and the full-text trade-off — a plaintext index unless search is
given up (``searchable=False``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crypto_keys import K1, cipher
from perdure.crypto import AESGCMCipher
from perdure.errors import DecryptionError
from perdure.memory import LocalMemoryStore
from perdure.testing.memory import MemoryStoreFactory, MemoryStoreSuite

SECRET = "alice.smith@example.com"


class TestEncryptedSearchableMemoryStore(MemoryStoreSuite):
    @pytest.fixture
    def memory_store_factory(self, tmp_path: Path) -> MemoryStoreFactory:
        return lambda namespace: LocalMemoryStore(
            tmp_path / "memory.sqlite", namespace=namespace, cipher=cipher()
        )


class TestEncryptedUnsearchableMemoryStore(MemoryStoreSuite):
    @pytest.fixture
    def memory_store_factory(self, tmp_path: Path) -> MemoryStoreFactory:
        return lambda namespace: LocalMemoryStore(
            tmp_path / "memory.sqlite", namespace=namespace, cipher=cipher(), searchable=False
        )


def _dump(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return "\n".join(db.iterdump())


async def test_without_search_nothing_of_the_text_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    store = LocalMemoryStore(path, namespace="u", cipher=cipher(), searchable=False)
    await store.add(f"write to {SECRET} about the zebra", metadata={"mail": SECRET})
    await store.add(f"WRITE to  {SECRET} about the zebra")  # the same memory
    assert await store.count() == 1
    (found,) = await store.search("zebra", limit=5)
    assert found.content == f"write to {SECRET} about the zebra"
    assert found.metadata["mail"] == SECRET
    assert await store.search("giraffe", limit=5) == []
    store.close()
    dump = _dump(path)
    assert "zebra" not in dump
    assert "alice" not in dump
    assert "~pd1~" in dump


async def test_searchable_keeps_a_plaintext_index_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    store = LocalMemoryStore(path, namespace="u", cipher=cipher())
    await store.add("the zebra likes tea")
    assert [e.content for e in await store.search("zebras", limit=5)] == ["the zebra likes tea"]
    store.close()
    with sqlite3.connect(path) as db:
        (content, terms) = db.execute("SELECT content, terms FROM memories").fetchone()
    assert "zebra" not in content  # the memory itself is ciphertext
    assert "zebra" in terms  # the index is not: the documented trade-off


async def test_a_wrong_or_missing_key_is_decryption_error(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    store = LocalMemoryStore(path, namespace="u", cipher=cipher())
    await store.add("the zebra likes tea")
    store.close()
    wrong = LocalMemoryStore(
        path, namespace="u", cipher=AESGCMCipher(keys={"k1": K1[::-1]}, active="k1")
    )
    with pytest.raises(DecryptionError):
        await wrong.list()
    wrong.close()
    keyless = LocalMemoryStore(path, namespace="u")
    with pytest.raises(DecryptionError):
        await keyless.search("zebra", limit=1)
    keyless.close()


def test_searchable_false_needs_a_cipher(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="searchable=False"):
        LocalMemoryStore(tmp_path / "m.sqlite", namespace="u", searchable=False)
    with pytest.raises(TypeError, match="cipher must be"):
        LocalMemoryStore(tmp_path / "m.sqlite", namespace="u", cipher="key")  # type: ignore[arg-type]
