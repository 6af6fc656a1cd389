"""SIGKILL during saves and collections: latest is the old or the new state, never broken.

A child process appends messages and saves ``snapshot_latest`` after each one,
printing an ack once the save returned (on ``LocalFileStorage`` a save appends one
record to latest's log, which is started afresh now and then: every few saves in the
``local-short-log`` case); it appends an immutable snapshot every few messages and
deletes old snapshots (a collection) now and then. The parent kills it
with SIGKILL at random moments, many times, each time resuming from what is stored,
and checks after every kill that:

* ``latest`` restores to exactly the acknowledged history, or to that history plus the
  one message whose save was in flight (old or new state, never a broken one);
* every remaining snapshot restores, and an acknowledged snapshot holds exactly the
  history it was taken of (no manifest points at a missing chunk).
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, NullConversationManager
from perdure.models import ScriptedModel
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.storage import LocalFileStorage, SQLiteStorage, Storage

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from perdure import Agent, NullConversationManager
    from perdure.models import ScriptedModel
    from perdure.snapshots.manager import SnapshotSessionManager
    from perdure.storage import LocalFileStorage, SQLiteStorage

    def message(i):
        body = f"m{i} " + "abcdefghij"[i % 10] * (100 + (i * 37) % 1900)
        return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": body}]}

    async def main():
        kind, where = sys.argv[1], sys.argv[2]
        if kind == "local-short-log":  # latest's log is started afresh every few saves
            import perdure.snapshots.log
            perdure.snapshots.log.LOG_BYTES = 2048
        storage = SQLiteStorage(where) if kind == "sqlite" else LocalFileStorage(where)
        manager = SnapshotSessionManager("crash", storage=storage)
        agent = Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())
        await manager.restore_snapshot(agent)
        n = len(agent.messages)
        assert agent.messages == [message(i) for i in range(n)], "resumed a wrong history"
        print(f"start {n}", flush=True)
        while True:
            agent.messages.append(message(n))
            n += 1
            await manager.save_snapshot(agent, is_latest=True)
            print(f"ack {n}", flush=True)
            if n % 5 == 0:
                snapshot_id = await manager.save_snapshot(agent, is_latest=False)
                print(f"snap {snapshot_id} {n}", flush=True)
            if n % 9 == 0:
                ids = await manager.list_snapshot_ids(agent)
                for old in ids[:-4]:
                    await manager.delete_snapshot(agent, snapshot_id=old)
                print(f"gc {n}", flush=True)

    asyncio.run(main())
    """
)


def message(i: int) -> dict[str, Any]:
    body = f"m{i} " + "abcdefghij"[i % 10] * (100 + (i * 37) % 1900)
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": body}]}


def restore(storage: Storage, snapshot_id: str | None = None) -> list[Any] | None:
    agent = Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())
    manager = SnapshotSessionManager("crash", storage=storage)
    found = asyncio.run(manager.restore_snapshot(agent, snapshot_id=snapshot_id))
    return list(agent.messages) if found else None


def run_and_kill(script: Path, kind: str, where: Path, delay: float) -> list[str]:
    child = subprocess.Popen(
        [sys.executable, str(script), kind, str(where)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    started = threading.Event()
    assert child.stdout is not None
    assert child.stderr is not None

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("ack"):
                started.set()
        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(timeout=30)
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait()
    reader.join()
    errors = child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL, errors
    assert lines, errors
    assert lines[0].startswith("start"), errors
    return lines


def open_storage(kind: str, where: Path) -> Storage:
    return SQLiteStorage(where) if kind == "sqlite" else LocalFileStorage(where)


@pytest.mark.parametrize(("kind", "kills"), [("local", 32), ("local-short-log", 24), ("sqlite", 6)])
def test_sigkill_at_random_points_never_breaks_latest_or_snapshots(
    tmp_path: Path, kind: str, kills: int
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    where = tmp_path / ("blobs.db" if kind == "sqlite" else "blobs")
    rng = random.Random(20240604 + kills)
    acked = 0
    snapshot_sizes: dict[str, int] = {}
    for kill in range(kills):
        lines = run_and_kill(script, kind, where, rng.uniform(0.0, 0.08))
        start = int(lines[0].split()[1])
        assert start in (acked, acked + 1), f"kill {kill}: resumed at {start}, acked {acked}"
        for line in lines[1:]:
            word, *rest = line.split()
            if word == "ack":
                acked = int(rest[0])
            elif word == "snap":
                snapshot_sizes[rest[0]] = int(rest[1])
        storage = open_storage(kind, where)
        try:
            latest = restore(storage)
            assert latest is not None
            assert len(latest) in (acked, acked + 1), f"kill {kill}: {len(latest)} vs {acked}"
            assert latest == [message(i) for i in range(len(latest))]
            acked = len(latest)
            ids = asyncio.run(
                SnapshotSessionManager("crash", storage=storage).list_snapshot_ids(
                    Agent(model=ScriptedModel([]))
                )
            )
            for snapshot_id in ids:
                held = restore(storage, snapshot_id)
                assert held is not None
                assert held == [message(i) for i in range(len(held))]
                if snapshot_id in snapshot_sizes:
                    assert len(held) == snapshot_sizes[snapshot_id]
        finally:
            if isinstance(storage, SQLiteStorage):
                storage.close()
    assert acked > kills  # the child made progress between kills
    # A final collection after all the kills leaves every manifest whole.
    storage = open_storage(kind, where)
    try:
        manager = SnapshotSessionManager("crash", storage=storage)
        agent = Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())
        asyncio.run(manager.restore_snapshot(agent))
        asyncio.run(manager.collect_garbage(agent))
        assert restore(storage) == agent.messages
        for snapshot_id in asyncio.run(manager.list_snapshot_ids(agent)):
            assert restore(storage, snapshot_id) is not None
    finally:
        if isinstance(storage, SQLiteStorage):
            storage.close()
