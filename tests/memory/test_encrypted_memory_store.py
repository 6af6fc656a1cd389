"""Encrypted memory stores (SPEC §9): content and metadata stored as ciphertext, the
duplicate key keyed, and the full-text trade-off — a plaintext index unless search is
given up (``searchable=False``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crypto_keys import K1, K2, cipher
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


async def test_rotate_keys_re_encrypts_every_namespace_and_keeps_duplicates_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.sqlite"
    for namespace in ("u", "v"):
        old = LocalMemoryStore(path, namespace=namespace, cipher=cipher("k1"))
        await old.add(f"{namespace} likes the zebra", metadata={"n": namespace})
        await old.add(f"{namespace} likes tea")
        old.close()
    plain = LocalMemoryStore(path, namespace="u")
    await plain.add("written before encryption")
    plain.close()
    rotating = LocalMemoryStore(path, namespace="u", cipher=cipher("k2"))
    assert await rotating.rotate_keys() == 4  # the plain one needs force
    assert await rotating.rotate_keys() == 0  # nothing left: a second run resumes
    assert await rotating.rotate_keys(force=True) == 5
    rotating.close()
    only_k2 = AESGCMCipher(keys={"k2": K2}, active="k2")
    for namespace in ("u", "v"):
        store = LocalMemoryStore(path, namespace=namespace, cipher=only_k2)
        contents = sorted(e.content for e in await store.list())
        assert f"{namespace} likes the zebra" in contents
        await store.add(f"{namespace.upper()} LIKES TEA")  # the same memory: deduplicated
        assert await store.count() == (3 if namespace == "u" else 2)
        store.close()
    assert "written before" not in _dump(path)
