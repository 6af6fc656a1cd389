"""Crash safety by crashing: a writer process is SIGKILLed at many points (SPEC §7.1).

The harness is perdure.testing's CrashSuite, which any store can run: each kill is
followed by a check that the session opens, that every acknowledged commit is
there, and that nothing else was invented. Half the kills land at random moments;
the other half are injected: for the file store at the renames and fsyncs of
segment sealing and rewrites, for the SQLite store inside and after its
transactions and around WAL folds (session_stores.crash_*_writer). Half the writers
hold the writer lock, as a Session does during a turn, so their appends take the
stores' inline paths; half the SQLite writers are non-durable, whose commits a
killed process must not lose either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perdure.session import FileSessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing import CrashSuite, CrashTarget


class TestFileStoreCrash(CrashSuite):
    injects_deaths = True

    @pytest.fixture
    def crash_target(self, tmp_path: Path) -> CrashTarget:
        root = tmp_path / "store"
        return CrashTarget(
            "session_stores:crash_file_writer", str(root), lambda: FileSessionStore(root)
        )


class TestSQLiteStoreCrash(CrashSuite):
    injects_deaths = True
    crash_kills = 30
    crash_share = 0.5
    crash_seed = 4321

    @pytest.fixture
    def crash_target(self, tmp_path: Path) -> CrashTarget:
        path = tmp_path / "sessions.db"
        return CrashTarget(
            "session_stores:crash_sqlite_writer", str(path), lambda: SQLiteSessionStore(path)
        )
