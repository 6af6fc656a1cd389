"""Keep benchmarks/agent_path.py from rotting: run it with tiny sizes (no timing asserted)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from helpers import hide_peer_sdks, load_benchmark

ROWS = [
    "no session",
    "file commit",
    "file invocation",
    "file none",
    "sqlite commit",
    "sqlite invocation",
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
        # fsync/msg, then async and sync: us, added, x fsync, x off
        assert len(cells) == 9, row
        assert float(cells[1]) > 0
        assert float(cells[5]) > 0
        if label.endswith(("commit", "message", "invocation")):
            for ratio in (cells[3], cells[4], cells[7], cells[8]):
                assert float(ratio) > 0, row
        if label == "file commit":
            assert cells[0] == "1.0"  # one log sync a message; the checkpoint syncs the head
        if label == "file invocation":
            assert cells[0] == "1.0"  # one fsync a turn, and the head's one
    assert "floors, same run: file append+fsync" in out
    assert "off-loop floors (an fsync that leaves the event loop free): file" in out
    assert "sync/async, bare turn:" in out
    for kind in ("file", "sqlite"):
        resume = next(line for line in lines if line.startswith(f"resume 40 messages, {kind},"))
        assert resume.endswith("ms (agent built over Session.resume, store already open, no turn)")
        restart = next(
            line
            for line in lines
            if line.startswith("restart to first answer over 40 messages")
            and f", {kind}, commit: " in line
        )
        assert restart.endswith(" ms (store opened, agent built, one turn answered)")
        assert float(restart.split(": ")[1].split()[0]) > 0
    assert "restore 40 messages from a snapshot (SnapshotSessionManager):" in out
    assert "peers: not measured. --peers adds" in out  # and says how to get them
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself


class UnreadableHistory(list[Any]):
    """A request whose messages must not be looked at: any read past len() fails."""

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError("the instant model read the request's messages")

    def __iter__(self) -> Any:
        raise AssertionError("the instant model read the request's messages")


def test_the_instant_model_answers_without_reading_the_history() -> None:
    """Like the peers' stubs, it does no work that grows with the history (a token
    estimate over the whole request would add ~100 ms to the first turn after a resume)."""
    bench = load_benchmark("agent_path")
    model = bench.instant_model(2)

    async def answer() -> list[Any]:
        history = UnreadableHistory([{"role": "user", "content": [{"text": "q"}]}] * 3)
        return [event async for event in model.stream(history, tool_specs=[], system_prompt=None)]

    for _ in range(2):
        events = asyncio.run(answer())
        response = events[-1]
        assert response.message == {"role": "assistant", "content": [{"text": bench.ANSWER}]}
        assert response.stop_reason == "end_turn"
        assert "".join(event.text for event in events[:-1]) == bench.ANSWER
    assert model.remaining == 0
    assert model.requests == []


# perdure's commit rows, resume and restart, as perdure_columns() hands them to the table.
PERDURE = {
    "file": {"async": 400.0, "sync": 500.0, "resume": 100.0, "restart": 120.0},
    "sqlite": {"async": 600.0, "sync": 700.0, "resume": 80.0, "restart": 90.0},
}


def canned_peers(turns: int = 200, resume_size: int = 10_000) -> dict[str, Any]:
    """A result as benchmarks/peers.py writes it."""

    def peer(
        version: str, async_us: float, sync_us: float, resume_ms: float, restart_ms: float
    ) -> dict[str, Any]:
        return {
            "version": version,
            "async_us": async_us,
            "sync_us": sync_us,
            "resume_ms": resume_ms,
            "resume_how": f"how {version} resumes",
            "restart_ms": restart_ms,
            "restart_how": f"how {version} restarts",
            "durability": {},
            "note": f"what {version} syncs",
        }

    return {
        "format": "perdure-peers/2",
        "turns": turns,
        "resume_size": resume_size,
        "python": "3.11.7",
        "floors_us": {"file": 200.0, "sqlite": 250.0},
        "peers": {
            "strands": peer("1.0.0", 2000.0, 1000.0, 1500.0, 1800.0),
            "openai": peer("2.0.0", 1200.0, 1400.0, 160.0, 270.0),
            "langgraph": peer("3.0.0", 3000.0, 3500.0, 200.0, 360.0),
        },
    }


def row(lines: list[str], start: str) -> list[str]:
    return next(line for line in lines if line.startswith(start))[len(start) :].split()


def test_the_peers_table_sets_each_peer_against_perdures_row_on_the_same_store() -> None:
    bench = load_benchmark("agent_path")
    lines = bench.peers_table(PERDURE, bench.check_peers(canned_peers(), 200, 10_000))
    header = row(lines, "path")
    assert header == [
        "async",
        "us",
        "x",
        "sync",
        "us",
        "x",
        "resume",
        "ms",
        "x",
        "restart",
        "ms",
        "x",
    ]
    assert row(lines, "perdure file commit") == ["400", "500", "100.0", "120.0"]
    assert row(lines, "perdure sqlite commit") == ["600", "700", "80.0", "90.0"]
    # Strands against the file store, the two SQLite peers against the SQLite store.
    assert row(lines, "Strands 1.0.0, FileSessionManager") == [
        "2000", "5.00x", "1000", "2.00x", "1500.0", "15.00x", "1800.0", "15.00x"
    ]  # fmt: skip
    assert row(lines, "OpenAI Agents 2.0.0, SQLiteSession") == [
        "1200", "2.00x", "1400", "2.00x", "160.0", "2.00x", "270.0", "3.00x"
    ]  # fmt: skip
    assert row(lines, "LangGraph 3.0.0, SqliteSaver") == [
        "3000", "5.00x", "3500", "5.00x", "200.0", "2.50x", "360.0", "4.00x"
    ]  # fmt: skip
    floors = "floors in the peers' process: file append+fsync 200 us, sqlite insert+commit 250 us"
    assert floors in lines
    assert "  Strands: what 1.0.0 syncs" in lines
    assert lines[-1] == (
        "perdure fastest on every column: yes (closest: OpenAI Agents async, 2.00x)"
    )


def test_the_peers_table_says_what_each_resume_and_each_restart_runs() -> None:
    """The resume column is not like for like: each system's resume is named; so is its restart."""
    bench = load_benchmark("agent_path")
    lines = bench.peers_table(PERDURE, bench.check_peers(canned_peers(), 200, 10_000))
    text = "\n".join(lines)
    resume = text.index("resume = reading the 10000 stored messages back; NOT the same work")
    restart = text.index("restart = to first answer, the same work for each")
    assert resume < restart
    resumes = " ".join(text[resume:restart].split())
    restarts = " ".join(text[restart:].split("\nx = ")[0].split())
    assert "perdure: Agent(session_manager=Session.resume(store, id)) built" in resumes
    assert "perdure: store opened (durability='commit')" in restarts
    assert "agent(QUESTION)" in restarts
    for version, name in (("1.0.0", "Strands"), ("2.0.0", "OpenAI Agents"), ("3.0.0", "LangGraph")):
        assert f"{name}: how {version} resumes" in resumes
        assert f"{name}: how {version} restarts" in restarts


def test_the_verdict_names_every_column_where_a_peer_is_as_fast_or_faster() -> None:
    bench = load_benchmark("agent_path")
    document = canned_peers()
    document["peers"]["openai"]["resume_ms"] = 40.0
    document["peers"]["strands"]["sync_us"] = 500.0
    document["peers"]["langgraph"]["restart_ms"] = 45.0
    lines = bench.peers_table(PERDURE, bench.check_peers(document, 200, 10_000))
    assert row(lines, "OpenAI Agents 2.0.0, SQLiteSession")[5] == "0.50x"
    assert row(lines, "LangGraph 3.0.0, SqliteSaver")[-1] == "0.50x"
    assert lines[-1] == (
        "perdure fastest on every column: no: perdure is not faster on "
        "Strands sync (1.00x), OpenAI Agents resume (0.50x), LangGraph restart (0.50x)"
    )


def test_a_peer_without_a_restart_figure_leaves_the_verdict_open() -> None:
    bench = load_benchmark("agent_path")
    document = canned_peers()
    del document["peers"]["openai"]["restart_ms"]
    lines = bench.peers_table(PERDURE, bench.check_peers(document, 200, 10_000))
    assert row(lines, "OpenAI Agents 2.0.0, SQLiteSession")[-2:] == ["-", "-"]
    assert lines[-1] == "perdure fastest on every column: not established: OpenAI Agents restart"


def test_a_failed_or_missing_peer_leaves_the_verdict_open() -> None:
    bench = load_benchmark("agent_path")
    document = canned_peers()
    document["peers"]["langgraph"] = {"version": "3.0.0", "error": "ImportError: no langgraph"}
    del document["peers"]["strands"]
    lines = bench.peers_table(PERDURE, bench.check_peers(document, 200, 10_000))
    assert any(
        line.startswith("LangGraph 3.0.0, SqliteSaver") and "failed: ImportError" in line
        for line in lines
    )
    assert any(line.startswith("Strands") and "not measured" in line for line in lines)
    assert lines[-1] == (
        "perdure fastest on every column: not established: Strands not measured, LangGraph failed"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="other/1"), "not a result of benchmarks/peers.py"),
        # a result of the peers' script before the restart column existed
        (lambda d: d.update(format="perdure-peers/1"), "not a result of benchmarks/peers.py"),
        (lambda d: d.update(turns=1000), "the peers ran 1000 turns"),
        (lambda d: d.update(peers=[]), "no 'peers' object"),
        (lambda d: d["peers"]["openai"].update(sync_us="fast"), "sync_us must be a positive"),
        (lambda d: d["peers"]["openai"].update(resume_ms=0), "resume_ms must be a positive"),
        (lambda d: d["peers"]["strands"].update(restart_ms=-1), "restart_ms must be a positive"),
    ],
)
def test_a_result_that_is_not_the_peers_for_this_run_is_refused(change: Any, message: str) -> None:
    bench = load_benchmark("agent_path")
    document = copy.deepcopy(canned_peers())
    change(document)
    with pytest.raises(ValueError, match=message):
        bench.check_peers(document, 200, 10_000)


def test_the_tiny_benchmark_prints_the_peers_table_from_a_result_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("agent_path")
    result = tmp_path / "peers.json"
    result.write_text(json.dumps(canned_peers(turns=3, resume_size=40)))
    work = tmp_path / "work"
    work.mkdir()
    argv = ["--turns", "3", "--resume-size", "40", "--dir", str(work)]
    assert bench.main([*argv, "--peers-json", str(result)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3 turns a row (6 messages), us per message (mean)"
    assert any(line.startswith("peers' full paths, 3 turns a row (6 messages)") for line in lines)
    # perdure's commit rows, resume and restart of this run, in the peers' table
    for kind in ("file", "sqlite"):
        mine = row(lines, f"{kind} commit")
        resume = row(lines, f"resume 40 messages, {kind}, full history kept:")[0]
        restart = row(lines, f"restart to first answer over 40 messages, {kind}, commit:")[0]
        assert row(lines, f"perdure {kind} commit") == [mine[1], mine[5], resume, restart]
    assert len(row(lines, "LangGraph 3.0.0, SqliteSaver")) == 8
    assert lines[-1].startswith("perdure fastest on every column: ")
    assert list(work.iterdir()) == []
    with pytest.raises(SystemExit):
        bench.main([*argv, "--turns", "4", "--peers-json", str(result)])
    assert "the peers ran 3 turns and resumed 40 messages; this run: 4 and 40" in (
        capsys.readouterr().err
    )


def test_the_peers_script_writes_a_result_the_table_reads_even_without_their_sdks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """perdure's environment has none of the peers' SDKs: each peer fails, clearly."""
    hide_peer_sdks(monkeypatch)
    peers = load_benchmark("peers")
    bench = load_benchmark("agent_path")
    assert (bench.QUESTION, bench.ANSWER) == (peers.QUESTION, peers.ANSWER)
    out = tmp_path / "peers.json"
    argv = ["--turns", "2", "--resume-size", "4", "--dir", str(tmp_path / "run")]
    assert peers.main([*argv, "--out", str(out)]) == 0
    document = bench.check_peers(json.loads(out.read_text()), 2, 4)
    assert set(document["peers"]) == {"strands", "openai", "langgraph"}
    for name, result in document["peers"].items():
        if "error" in result:
            assert result["error"].startswith("ModuleNotFoundError"), (name, result)
        else:  # an SDK installed here after all: then it measured
            keys = ("async_us", "sync_us", "resume_ms", "restart_ms")
            assert all(result[key] > 0 for key in keys)
    assert list((tmp_path / "run").glob("floor*")) == []  # the floors clean up
    with pytest.raises(SystemExit):
        peers.main([*argv, "--out", str(out), "--only", "crewai"])
    assert "unknown peers ['crewai']" in capsys.readouterr().err
