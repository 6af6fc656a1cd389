"""Keep benchmarks/adapters.py from rotting: run it on a few items (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from oa_support import import_agents

from helpers import load_benchmark

import_agents()


def test_the_smallest_benchmark_prints_every_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("adapters")
    assert bench.main(["--items", "30", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "at 30 items" in out
    rows = {
        line[:20].strip(): line[20:].split()
        for line in out.splitlines()
        if line[:20].strip() in ("add µs/item", "get last 50 ms", "pop ms", "disk KB")
    }
    assert len(rows) == 4
    for values in rows.values():
        assert all(float(value) > 0 for value in values)  # both sides measured
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
