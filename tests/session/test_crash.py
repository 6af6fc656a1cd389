"""Crash safety by crashing: a writer process is SIGKILLed at many points (SPEC §7.1).

Each kill is followed by a check that the session opens, that every acknowledged
commit is there, and that nothing else was invented: the stored history is exactly
the one the writer had built after its last acknowledged commit, or after the one
in flight when it died. Half the kills land at random moments; the other half are
injected: for the file store at the renames and fsyncs of segment sealing and
rewrites, for the SQLite store inside and after its transactions and around WAL
folds. Half the writers hold the writer lock, as a Session does during a turn, so
their appends take the stores' inline paths; half the SQLite writers are
non-durable, whose commits a killed process must not lose either.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

from perdure.errors import SessionNotFoundError
from perdure.session import FileSessionStore, SessionRecord
from perdure.stores.sqlite import SQLiteSessionStore

# The parts of a writer script: a store's prelude (imports, argv, the injected
# deaths of its "inject" mode, open_store), then the same history and loop for all.
_COMMON = textwrap.dedent(
    """
    import asyncio, os, random, signal, sys

    target, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)

    def maybe_die():
        if mode == "inject" and rng.random() < 0.08:
            os.kill(os.getpid(), signal.SIGKILL)
    """
)
_HISTORY = textwrap.dedent(
    """
    def history(op):
        # The deterministic history after op `op`: op % 5 == 0 rewrites (compaction).
        messages = []
        for j in range(1, op + 1):
            if j % 5 == 0:
                messages = [{"role": "user", "content": [{"text": f"summary@{j}"}]}] + messages[-2:]
            else:
                role = "user" if len(messages) % 2 == 0 else "assistant"
                messages.append({"role": role, "content": [{"text": f"op{j}"}]})
        return messages
    """
)
_LOOP = textwrap.dedent(
    """
    async def main():
        store = open_store()
        await store.create("c", exist_ok=True)
        record = await store.get("c")
        op = record.agent_state.get("op", 0)
        print(f"start {op}", flush=True)
        # Half the writers run turns as a Session does, three commits under the
        # writer lock each: their appends take the stores' inline paths (on the loop;
        # the file store's fsync in the kernel, its seal after, its head written as
        # the turn ends; the SQLite store's session row remembered).
        if seed % 4 < 2:
            while True:
                async with store.writer_lock("c"):
                    op = await write_from(store, op, 3)
        else:
            await write_from(store, op, None)

    async def write_from(store, op, commits):
        while commits is None or commits > 0:
            op += 1
            messages = history(op)
            await store.commit("c", messages, agent_state={"op": op}, rewritten=op % 5 == 0)
            print(f"ack {op}", flush=True)
            if commits is not None:
                commits -= 1
        return op

    asyncio.run(main())
    """
)
FILE_PRELUDE = textwrap.dedent(
    """
    from perdure.session import FileSessionStore, Segmentation
    from perdure.stores.file import store as fs_module

    if mode == "inject":
        # Die inside the critical sections: at renames (seal, rewrite commit point and
        # completion) and at fsyncs, before or after the real call.
        real_replace, real_fsync = os.replace, os.fsync
        def replace(a, b):
            maybe_die(); real_replace(a, b); maybe_die()
        def fsync(fd):
            maybe_die(); real_fsync(fd)
        fs_module.os.replace = replace
        fs_module.os.fsync = fsync
        real_start_fsync = fs_module.start_fsync
        def start_fsync(fd, executor=None):  # appends inside a held turn sync here
            maybe_die(); return real_start_fsync(fd, executor)
        fs_module.start_fsync = start_fsync

    def open_store():
        return FileSessionStore(target, segmentation=Segmentation(max_records=4))
    """
)
SQLITE_PRELUDE = textwrap.dedent(
    """
    from perdure.stores.sqlite import SQLiteSessionStore

    if mode == "inject":
        # Die around the store's own steps: inside the transaction before COMMIT,
        # right after it, and around folding the WAL into the database.
        def around(name):
            real = getattr(SQLiteSessionStore, name)
            def wrapper(*args, **kwargs):
                maybe_die()
                result = real(*args, **kwargs)
                maybe_die()
                return result
            setattr(SQLiteSessionStore, name, wrapper)
        around("_write_messages")
        around("_count_wal")
        around("_checkpoint_wal")  # every fold, in the background or by the writer

    def open_store():
        # Even seeds: durable commits; odd: durability="none", whose commits must
        # survive a killed process too (only a power cut may take them).
        store = SQLiteSessionStore(target, durability="commit" if seed % 2 == 0 else "none")
        store._fold_pages = 4  # fold often, so that kills land around folds
        return store
    """
)
WRITER = _COMMON + FILE_PRELUDE + _HISTORY + _LOOP
SQLITE_WRITER = _COMMON + SQLITE_PRELUDE + _HISTORY + _LOOP


def history(op: int) -> list[dict[str, object]]:
    namespace: dict[str, object] = {}
    exec(_HISTORY, namespace)
    return namespace["history"](op)  # type: ignore[operator,no-any-return]


def kill_writers(
    script: Path, target: Path, rounds: int, seed: int, read: Callable[[], SessionRecord]
) -> int:
    """Run ``rounds`` writers of ``script`` on ``target``, each killed by SIGKILL.

    Odd rounds inject their own death (the script's "inject" mode); even rounds are
    killed at a random moment. After each, the session read back must be the history
    after the last acknowledged op or after the one in flight. Returns the last op.
    """
    rng = random.Random(seed)
    acked = 0
    created = False
    for round_number in range(rounds):
        mode = "inject" if round_number % 2 else "random"
        with subprocess.Popen(
            [sys.executable, str(script), str(target), mode, str(round_number)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            if mode == "random":
                threading.Event().wait(rng.uniform(0.15, 0.45))
                proc.send_signal(signal.SIGKILL)
            try:
                stdout, stderr = proc.communicate(timeout=20)
            finally:
                if proc.poll() is None:
                    proc.kill()
        assert proc.returncode == -signal.SIGKILL, f"writer did not die by SIGKILL: {stderr}"
        lines = stdout.splitlines()
        acks = [int(line.split()[1]) for line in lines if line.startswith("ack ")]
        starts = [int(line.split()[1]) for line in lines if line.startswith("start ")]
        if starts:
            assert starts[0] >= acked, "an acknowledged commit was lost across a restart"
        if acks:
            acked = max(acked, acks[-1])
        created = created or bool(starts)
        try:
            record = read()  # always reopens
        except SessionNotFoundError:
            # No writer has got past create() yet (a slow start, or a kill inside it):
            # the session may not exist, and then nothing was acknowledged either.
            assert not created, "the session vanished"
            continue
        op = record.agent_state.get("op", 0)
        assert op in (acked, acked + 1), f"stored op {op}, last acknowledged {acked}"
        assert record.messages == history(op), "the stored history is not one the writer built"
        acked = op
    return acked


def test_sigkill_at_many_points_never_loses_or_invents_a_commit(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = tmp_path / "store"
    kills = int(os.environ.get("PERDURE_CRASH_KILLS", "60"))
    last = kill_writers(
        script, root, kills, 1234, lambda: asyncio.run(FileSessionStore(root).get("c"))
    )
    # Every fifth op rewrites: past op 20, at least four rewrites were made.
    assert last > 20, "the writers made too little progress to exercise sealing"


def test_sqlite_sigkill_at_many_points_never_loses_or_invents_a_commit(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(SQLITE_WRITER)
    path = tmp_path / "sessions.db"

    def read() -> SessionRecord:
        store = SQLiteSessionStore(path)
        try:
            return asyncio.run(store.get("c"))
        finally:
            store.close()

    kills = int(os.environ.get("PERDURE_CRASH_KILLS", "60"))
    assert kill_writers(script, path, kills // 2, 4321, read) > 20, "too little progress"
