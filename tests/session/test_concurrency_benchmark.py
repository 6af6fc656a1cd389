"""Keep benchmarks/concurrency.py from rotting: a tiny run (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import hide_peer_sdks, load_benchmark


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
    assert any(
        line.startswith("peers: not measured. --peers adds the OpenAI Agents SDK's SQLiteSession")
        for line in lines
    )
    assert list(tmp_path.iterdir()) == []  # cleans up after itself


def test_the_tiny_benchmark_runs_postgres_rows_and_drops_their_schemas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import postgres_server

    reason = postgres_server.unreachable()
    if reason is not None:
        if postgres_server.IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    import psycopg

    bench = load_benchmark("concurrency")
    argv = ["--messages", "16", "--sessions", "1,16", "--stores", "postgres"]
    assert bench.main([*argv, "--dsn", postgres_server.DSN, "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for sessions in (1, 16):
        row = next(line for line in lines if line.split()[:2] == ["postgres", str(sessions)])
        assert float(row.split()[2].replace(",", "")) > 0
    assert not any(line.startswith("postgres x16: ") for line in lines)  # no target of its own
    with psycopg.connect(postgres_server.DSN) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_concurrency_%'"
        ).fetchall()
    assert left == []


def test_repeated_runs_print_each_table_and_the_targets_medians(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("concurrency")
    argv = ["--messages", "16", "--sessions", "1,16", "--repeat", "2", "--dir", str(tmp_path)]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("run ")] == ["run 1 of 2", "run 2 of 2"]
    assert sum(line.startswith("file x16: ") and "x none (target" in line for line in lines) == 2
    start = lines.index("over 2 runs (median, min-max; met: both medians meet the target):")
    assert [line.split(":")[0] for line in lines[start + 1 : start + 3]] == [
        "file x16",
        "sqlite x16",
    ]
    assert list(tmp_path.iterdir()) == []


def test_the_summary_takes_each_ratios_median_and_counts_the_runs_that_met_it() -> None:
    bench = load_benchmark("concurrency")

    def run(durable: float, none: float, one: float) -> list[Any]:
        return [
            bench.Row("file", 1, "commit", one, 1.0, 1.0),
            bench.Row("file", 1, "none", 10 * one, 1.0, 1.0),
            bench.Row("file", 16, "commit", durable, 1.0, 1.0),
            bench.Row("file", 16, "none", none, 1.0, 1.0),
        ]

    # x none: 0.8, 0.6, 0.75; x one: 4, 3, 2.5 -> medians 0.75 and 3.0: met, in 1 run of 3.
    lines = bench.summary([run(800, 1000, 200), run(600, 1000, 200), run(750, 1000, 300)])
    assert lines[1] == (
        "file x16: 0.75x none (0.60-0.80), 3.00x one (2.50-4.00); met in 1 of 3 runs; met"
    )
    lines = bench.summary([run(600, 1000, 200), run(650, 1000, 200)])
    assert lines[1].endswith("met in 0 of 2 runs; NOT met")


def test_a_repeat_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("concurrency")
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "0"])
    assert "--repeat must be at least 1, got 0" in capsys.readouterr().err


def test_bad_session_counts_are_refused_with_a_clear_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_benchmark("concurrency")
    with pytest.raises(SystemExit):
        bench.main(["--sessions", "1,x"])
    assert "--sessions must be numbers" in capsys.readouterr().err


# --- the peers' table (OpenAI Agents' SQLiteSession beside perdure's SQLite rows) -----


def canned_peers(messages: int, rows: dict[int, tuple[float, float, float]]) -> dict[str, Any]:
    """A result as benchmarks/peers_concurrency.py writes it: sessions -> (rate, p50, p99)."""
    peers = load_benchmark("peers_concurrency")
    return {
        "format": "perdure-peers-concurrency/1",
        "messages": messages,
        "sessions": sorted(rows),
        "python": "3.11.7",
        "peers": {
            "openai": {
                "version": "9.9.9",
                "rows": [
                    {
                        "sessions": n,
                        "turns": peers.turns_per_session(messages, n),
                        "rate": rate,
                        "p50_ms": p50,
                        "p99_ms": p99,
                    }
                    for n, (rate, p50, p99) in rows.items()
                ],
                "durability": {
                    "synchronous": "FULL",
                    "journal_mode": "wal",
                    "commits_per_turn": 2.0,
                },
                "how": "N SQLiteSession(f's{i}', one_db_file) and one Agent",
                "note": "SQLiteSession: journal_mode=wal, synchronous=FULL, 2 commits a turn",
            }
        },
    }


def cells_after(lines: list[str], first: str) -> list[str]:
    """The cells of the peers' table row for ``first`` sessions (the line after its header)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("perdure sqlite commit | "))
    return next(line.split() for line in lines[start:] if line.split()[:1] == [first])[1:]


def test_the_peers_table_sets_each_peer_row_against_perdures_durable_sqlite_row() -> None:
    bench = load_benchmark("concurrency")
    rows = [
        bench.Row("sqlite", 1, "commit", 1000.0, 2.0, 4.0),
        bench.Row("sqlite", 1, "none", 9000.0, 0.1, 0.2),
        bench.Row("file", 16, "commit", 99999.0, 1.0, 1.0),  # another store: not compared
        bench.Row("sqlite", 16, "commit", 6000.0, 5.0, 9.0),
        bench.Row("sqlite", 16, "none", 8000.0, 3.0, 4.0),
    ]
    document = canned_peers(16, {1: (500.0, 3.5, 7.25), 16: (400.0, 80.0, 150.0), 4: (50, 1, 2)})
    lines = bench.peers_table(rows, bench.check_peers(document, 16))
    assert "perdure sqlite commit | OpenAI Agents 9.9.9, SQLiteSession" in lines
    header = next(line for line in lines if line.lstrip().startswith("sessions"))
    assert header.split() == [
        "sessions", "perdure", "msg/s", "p50", "ms", "p99", "ms",
        "peer", "msg/s", "p50", "ms", "p99", "ms", "x",
    ]  # fmt: skip
    assert cells_after(lines, "1") == ["1,000", "2.00", "4.00", "500", "3.50", "7.25", "2.00x"]
    assert cells_after(lines, "16") == ["6,000", "5.00", "9.00", "400", "80.00", "150.00", "15.00x"]
    # a count this run did not measure: the peer's figures, no ratio
    assert cells_after(lines, "4") == ["-", "-", "-", "50", "1.00", "2.00", "-"]
    text = "\n".join(lines)
    assert "x = perdure / peer messages/s (above 1: perdure is faster)" in text
    assert "durability as it ships: SQLiteSession: journal_mode=wal, synchronous=FULL" in text


def test_a_peer_that_failed_is_named_with_its_error() -> None:
    bench = load_benchmark("concurrency")
    document = canned_peers(16, {1: (500.0, 3.5, 7.25)})
    document["peers"]["openai"] = {"version": "9.9.9", "error": "ImportError: no agents"}
    lines = bench.peers_table([], bench.check_peers(document, 16))
    assert "OpenAI Agents 9.9.9, SQLiteSession: failed: ImportError: no agents" in lines
    assert not any(line.startswith("perdure sqlite commit | ") for line in lines)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="perdure-peers/2"), "not a result of benchmarks/peers_conc"),
        (lambda d: d.update(messages=4000), "the peers ran 4000 messages a row; this run: 16"),
        (lambda d: d.update(peers=[]), "no 'peers' object"),
        (lambda d: d["peers"].update(openai="fast"), "peer 'openai': expected an object"),
        (lambda d: d["peers"]["openai"].update(rows=[]), "peer 'openai': no 'rows'"),
        (lambda d: d["peers"]["openai"]["rows"][1].update(sessions=1), "a new count >= 1"),
        (lambda d: d["peers"]["openai"]["rows"][0].update(sessions=0), "a new count >= 1"),
        (
            lambda d: d["peers"]["openai"]["rows"][1].update(turns=8),
            "16 sessions ran 8 turns each; this run: 4",
        ),
        (lambda d: d["peers"]["openai"]["rows"][0].update(rate="fast"), "rate must be a positive"),
        (lambda d: d["peers"]["openai"]["rows"][1].update(p99_ms=0), "p99_ms must be a positive"),
        (lambda d: d["peers"]["openai"]["rows"][1].pop("p50_ms"), "p50_ms must be a positive"),
    ],
)
def test_a_result_that_is_not_the_peers_for_this_run_is_refused(change: Any, message: str) -> None:
    bench = load_benchmark("concurrency")
    document = canned_peers(16, {1: (500.0, 3.5, 7.25), 16: (400.0, 80.0, 150.0)})
    change(document)
    with pytest.raises(ValueError, match=message):
        bench.check_peers(document, 16)


def test_the_tiny_benchmark_prints_the_peers_table_from_a_result_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("concurrency")
    result = tmp_path / "peers.json"
    result.write_text(json.dumps(canned_peers(16, {1: (10.0, 3.0, 6.0), 3: (20.0, 4.0, 8.0)})))
    work = tmp_path / "work"
    work.mkdir()
    argv = ["--messages", "16", "--sessions", "1,3", "--stores", "sqlite", "--dir", str(work)]
    assert bench.main([*argv, "--peers-json", str(result)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("peers: not measured") for line in lines)
    for n, peer_rate in ((1, 10.0), (3, 20.0)):
        durable = next(line for line in lines if line.split()[:2] == ["sqlite", str(n)]).split()
        cells = cells_after(lines, str(n))
        assert cells[:3] == durable[2:5]  # perdure's durable SQLite row of this run
        rate = float(durable[2].replace(",", ""))
        assert cells[3] == f"{peer_rate:,.0f}"
        assert float(cells[-1].rstrip("x")) == pytest.approx(
            rate / peer_rate, rel=5e-3, abs=0.006
        )  # rate shown rounded
    assert list(work.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--peers", "--stores", "file"], "--stores must include sqlite"),
        (["--peers-venv", "{nowhere}", "--stores", "file"], "--stores must include sqlite"),
        (["--peers-json", "{missing}"], "No such file"),
        (["--peers-json", "{garbage}"], "--peers-json"),
        (["--peers-json", "{result}", "--messages", "32"], "the peers ran 16 messages a row"),
    ],
)
def test_bad_peers_arguments_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    bench = load_benchmark("concurrency")
    result = tmp_path / "peers.json"
    result.write_text(json.dumps(canned_peers(16, {1: (10.0, 3.0, 6.0)})))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    paths = {
        "missing": tmp_path / "missing.json",
        "garbage": garbage,
        "result": result,
        "nowhere": tmp_path / "nowhere",
    }
    argv = ["--messages", "16", "--sessions", "1", "--dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, *(arg.format(**paths) for arg in extra)])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()  # no venv made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.json", "peers.json"]


def test_the_peers_script_writes_a_result_the_table_reads_even_without_the_sdk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """perdure's environment need not have the OpenAI Agents SDK: the peer fails, clearly."""
    hide_peer_sdks(monkeypatch)
    peers = load_benchmark("peers_concurrency")
    bench = load_benchmark("concurrency")
    out = tmp_path / "peers.json"
    argv = ["--sessions", "1,2", "--messages", "16", "--dir", str(tmp_path / "run")]
    assert peers.main([*argv, "--out", str(out)]) == 0
    document = bench.check_peers(json.loads(out.read_text()), 16)
    assert document["sessions"] == [1, 2]
    assert document["peers"]["openai"]["error"].startswith("ModuleNotFoundError")
    with pytest.raises(SystemExit):
        peers.main([*argv, "--out", str(out), "--only", "crewai"])
    assert "unknown peers ['crewai']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peers.main(["--sessions", "0", *argv[2:], "--out", str(out)])
    assert "--sessions needs numbers >= 1" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("agents") is None, reason="the OpenAI Agents SDK is not installed"
)
def test_the_peers_script_measures_the_sdk_in_its_own_process(tmp_path: Path) -> None:
    """Where the SDK is installed (perdure's dev environment has it, for the adapter), the
    script runs for real, in a process of its own as concurrency.py runs it."""
    bench = load_benchmark("concurrency")
    args = ["--sessions", "1,3", "--messages", "12", "--dir", str(tmp_path / "run")]
    document = bench.check_peers(
        bench.run_peers_script(Path(sys.executable), bench.PEERS_SCRIPT, args, tmp_path / "o.json"),
        12,
    )
    result = document["peers"]["openai"]
    assert "error" not in result, result
    assert [(row["sessions"], row["turns"]) for row in result["rows"]] == [(1, 6), (3, 4)]
    assert all(row["rate"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0 for row in result["rows"])
    assert result["durability"]["journal_mode"] in ("wal", "delete")
    assert result["durability"]["commits_per_turn"] > 0
    # one database file a row, holding every session's items (the script checked each)
    for n in (1, 3):
        assert [p.name for p in (tmp_path / "run" / "openai" / f"sessions-{n}").glob("*.db")] == [
            "agents.db"
        ]
