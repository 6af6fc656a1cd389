"""Keep benchmarks/multiagent.py from rotting: run it small (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_benchmark


def test_the_quick_benchmark_prints_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        load_benchmark("multiagent").main(["--quick", "--nodes", "12", "--dir", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "fsync floor" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("function", "agent"))]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("function", "(snapshot)", "first"),
        ("function", "(snapshot)", "last"),
        ("agent", "(snapshot)", "first"),
        ("agent", "(snapshot)", "last"),
        ("function", "(Session)", "first"),
        ("function", "(Session)", "last"),
    ]
    # save, floor, x floor, rhythm, x rhythm, off-loop floor, x off: all measured
    assert all(len(r) == 10 for r in rows)
    assert all(float(value) > 0 for r in rows for value in r[3:])
    restore = [line for line in out.splitlines() if line.startswith("not in the save column")]
    assert len(restore) == 1
    assert float(restore[0].rsplit(" ", 2)[-2]) > 0  # "... median 0.167 ms"
