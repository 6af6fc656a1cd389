"""Keep benchmarks/agent_path.py from rotting: run it with tiny sizes (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_benchmark

ROWS = [
    "no session",
    "file commit",
    "file invocation",
    "file none",
    "sqlite commit",
    "sqlite none",
    "snapshot message",
]


def test_the_tiny_benchmark_prints_every_row_and_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("agent_path")
    assert bench.main(["--turns", "3", "--resume-size", "40", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for label in ROWS:
        row = next(line for line in lines if line.startswith(label + " "))
        cells = row[len(label) :].split()
        assert len(cells) == 7, row  # fsync/msg, then async and sync: us, added, x fsync
        assert float(cells[1]) > 0
        assert float(cells[4]) > 0
        if label.endswith(("commit", "message")):
            assert cells[3] != "-"
            assert cells[6] != "-"
    assert "floors, same run: file append+fsync" in out
    assert "sync/async, bare turn:" in out
    assert "resume 40 messages, file, full history kept:" in out
    assert "resume 40 messages, sqlite, full history kept:" in out
    assert "restore 40 messages from a snapshot (SnapshotSessionManager):" in out
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
