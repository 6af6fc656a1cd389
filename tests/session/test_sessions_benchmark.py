"""Keep benchmarks/sessions.py from rotting: run its smallest case (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "sessions.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("perdure_benchmark_sessions", BENCHMARK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_smallest_benchmark_prints_a_row_per_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load()
    assert bench.main(["--quick", "--sizes", "120", "--dir", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    measured = {row[0]: row for row in rows if row and row[0] in ("file", "sqlite")}
    assert set(measured) == {"file", "sqlite"}
    for row in measured.values():
        assert row[1] == "120"
        assert all(float(value) > 0 for value in row[2:])  # every figure was measured
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
