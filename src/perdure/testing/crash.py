"""The crash suite (SPEC §7): a writer process is SIGKILLed at many points.

Each kill is followed by a check that the session opens, that every acknowledged
commit is there, and that nothing else was invented: the stored history is exactly
the one the writer had built after its last acknowledged commit, or after the one
in flight when it died. Every fifth commit rewrites the history (as compaction
does); half the writers hold the writer lock, as a Session does during a turn.

Subclass :class:`CrashSuite` in a ``Test*`` class and give it one fixture,
``crash_target``: a :class:`CrashTarget` naming how the writer process opens the
store (an importable ``"module:function"``, since the writer is a new process) and
how the test reopens it::

    # my_backend_testing.py, importable by the test process (and so by the writer)
    def crash_writer(location, seed, die):
        return MyStore(location)

    class TestMyStoreCrash(CrashSuite):
        @pytest.fixture
        def crash_target(self, tmp_path):
            return CrashTarget(
                writer="my_backend_testing:crash_writer",
                location=str(tmp_path / "store"),
                reopen=lambda: MyStore(tmp_path / "store"),
            )

``die()`` SIGKILLs the writer with a small chance on each call; a backend that
sets ``injects_deaths = True`` calls it inside its own critical sections (around
renames, fsyncs, transactions) so that kills land there, not only at random
moments. Runs on POSIX only (SIGKILL).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from perdure.errors import SessionNotFoundError
from perdure.session.store import SessionRecord, SessionStore
from perdure.testing._crash_writer import crash_history
from perdure.testing._support import close

__all__ = ["CrashSuite", "CrashTarget", "crash_history"]


@dataclass(frozen=True)
class CrashTarget:
    """Where a crash test's writer writes, and how it is read back.

    Attributes:
        writer: ``"module:function"`` importable in a new Python process with the
            test process's ``sys.path``; called there as ``function(location, seed,
            die)`` and returning the :class:`SessionStore` the writer commits to.
            ``seed`` differs per writer (a backend may vary its options with it);
            ``die`` is described in the module docstring.
        location: what the writer's store is opened over (a path, a URL).
        reopen: opens the store in the test process after each kill (closed with
            ``close()`` after the read, when it has one).
    """

    writer: str
    location: str
    reopen: Callable[[], SessionStore]


def _read(target: CrashTarget) -> SessionRecord:
    import asyncio

    store = target.reopen()
    try:
        return asyncio.run(store.get("c"))
    finally:
        close(store)


def _child_env() -> dict[str, str]:
    """The environment of a writer: this process's import path, so it finds the same code."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def kill_writers(target: CrashTarget, rounds: int, seed: int, *, inject: bool) -> int:
    """Run ``rounds`` writers on ``target``, each killed by SIGKILL; return the last op.

    With ``inject``, odd rounds die by their own ``die()`` (the writer's "inject"
    mode); the others are killed at a random moment. After each, the session read
    back must be the history after the last acknowledged op or after the one in
    flight.
    """
    rng = random.Random(seed)
    acked = 0
    created = False
    env = _child_env()
    for round_number in range(rounds):
        mode = "inject" if inject and round_number % 2 else "random"
        with subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perdure.testing._crash_writer",
                target.writer,
                target.location,
                mode,
                str(round_number),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
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
            record = _read(target)  # always reopens
        except SessionNotFoundError:
            # No writer has got past create() yet (a slow start, or a kill inside it):
            # the session may not exist, and then nothing was acknowledged either.
            assert not created, "the session vanished"
            continue
        op: Any = record.agent_state.get("op", 0)
        assert op in (acked, acked + 1), f"stored op {op}, last acknowledged {acked}"
        assert record.messages == crash_history(op), (
            "the stored history is not one the writer built"
        )
        acked = op
    return int(acked)


class CrashSuite:
    """SIGKILL a writer at many points; nothing acknowledged is lost, nothing invented.

    Needs one fixture, ``crash_target`` (see the module docstring).

    Attributes:
        crash_kills: writers killed (``PERDURE_CRASH_KILLS`` in the environment
            overrides it, scaled by ``crash_share``).
        crash_share: the share of ``PERDURE_CRASH_KILLS`` this backend runs.
        crash_seed: seeds the random kill moments.
        min_progress: the last op must pass this, so that rewrites were exercised
            (every fifth op rewrites).
        injects_deaths: the writer calls ``die()`` inside the store's critical
            sections; half the rounds then die there instead of at random.
    """

    crash_kills: ClassVar[int] = 60
    crash_share: ClassVar[float] = 1.0
    crash_seed: ClassVar[int] = 1234
    min_progress: ClassVar[int] = 20
    injects_deaths: ClassVar[bool] = False

    def kills(self) -> int:
        """How many writers this run kills."""
        configured = os.environ.get("PERDURE_CRASH_KILLS")
        if configured is None:
            return self.crash_kills
        return int(int(configured) * self.crash_share)

    def test_sigkill_at_many_points_never_loses_or_invents_a_commit(
        self, crash_target: CrashTarget
    ) -> None:
        if sys.platform == "win32":  # pragma: no cover - POSIX signals
            pytest.skip("SIGKILL is POSIX")
        last = kill_writers(crash_target, self.kills(), self.crash_seed, inject=self.injects_deaths)
        assert last > self.min_progress, "the writers made too little progress"
