"""SIGKILL a process in which 16 sessions commit at once: nothing acknowledged is lost.

With group commit, one sync makes many sessions' commits durable, and none returns
before that sync: a process killed at any moment keeps every commit it acknowledged,
in every session, and invents nothing (each session holds exactly its history up
to its last acknowledged commit, or one more: the commit in flight).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from concurrent_writer import history, open_kind
from perdure.errors import SessionNotFoundError

SESSIONS = 16
TESTS = Path(__file__).parent.parent


def stored_counts(kind: str, location: str) -> dict[str, int]:
    store = open_kind(kind, location)

    async def read() -> dict[str, int]:
        counts = {}
        for i in range(SESSIONS):
            sid = f"s{i}"
            try:
                record = await store.get(sid)
            except SessionNotFoundError:
                counts[sid] = 0
                continue
            assert record.messages == history(len(record.messages), sid), f"{sid} invented"
            counts[sid] = len(record.messages)
        return counts

    try:
        return asyncio.run(read())
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
@pytest.mark.parametrize("kind", ["sqlite", "sqlite-none", "file"])
def test_sigkill_with_sixteen_concurrent_sessions_loses_no_acknowledged_commit(
    tmp_path: Path, kind: str
) -> None:
    location = str(tmp_path / ("store" if kind == "file" else "s.db"))
    rng = random.Random(2511)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    acked = {f"s{i}": 0 for i in range(SESSIONS)}
    for _ in range(5):
        with subprocess.Popen(
            [sys.executable, str(TESTS / "concurrent_writer.py"), kind, location, str(SESSIONS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr
            # Let commits run, then kill at a random moment among them.
            lines = [proc.stdout.readline() for _ in range(rng.randint(30, 400))]
            proc.send_signal(signal.SIGKILL)
            # Read on through the same buffered stream (communicate() would skip what
            # readline() already buffered).
            rest = proc.stdout.read()
            err = proc.stderr.read() if proc.stderr is not None else ""
            proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
        for line in [*lines, *rest.splitlines()]:
            if line.startswith("ack "):
                _, sid, count = line.split()
                acked[sid] = max(acked[sid], int(count))
        counts = stored_counts(kind, location)
        for sid, count in counts.items():
            assert count in (acked[sid], acked[sid] + 1), (sid, count, acked[sid])
            acked[sid] = count
    assert sum(acked.values()) > 100, "the writers made too little progress"
