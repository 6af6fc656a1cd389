"""Keep benchmarks/sessions.py from rotting: run its smallest case (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_benchmark


def test_the_smallest_benchmark_prints_a_row_per_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("sessions")
    assert bench.main(["--quick", "--sizes", "120", "--dir", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    measured = {row[0]: row for row in rows if row and row[0] in ("file", "sqlite")}
    assert set(measured) == {"file", "sqlite"}
    for row in measured.values():
        assert row[1] == "120"
        assert all(float(value) > 0 for value in row[2:])  # every figure was measured
    encrypted = {row[0]: row for row in rows if row and row[0] in ("file+aes", "sqlite+aes")}
    assert set(encrypted) == {"file+aes", "sqlite+aes"}
    for row in encrypted.values():
        assert row[1] == "120"
        assert all(float(value) > 0 for value in row[2:])
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
