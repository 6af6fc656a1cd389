"""Keep benchmarks/redis_store.py from rotting: the side-by-side table and the target lines
from canned results (no server, no peers' venv), and tiny runs against the real server
(no timing asserted; every key a run makes is gone after it)."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from helpers import hide_peer_sdks, load_benchmark
from redis_server import URL, client, drop_prefix, import_redis, require_server

import_redis()  # the benchmark imports redis-py at its top

# perdure's figures at the side-by-side size, as perdure_side() hands them to the table.
PERDURE = {
    "turns": 20,
    "floor_us": 100.0,
    "faces": {"async": 1000.0, "sync": 1250.0},
    "resume_ms": 20.0,
    "page_ms": 0.5,
    "memory_bytes": 5_000_000.0,
    "messages": 10_000.0,
}
LABEL = "perdure, Agent + Session, RedisSessionStore"
ASYNC, SYNC = (f"{LABEL:<48}{face:>6}" for face in ("async", "sync"))  # its two rows


def canned_peers(size: int = 10_000, turns: int = 20) -> dict[str, Any]:
    """A result as benchmarks/peers_redis.py writes it."""
    return {
        "format": "perdure-peers-redis/1",
        "size": size,
        "turns": turns,
        "server": "7.0.15",
        "python": "3.11.7",
        "floor_us": 120.0,
        "peers": {
            "openai": {  # against perdure's async row (1000 us)
                "version": "2.0.0",
                "label": "OpenAI Agents {version}, RedisSession",
                "face": "async",
                "turn_us": 3000.0,
                "resume_ms": 30.0,
                "page_ms": 2.0,
                "memory_bytes": 1000 * (size + 2 * turns),  # 1000 B a message held
                "keys": {"k": 1000 * (size + 2 * turns)},
                "messages": size + 2 * turns,
                "turn_how": "how 2.0.0 turns",
                "resume_how": "how 2.0.0 resumes",
                "page_how": "how 2.0.0 pages",
                "note": "what 2.0.0 keeps",
            }
        },
    }


def row(lines: list[str], start: str) -> list[str]:
    return next(line for line in lines if line.startswith(start))[len(start) :].split()


def table(document: dict[str, Any] | None) -> list[str]:
    bench = load_benchmark("redis_store")
    checked = None if document is None else bench.check_peers(document, 10_000, 20)
    return list(bench.side_by_side(PERDURE, 10_000, checked))


def test_the_side_by_side_sets_the_peer_against_perdures_row_of_its_face() -> None:
    lines = table(canned_peers())
    assert lines[0].startswith("side by side on the same server: 10000 messages stored, then 20")
    assert lines[1].endswith("median: perdure's run 100 us, the peer's run 120 us")
    # face, us/msg, resume ms, tail50 ms, mem MB, B/msg, msgs
    assert row(lines, ASYNC) == ["1000", "20.0", "0.50", "5.0", "500", "10000"]
    assert row(lines, SYNC) == ["1250", "20.0", "0.50", "5.0", "500", "10000"]
    assert row(lines, "OpenAI Agents 2.0.0, RedisSession") == [
        "async", "3000", "30.0", "2.00", "10.0", "1000", "10040"
    ]  # fmt: skip
    assert row(lines, "peer / perdure") == ["us/msg", "resume", "tail50", "B/msg"]
    # the Runner against invoke_async; memory per message held (1000 B against 500 B)
    assert row(lines, "OpenAI Agents / perdure async") == ["3.00x", "1.50x", "4.00x", "2.00x"]
    text = " ".join(" ".join(lines).split())
    assert "OpenAI Agents: how 2.0.0 turns; resume: how 2.0.0 resumes; tail page: how " in text
    assert "OpenAI Agents: what 2.0.0 keeps" in text
    assert "read_history_page(store, id, offset=n-50, limit=50)" in text
    assert lines[-1] == (
        "perdure ahead on every column (faster; B/msg: smaller): "
        "yes (closest: OpenAI Agents resume, 1.50x)"
    )


def test_the_verdict_names_every_column_where_the_peer_is_as_fast_or_smaller() -> None:
    document = canned_peers()
    document["peers"]["openai"]["turn_us"] = 1000.0  # as fast as perdure's async row
    document["peers"]["openai"]["page_ms"] = 0.25
    document["peers"]["openai"]["memory_bytes"] = 250 * 10_040
    lines = table(document)
    assert row(lines, "OpenAI Agents / perdure async") == ["1.00x", "1.50x", "0.50x", "0.50x"]
    assert lines[-1] == (
        "perdure ahead on every column (faster; B/msg: smaller): no: perdure is not ahead on "
        "OpenAI Agents us/msg (1.00x), OpenAI Agents tail50 (0.50x), OpenAI Agents B/msg (0.50x)"
    )


def test_a_failed_missing_or_partial_peer_leaves_the_verdict_open() -> None:
    document = canned_peers()
    del document["peers"]["openai"]["memory_bytes"]
    lines = table(document)
    assert row(lines, "OpenAI Agents / perdure async") == ["3.00x", "1.50x", "4.00x", "-"]
    assert lines[-1].endswith("not established: OpenAI Agents B/msg")
    document["peers"]["openai"] = {"version": "2.0.0", "error": "ModuleNotFoundError: agents"}
    lines = table(document)
    assert any(
        line.startswith("OpenAI Agents") and "failed: ModuleNotFound" in line for line in lines
    )
    assert lines[-1].endswith("not established: OpenAI Agents failed")
    del document["peers"]["openai"]
    lines = table(document)
    assert any(line.startswith("OpenAI Agents") and "not measured" in line for line in lines)


def test_without_peers_the_table_has_perdures_rows_and_says_how_to_add_them() -> None:
    lines = table(None)
    assert row(lines, LABEL)[:2] == ["async", "1000"]
    assert any(line.startswith("peers: not measured. --peers adds the OpenAI") for line in lines)
    assert not any(line.startswith("peer / perdure") for line in lines)
    assert lines[-1].endswith("not established: OpenAI Agents not measured")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(format="perdure-peers-postgres/1"),
            "not a result of benchmarks/peers_r",
        ),
        (lambda d: d.update(size=1000), "the peers stored 1000 messages and ran 20 turns"),
        (lambda d: d.update(turns=50), "the peers stored 10000 messages and ran 50 turns"),
        (lambda d: d.update(peers=[]), "no 'peers' object"),
        (lambda d: d["peers"]["openai"].update(face="both"), "face must be 'sync' or 'async'"),
        (lambda d: d["peers"]["openai"].update(turn_us="fast"), "turn_us must be a positive"),
        (lambda d: d["peers"]["openai"].update(memory_bytes=0), "memory_bytes must be a positive"),
    ],
)
def test_a_result_that_is_not_the_peers_for_this_run_is_refused(change: Any, message: str) -> None:
    bench = load_benchmark("redis_store")
    document = copy.deepcopy(canned_peers())
    change(document)
    with pytest.raises(ValueError, match=message):
        bench.check_peers(document, 10_000, 20)


def canned_row(append_us: float, resume_ms: float, page_ms: float) -> dict[str, float]:
    return {"append_us": append_us, "floor_us": 100.0, "resume_ms": resume_ms, "page_ms": page_ms}


def test_the_target_lines_say_met_missed_or_not_measured() -> None:
    bench = load_benchmark("redis_store")
    lines = bench.targets(
        {10_000: canned_row(150.0, 39.0, 0.4), 100_000: canned_row(210.0, 400, 1.2)}
    )
    assert lines == [
        "target append <= 2x floor: 1.50x at 10000, 2.10x at 100000: MISSED",
        "target resume of 10k <= 40 ms: 39.00 ms: met",
        "target tail50 of 100k <= 1 ms: 1.20 ms: MISSED",
    ]
    lines = bench.targets({1000: canned_row(200.0, 5.0, 0.3)})
    assert lines[0] == "target append <= 2x floor: 2.00x at 1000: met"
    assert lines[1].endswith("not measured (no 10000-message row; --sizes adds it)")
    assert lines[2].endswith("not measured (no 100000-message row; --sizes adds it)")


# --- against the real server ---------------------------------------------------------------

TINY = ["--sizes", "120", "--peers-size", "120", "--appends", "3", "--turns", "2"]


def bench_keys() -> set[bytes]:
    with client() as c:
        return set(c.scan_iter(match="perdure-bench-*", count=1000))


def test_the_tiny_benchmark_prints_every_column_and_deletes_its_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_server()
    bench = load_benchmark("redis_store")
    before = bench_keys()
    assert bench.main([*TINY, "--url", URL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Redis ")
    cells = row(lines, "     120")  # msgs
    assert len(cells) == 12, cells
    assert all(float(cell) > 0 for cell in cells)
    assert any(line.startswith("target append <= 2x floor: ") for line in lines)
    # the side-by-side rows are the agent-path columns of the 120-message row
    invoke, call, resume, page = cells[6], cells[7], cells[8], cells[10]
    side = row(lines, ASYNC)
    assert side[:3] == [invoke, resume, page]
    assert row(lines, SYNC)[:3] == [call, resume, page]
    # 120 stored + 3 appends + 10 store turns of 2 + 2 agent turns of 2 through each face
    assert side[-1] == "151"
    assert any(line.startswith("peers: not measured. --peers adds") for line in lines)
    assert lines[-1].endswith("not established: OpenAI Agents not measured")
    assert bench_keys() <= before


def test_a_row_measures_the_memory_of_perdures_keys_alone() -> None:
    """The memory of a row is every key under the row's prefix: the session's, and
    neither the floor's list nor the asyncio RPUSH's (deleted, or elsewhere)."""
    require_server()
    bench = load_benchmark("redis_store")
    peers = load_benchmark("peers_redis")
    prefix = f"perdure-bench-test-{uuid.uuid4().hex[:8]}:"
    floor = load_benchmark("floors").RedisFloor(URL, f"{prefix}floor", peers.floor_body())
    try:
        r = bench.measure(URL, f"{prefix}s60:", 60, 2, 1, floor)
        keys = peers.prefix_memory(URL, f"{prefix}s60:")
        assert set(keys) == {f"{prefix}s60:{{bench-60}}:{kind}" for kind in ("h", "m")}
        assert r["memory_bytes"] == sum(keys.values()) > r["raw_bytes"]
        assert r["messages"] == 60 + 2 + 10 * 2 + 2 * 2  # stored, appends, store turns, agent
        assert len(floor.samples) == 2 + 10 + 2 * 1  # a step before each append, turn, agent turn
        side = bench.perdure_side(r, 1)
        assert side["memory_bytes"] == r["memory_bytes"]
        assert side["faces"] == {"async": r["invoke_us"], "sync": r["call_us"]}
    finally:
        floor.close()
        drop_prefix(prefix)
    assert not peers.prefix_keys(URL, prefix)


def test_the_tiny_benchmark_prints_the_peer_from_a_result_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_server()
    bench = load_benchmark("redis_store")
    result = tmp_path / "peers.json"
    result.write_text(json.dumps(canned_peers(size=120, turns=2)))
    assert bench.main([*TINY, "--url", URL, "--peers-json", str(result)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(row(lines, "OpenAI Agents 2.0.0, RedisSession")) == 7
    assert len(row(lines, "OpenAI Agents / perdure async")) == 4
    assert lines[-1].startswith("perdure ahead on every column (faster; B/msg: smaller): ")
    assert "not established" not in lines[-1]
    with pytest.raises(SystemExit):
        bench.main([*TINY, "--url", URL, "--turns", "3", "--peers-json", str(result)])
    assert "the peers stored 120 messages and ran 2 turns; this run: 120 and 3" in (
        capsys.readouterr().err
    )


def test_the_peers_script_writes_a_result_the_table_reads_even_without_the_sdk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """perdure's environment has no OpenAI Agents SDK: the peer fails, clearly, and the
    script still deletes every key it made."""
    require_server()
    hide_peer_sdks(monkeypatch)
    peers = load_benchmark("peers_redis")
    bench = load_benchmark("redis_store")
    prefix = f"perdure-bench-peerstest-{uuid.uuid4().hex[:8]}:"
    out = tmp_path / "peers.json"
    argv = ["--url", URL, "--prefix", prefix, "--size", "60", "--turns", "1"]
    assert peers.main([*argv, "--out", str(out)]) == 0
    document = bench.check_peers(json.loads(out.read_text()), 60, 1)
    assert set(document["peers"]) == {"openai"}
    result = document["peers"]["openai"]
    if "error" in result:
        assert result["error"].startswith("ModuleNotFoundError"), result
    else:  # the SDK installed here after all: then it measured
        assert all(result[key] > 0 for key in ("turn_us", "resume_ms", "page_ms", "memory_bytes"))
    assert document["floor_us"] is None or document["floor_us"] > 0
    assert not peers.prefix_keys(URL, prefix)
    with pytest.raises(SystemExit):
        peers.main([*argv, "--out", str(out), "--only", "crewai"])
    assert "unknown peers ['crewai']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peers.main([*argv[:-4], "--size", "10", "--turns", "1", "--out", str(out)])
    assert "--size must be at least 50" in capsys.readouterr().err
