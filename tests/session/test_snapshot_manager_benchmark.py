"""Keep benchmarks/snapshots.py from rotting: run its smallest case (no timing asserted)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from helpers import load_benchmark


def load() -> ModuleType:
    return load_benchmark("snapshots")


def test_the_smallest_benchmark_runs_and_reports_every_target(tmp_path: Path) -> None:
    bench = load()
    lines: list[str] = []
    result = bench.run(
        (20, 60),
        ("local", "sqlite", "memory"),
        bench.STRATEGIES,
        3,
        1,
        12,
        tmp_path,
        out=lines.append,
    )
    assert len(result["rows"]) == 3 * 3 * 2
    assert all(row.stored > 0 and row.history > 0 for row in result["rows"])
    stored, history, _ = result["snapshots"]
    assert stored > 0
    assert history > 0
    text = "\n".join(lines)
    assert "save/floor" in text
    assert "targets (issue 4):" in text
    assert "targets (issue 16):" in text
    assert "save/fsync" in text
    assert text.count("message save at 60 msgs") == 4
    assert "12 snapshots" in text
    assert "local restore of 60 messages" in text


def test_the_message_mix_is_valid_and_deterministic() -> None:
    bench = load()
    from perdure.types import validate_message

    messages = bench.make_messages(9)
    assert messages == bench.make_messages(9)
    for index, message in enumerate(messages):
        validate_message(message, f"messages[{index}]")
    assert {"toolUse", "toolResult", "text"} <= {
        key for m in messages for block in m["content"] for key in block
    }


def test_the_s3_rows_run_against_moto_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3_server

    s3_server.require_s3()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, "")  # start_s3 sets dummies: restored after the test
    bench = load()
    bench.start_s3()
    lines: list[str] = []
    result = bench.run((20, 60), ("s3",), ("message",), 3, 1, 0, tmp_path, out=lines.append)
    assert [row.backend for row in result["rows"]] == ["s3", "s3"]
    assert all(row.stored > 0 for row in result["rows"])
    assert "s3: message save at 60 msgs / at 20 msgs" in "\n".join(lines)


def test_the_s3_peers_table_sets_strands_beside_the_s3_message_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load()
    row = bench.Row(
        backend="s3",
        strategy="message",
        size=1000,
        save_ms=2.0,
        save_p50_ms=2.0,
        floor_ms=1.0,
        fsync_ms=0.5,
        restore_ms=10.0,
        stored=1,
        history=1,
    )
    other = bench.Row(**{**row.__dict__, "backend": "local"})
    document = {
        "sdk": "strands-agents 1.62.0",
        "sizes": {"1000": {"save_ms": 6.0, "restore_ms": 500.0}},
    }
    lines = bench.peers_table([other, row], document)
    assert "strands-agents 1.62.0 S3SessionManager" in lines[0]
    assert lines[2].split() == ["1000", "2.00", "6.00", "3.00", "10.0", "500.0", "50.00"]
    with pytest.raises(SystemExit):
        bench.main(["--peers"])  # the peers compare on S3 only
    assert "--peers compares on S3: give --s3 too" in capsys.readouterr().err
