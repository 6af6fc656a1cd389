"""Keep benchmarks/concurrency.py from rotting: a tiny run (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_benchmark


def test_the_tiny_benchmark_prints_a_row_per_store_and_count_and_the_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("concurrency")
    argv = ["--messages", "16", "--sessions", "1,2,16", "--dir", str(tmp_path)]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    for store in ("file", "sqlite"):
        for sessions in (1, 2, 16):
            row = next(line for line in lines if line.split()[:2] == [store, str(sessions)])
            cells = row.split()[2:]
            assert len(cells) == 8, row  # durable: rate p50 p99; none: rate p50 p99; 2 ratios
            assert float(cells[0].replace(",", "")) > 0
            assert float(cells[3].replace(",", "")) > 0
            if sessions == 1:
                assert cells[7] == "1.00"  # one durable session against itself
        verdict = next(line for line in lines if line.startswith(f"{store} x16: "))
        assert verdict.endswith(("met", "NOT met"))
    assert list(tmp_path.iterdir()) == []  # cleans up after itself


def test_bad_session_counts_are_refused_with_a_clear_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_benchmark("concurrency")
    with pytest.raises(SystemExit):
        bench.main(["--sessions", "1,x"])
    assert "--sessions must be numbers" in capsys.readouterr().err
