"""Keep benchmarks/adapters.py from rotting: run it on a few items (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lg_support import import_langgraph
from oa_support import import_agents

from helpers import load_benchmark

import_agents()
import_langgraph()


def rows(out: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        line[:20].strip(): line[20:].split()
        for line in out.splitlines()
        if line[:20].strip() in names
    }


def test_the_smallest_benchmark_prints_every_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("adapters")
    argv = ["--items", "30", "--steps", "20", "--postgres", "", "--dir", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "at 30 items" in out
    session = out[: out.index("PerdureSaver (SQLite)")]
    found = rows(session, ("add µs/item", "get last 50 ms", "pop ms", "disk KB"))
    assert len(found) == 4
    assert "PerdureSaver (SQLite) vs LangGraph's SqliteSaver at 20 steps" in out
    graph = out[out.index("PerdureSaver (SQLite)") :]
    found.update(rows(graph, ("ms/step", "ms/step last 10%", "get_state ms", "disk MB")))
    assert len(found) == 8
    for values in found.values():
        assert all(float(value) > 0 for value in values)  # both sides measured
    assert "PerdureSaver vs PostgresSaver: not measured (no --postgres DSN" in out
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself


def test_the_postgres_rows_run_against_postgres_saver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import postgres_server

    dsn = postgres_server.require_server()
    pytest.importorskip("langgraph.checkpoint.postgres", reason="langgraph-checkpoint-postgres")
    bench = load_benchmark("adapters")
    argv = ["--items", "10", "--steps", "20", "--postgres", dsn, "--dir", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    graph = out[out.index("PerdureSaver (PostgreSQL) vs LangGraph's PostgresSaver at 20") :]
    found = rows(graph, ("ms/step", "get_state ms", "disk MB"))
    assert len(found) == 3
    for values in found.values():
        assert all(float(value) > 0 for value in values)
    # the benchmark's schemas are gone
    left = postgres_server.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_lg_%%'"
    )
    assert left == []
