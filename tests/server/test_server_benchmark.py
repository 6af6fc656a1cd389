"""Keep benchmarks/server.py from rotting: run it with --quick (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_benchmark


def test_the_quick_benchmark_prints_a_row_per_store_and_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("server")
    args = ["--quick", "--size", "300", "--requests", "3", "--sessions", "120"]
    assert bench.main([*args, "--dir", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    measured = [row for row in rows if row and row[0] in ("file", "sqlite")]
    assert [(row[0], row[1]) for row in measured] == [
        ("file", "newest"),
        ("file", "middle"),
        ("file", "show"),
        ("sqlite", "newest"),
        ("sqlite", "middle"),
        ("sqlite", "show"),
        ("file", "120"),
        ("sqlite", "120"),
    ]
    for row in measured:
        assert all(float(value) > 0 for value in row[2:])  # every figure was measured
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
