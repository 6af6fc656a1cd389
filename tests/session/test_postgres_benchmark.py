"""Keep benchmarks/postgres.py from rotting: the side-by-side table from canned results
(no server, no peers' venv), and tiny runs against the real server (no timing asserted)."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from helpers import hide_peer_sdks, load_benchmark
from postgres_server import DSN, execute, require_server, schema_fixture

# perdure's figures at the side-by-side size, as perdure_side() hands them to the table.
PERDURE = {
    "turns": 20,
    "floor_us": 500.0,
    "faces": {"async": 1000.0, "sync": 1250.0},
    "resume_ms": 50.0,
    "page_ms": 1.5,
    "table_bytes": 5_000_000.0,
    "messages": 10_000.0,
}


def canned_peers(size: int = 10_000, turns: int = 20) -> dict[str, Any]:
    """A result as benchmarks/peers_postgres.py writes it."""

    def peer(
        version: str, label: str, face: str, turn_us: float, resume_ms: float, page_ms: float
    ) -> dict[str, Any]:
        return {
            "version": version,
            "label": label,
            "face": face,
            "turn_us": turn_us,
            "resume_ms": resume_ms,
            "page_ms": page_ms,
            "table_bytes": 20_000_000,
            "tables": {"t": 20_000_000},
            "messages": size + 2 * turns,
            "turn_how": f"how {version} turns",
            "resume_how": f"how {version} resumes",
            "page_how": f"how {version} pages",
            "durability": {"synchronous_commit": "on"},
            "note": f"what {version} syncs",
        }

    return {
        "format": "perdure-peers-postgres/1",
        "size": size,
        "turns": turns,
        "server": "15.20",
        "python": "3.11.7",
        "floor_us": 700.0,
        "peers": {
            # against perdure's sync row (1250 us) and its async row (1000 us)
            "langgraph": peer(
                "1.0.0", "LangGraph {version}, PostgresSaver", "sync", 5000.0, 100.0, 3.0
            ),
            "openai": peer(
                "2.0.0", "OpenAI Agents {version}, SQLAlchemySession", "async", 3000.0, 75.0, 6.0
            ),
        },
    }


def row(lines: list[str], start: str) -> list[str]:
    return next(line for line in lines if line.startswith(start))[len(start) :].split()


def table(document: dict[str, Any] | None) -> list[str]:
    bench = load_benchmark("postgres")
    checked = None if document is None else bench.check_peers(document, 10_000, 20)
    return list(bench.side_by_side(PERDURE, 10_000, checked))


def test_the_side_by_side_sets_each_peer_against_perdures_row_of_its_face() -> None:
    lines = table(canned_peers())
    assert lines[0].startswith("side by side on the same server: 10000 messages stored, then 20")
    assert lines[1].endswith("median: perdure's run 500 us, the peers' run 700 us")
    label = "perdure, Agent + Session, PostgresSessionStore"
    # face, us/msg, resume ms, tail50 ms, table MB, B/msg, msgs
    assert row(lines, label + "   async") == ["1000", "50.0", "1.50", "5.0", "500", "10000"]
    assert row(lines, label + "    sync") == ["1250", "50.0", "1.50", "5.0", "500", "10000"]
    assert row(lines, "LangGraph 1.0.0, PostgresSaver") == [
        "sync", "5000", "100.0", "3.00", "20.0", "1992", "10040"
    ]  # fmt: skip
    assert row(lines, "OpenAI Agents 2.0.0, SQLAlchemySession") == [
        "async", "3000", "75.0", "6.00", "20.0", "1992", "10040"
    ]  # fmt: skip
    assert row(lines, "peer / perdure") == ["us/msg", "resume", "tail50", "B/msg"]
    # LangGraph's invoke against perdure's agent(...); the Runner against invoke_async;
    # the size per message held (1992 B against 500 B).
    assert row(lines, "LangGraph / perdure sync") == ["4.00x", "2.00x", "2.00x", "3.98x"]
    assert row(lines, "OpenAI Agents / perdure async") == ["3.00x", "1.50x", "4.00x", "3.98x"]
    text = " ".join(" ".join(lines).split())
    for version, name in (("1.0.0", "LangGraph"), ("2.0.0", "OpenAI Agents")):
        assert (
            f"{name}: how {version} turns; resume: how {version} resumes; tail page: how " in text
        )
        assert f"{name}: what {version} syncs" in text
    assert "perdure: Agent(model=instant" in text
    assert "read_history_page(store, id, offset=n-50, limit=50)" in text
    assert lines[-1] == (
        "perdure ahead on every column (faster; B/msg: smaller): "
        "yes (closest: OpenAI Agents resume, 1.50x)"
    )


def test_the_verdict_names_every_column_where_a_peer_is_as_fast_or_smaller() -> None:
    document = canned_peers()
    document["peers"]["langgraph"]["turn_us"] = 1250.0  # as fast as perdure's sync row
    document["peers"]["openai"]["page_ms"] = 0.75
    document["peers"]["openai"]["table_bytes"] = 2_510_020  # 250 B a message
    lines = table(document)
    assert row(lines, "LangGraph / perdure sync")[0] == "1.00x"
    assert row(lines, "OpenAI Agents / perdure async") == ["3.00x", "1.50x", "0.50x", "0.50x"]
    assert lines[-1] == (
        "perdure ahead on every column (faster; B/msg: smaller): no: perdure is not ahead on "
        "LangGraph us/msg (1.00x), OpenAI Agents tail50 (0.50x), OpenAI Agents B/msg (0.50x)"
    )


def test_a_failed_missing_or_partial_peer_leaves_the_verdict_open() -> None:
    document = canned_peers()
    document["peers"]["langgraph"] = {"version": "1.0.0", "error": "ImportError: no langgraph"}
    del document["peers"]["openai"]["page_ms"]
    lines = table(document)
    assert any(line.startswith("LangGraph") and "failed: ImportError" in line for line in lines)
    assert row(lines, "OpenAI Agents / perdure async") == ["3.00x", "1.50x", "-", "3.98x"]
    assert lines[-1] == (
        "perdure ahead on every column (faster; B/msg: smaller): not established: "
        "LangGraph failed, OpenAI Agents tail50"
    )
    del document["peers"]["openai"]
    assert any(
        line.startswith("OpenAI Agents") and "not measured" in line for line in table(document)
    )


def test_without_peers_the_table_has_perdures_rows_and_says_how_to_add_them() -> None:
    lines = table(None)
    assert row(lines, "perdure, Agent + Session, PostgresSessionStore")[:2] == ["async", "1000"]
    assert any(line.startswith("peers: not measured. --peers adds LangGraph") for line in lines)
    assert not any(line.startswith("peer / perdure") for line in lines)
    assert lines[-1].endswith("not established: LangGraph not measured, OpenAI Agents not measured")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="perdure-peers/2"), "not a result of benchmarks/peers_postg"),
        (lambda d: d.update(size=1000), "the peers stored 1000 messages and ran 20 turns"),
        (lambda d: d.update(turns=50), "the peers stored 10000 messages and ran 50 turns"),
        (lambda d: d.update(peers=[]), "no 'peers' object"),
        (lambda d: d["peers"]["openai"].update(face="both"), "face must be 'sync' or 'async'"),
        (lambda d: d["peers"]["openai"].update(turn_us="fast"), "turn_us must be a positive"),
        (lambda d: d["peers"]["langgraph"].update(resume_ms=0), "resume_ms must be a positive"),
        (lambda d: d["peers"]["langgraph"].update(messages=-1), "messages must be a positive"),
    ],
)
def test_a_result_that_is_not_the_peers_for_this_run_is_refused(change: Any, message: str) -> None:
    bench = load_benchmark("postgres")
    document = copy.deepcopy(canned_peers())
    change(document)
    with pytest.raises(ValueError, match=message):
        bench.check_peers(document, 10_000, 20)


# --- against the real server ---------------------------------------------------------------

TINY = ["--sizes", "120", "--peers-size", "120", "--appends", "3", "--turns", "2"]
TINY += ["--writers", "2", "--seconds", "0.2"]


def bench_schemas() -> set[str]:
    rows = execute(
        "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", ("perdure_bench_",)
    )
    return {str(name) for (name,) in rows}


def test_the_tiny_benchmark_prints_every_column_and_drops_its_schemas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_server()
    bench = load_benchmark("postgres")
    before = bench_schemas()
    assert bench.main([*TINY, "--dsn", DSN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PostgreSQL ")
    cells = row(lines, "     120")  # msgs
    assert len(cells) == 12, cells
    assert all(float(cell) > 0 for cell in cells)
    assert any(line.startswith("2 writers, 0.2 s each, own sessions: durable ") for line in lines)
    # the side-by-side rows are the agent-path columns of the 120-message row
    invoke, call, resume, page = cells[6], cells[7], cells[8], cells[10]
    label = "perdure, Agent + Session, PostgresSessionStore"
    side = row(lines, label + "   async")
    assert side[:3] == [invoke, resume, page]
    assert row(lines, label + "    sync")[:3] == [call, resume, page]
    # 120 stored + 3 appends + 10 store turns of 2 + 2 agent turns of 2 through each face
    assert side[-1] == "151"
    assert any(line.startswith("peers: not measured. --peers adds") for line in lines)
    assert lines[-1].endswith("not established: LangGraph not measured, OpenAI Agents not measured")
    assert bench_schemas() == before


@pytest.fixture
def schema() -> Any:
    yield from schema_fixture()


def test_a_row_measures_perdures_tables_alone_and_the_side_by_side_takes_them_all(
    schema: str,
) -> None:
    """The size set against the peers is every table perdure made in the row's schema
    (the floor's table dropped first); the row's own "table x" is the messages table's."""
    bench = load_benchmark("postgres")
    peers = load_benchmark("peers_postgres")
    r = bench.measure(DSN, schema, 60, 2, 1)
    tables = peers.schema_tables(DSN, schema)
    assert "floor" not in tables
    assert {"perdure_sessions", "perdure_messages", "perdure_schema_version"} <= set(tables)
    assert r["schema_bytes"] == sum(tables.values())
    assert r["table_bytes"] == tables["perdure_messages"] < r["schema_bytes"]
    assert r["messages"] == 60 + 2 + 10 * 2 + 2 * 2  # stored, appends, store turns, agent turns
    side = bench.perdure_side(r, 1)
    assert side["table_bytes"] == r["schema_bytes"]
    assert side["faces"] == {"async": r["invoke_us"], "sync": r["call_us"]}
    assert (side["resume_ms"], side["page_ms"]) == (r["resume_ms"], r["page_ms"])


def test_the_tiny_benchmark_prints_the_peers_from_a_result_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_server()
    bench = load_benchmark("postgres")
    result = tmp_path / "peers.json"
    result.write_text(json.dumps(canned_peers(size=120, turns=2)))
    assert bench.main([*TINY, "--dsn", DSN, "--peers-json", str(result)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(row(lines, "LangGraph 1.0.0, PostgresSaver")) == 7
    assert len(row(lines, "LangGraph / perdure sync")) == 4
    assert len(row(lines, "OpenAI Agents / perdure async")) == 4
    assert lines[-1].startswith("perdure ahead on every column (faster; B/msg: smaller): ")
    assert "not established" not in lines[-1]
    with pytest.raises(SystemExit):
        bench.main([*TINY, "--dsn", DSN, "--turns", "3", "--peers-json", str(result)])
    assert "the peers stored 120 messages and ran 2 turns; this run: 120 and 3" in (
        capsys.readouterr().err
    )


def test_the_peers_script_writes_a_result_the_table_reads_even_without_their_sdks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """perdure's environment has neither peer's SDK: each peer fails, clearly, and the
    script still drops the schemas it made."""
    require_server()
    hide_peer_sdks(monkeypatch)
    peers = load_benchmark("peers_postgres")
    bench = load_benchmark("postgres")
    prefix = f"perdure_bench_peerstest_{uuid.uuid4().hex[:8]}"
    out = tmp_path / "peers.json"
    argv = ["--dsn", DSN, "--schema", prefix, "--size", "60", "--turns", "1"]
    assert peers.main([*argv, "--out", str(out)]) == 0
    document = bench.check_peers(json.loads(out.read_text()), 60, 1)
    assert set(document["peers"]) == {"langgraph", "openai"}
    for name, result in document["peers"].items():
        if "error" in result:
            assert result["error"].startswith("ModuleNotFoundError"), (name, result)
        else:  # an SDK installed here after all: then it measured
            assert all(result[key] > 0 for key in ("turn_us", "resume_ms", "page_ms"))
    assert not any(name.startswith(prefix) for name in bench_schemas())
    with pytest.raises(SystemExit):
        peers.main([*argv, "--out", str(out), "--only", "crewai"])
    assert "unknown peers ['crewai']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peers.main([*argv[:-4], "--size", "10", "--turns", "1", "--out", str(out)])
    assert "--size must be at least 50" in capsys.readouterr().err
