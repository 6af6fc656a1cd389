"""The corruption matrix of issue 14: a flipped byte in any file perdure writes is
detected, healed or harmless — never silently different content, never a crash.

The harness, its kinds and the meaning of each outcome are in
``benchmarks/corruption.py`` (its docstring); run it directly for the same table.
The counts are printed (``pytest -s``) when the module finishes. Before it, each
store runs the lighter generic sweep of ``perdure.testing.CorruptionSuite``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import load_benchmark
from perdure.errors import SessionCorruptedError, SessionNotFoundError
from perdure.maintenance import Damage, VerifyReport
from perdure.session import FileSessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing import CorruptionSuite, CorruptionTarget

matrix = load_benchmark("corruption")


# ------------------------------------------------------- the generic sweep any store runs


class TestFileStoreCorruption(CorruptionSuite):
    @pytest.fixture
    def corruption_target(self, tmp_path: Path) -> CorruptionTarget:
        root = tmp_path / "store"
        return CorruptionTarget(
            open=lambda: FileSessionStore(root),
            root=root,
            ignore=lambda path: path.parent.name == ".locks",
        )


class TestSQLiteStoreCorruption(CorruptionSuite):
    flips_per_file = 60

    @pytest.fixture
    def corruption_target(self, tmp_path: Path) -> CorruptionTarget:
        root = tmp_path / "db"
        root.mkdir()
        return CorruptionTarget(open=lambda: SQLiteSessionStore(root / "sessions.db"), root=root)


# ------------------------------------------------------- perdure's own full matrix

FLIPS = 500
SEED = 14


@pytest.fixture(scope="module")
def tallies() -> Iterator[dict[str, Any]]:
    """Every kind's tally, printed as one table when the module is done."""
    found: dict[str, Any] = {}
    yield found
    ordered = [found[name] for name in matrix.KIND_NAMES if name in found]
    if ordered:
        print(f"\ncorruption matrix ({FLIPS} flips per kind, seed {SEED}):")
        print(matrix.table(ordered))
        shown = matrix.examples(ordered)
        if shown:
            print(shown)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """One small real fixture per store, built once for the module."""
    work = tmp_path_factory.mktemp("corruption")
    return work, matrix.build_fixtures(work, list(matrix.KINDS))


@pytest.mark.parametrize("kind", matrix.KIND_NAMES)
def test_no_flipped_byte_reads_back_silently_or_crashes(
    kind: str, fixtures: tuple[Path, dict[str, Path]], tallies: dict[str, Any]
) -> None:
    work, built = fixtures
    spec = next(k for k in matrix.KINDS if k.name == kind)
    with asyncio.Runner() as runner:
        tally = matrix.run_kind(
            spec, built[spec.fixture], work, flips=FLIPS, seed=SEED, runner=runner
        )
    if not tally.files:
        pytest.skip(f"this version of the store writes no {kind} files")
    tallies[kind] = tally
    assert tally.flips == min(FLIPS, tally.size) or tally.flips >= FLIPS
    assert sum(tally.counts.values()) == tally.flips
    if kind != "session-other":  # the head file's second slot absorbs one flip
        assert tally.counts["detected"] > 0  # the harness really damaged what is read
    if kind != "sqlite-wal":
        assert tally.counts["limit"] == 0  # only SQLite's last WAL transaction may go
    forbidden = {name: tally.counts[name] for name in matrix.FORBIDDEN}
    assert forbidden == {"silent": 0, "crash": 0}, matrix.examples([tally], limit=5)


# ------------------------------------------------------------- the harness's own rules


def _seen(verify: Any = None, **reads: Any) -> Any:
    return matrix.Observation(reads=reads, verify=verify)


def _clean() -> VerifyReport:
    return VerifyReport(sessions_checked=1, checkpoints_checked=0, damage=())


def _damaged() -> VerifyReport:
    damage = Damage(session_id="s", kind="bad_hash", detail="record hash does not match")
    return VerifyReport(sessions_checked=1, checkpoints_checked=0, damage=(damage,))


ORIGINAL_META = {"session_id": "s", "created_at": "t0", "updated_at": "t1", "message_count": 2}
ORIGINAL = {
    "list": [ORIGINAL_META],
    "get": {"meta": ORIGINAL_META, "messages": [{"text": "pay 100 EUR"}], "agent_state": {}},
}


def _reads(**changes: Any) -> dict[str, Any]:
    return {**ORIGINAL, **changes}


@pytest.mark.parametrize(
    ("reads", "verify", "healable", "outcome"),
    [
        (_reads(), _clean(), False, "harmless"),
        (_reads(), _clean(), True, "healed"),
        (_reads(), _damaged(), False, "detected"),
        (_reads(get=SessionCorruptedError("bad")), _damaged(), False, "detected"),
        # a damage error that verify does not report would pass `perdure verify`
        (_reads(get=SessionCorruptedError("bad")), _clean(), False, "silent"),
        (
            _reads(get={**ORIGINAL["get"], "messages": [{"text": "pay 900 EUR"}]}),
            _clean(),
            False,
            "silent",
        ),
        (_reads(get=SessionNotFoundError("gone")), _clean(), False, "silent"),
        (_reads(get=OSError("disk")), _damaged(), False, "crash"),
        (_reads(get=UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")), _clean(), False, "crash"),
        (_reads(), OSError("verify broke"), False, "crash"),
        # a listing may be stale for a session reported damaged, not otherwise
        (_reads(list=[], get=SessionCorruptedError("bad")), _damaged(), False, "detected"),
        (_reads(list=[]), _clean(), False, "silent"),
        # a timestamp alone is counted apart, content never
        (_reads(list=[{**ORIGINAL_META, "updated_at": "tX"}]), _clean(), False, "stamp"),
    ],
)
def test_outcomes_follow_the_documented_rules(
    reads: dict[str, Any], verify: Any, healable: bool, outcome: str
) -> None:
    original = _seen(_clean(), **ORIGINAL)
    got, why = matrix.classify(_seen(verify, **reads), original, healable=healable)
    assert got == outcome
    assert bool(why) == (outcome in (*matrix.FORBIDDEN, "stamp"))  # the reason is shown


def test_a_sample_always_holds_the_ends_of_each_file_and_the_last_newline(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_bytes(b"x" * 400)
    second.write_bytes(b"y" * 400)
    tail = matrix.Tail(second, 300, acknowledged=False)
    spots = matrix.choose([first, second], 50, random.Random(1), tail)
    assert len(spots) == 50
    for must in [(first, 0), (first, 399), (second, 0), (second, 398), (second, 299)]:
        assert must in spots
    assert matrix.choose([first], 500, random.Random(1)) == [(first, i) for i in range(400)]


def test_the_script_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert matrix.main(["--flips", "5", "--kinds", "meta,attachment", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["meta"][3] == rows["attachment"][3] == "5"  # flips per kind
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone
