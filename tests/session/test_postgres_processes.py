"""PostgreSQL sessions with real processes: SIGKILL, leases and fencing, a server restart.

- perdure.testing's CrashSuite: writers SIGKILLed at random moments and around
  every statement they send (inside a rewrite's transaction, between a commit and
  its acknowledgement): nothing acknowledged lost, nothing invented.
- Leases across processes: a SIGKILLed holder's lease is free at once; a stalled
  holder's (SIGSTOP) expires after ``lease`` seconds, and once another writer took
  it over the stalled one can no longer commit (fencing).
- Writers on their own sessions and writers fighting over one: no interleaving,
  nothing lost, every refusal typed.
- A server restart while a writer runs: its commits go on (or fail typed), never a
  duplicate, never a lost acknowledged message. Runs only where the test may
  restart the server (root, ``pg_ctlcluster``), bounded to 30 s.

Each test uses a schema of its own (see postgres_server).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from perdure.testing import CrashSuite, CrashTarget
from perdure.testing.crash import crash_history
from postgres_server import DSN, execute, import_psycopg, schema_fixture

import_psycopg()
from perdure.stores.postgres import PostgresSessionStore  # noqa: E402  (needs psycopg)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


def url_of(schema: str, **options: object) -> str:
    extra = "".join(f"&{key}={value}" for key, value in options.items())
    return f"{DSN}?schema={schema}{extra}"


class TestPostgresStoreCrash(CrashSuite):
    injects_deaths = True
    crash_kills = 24
    crash_share = 0.4
    crash_seed = 1717
    min_progress = 10

    @pytest.fixture
    def crash_target(self, schema: str) -> CrashTarget:
        return CrashTarget(
            "session_stores:crash_postgres_writer",
            url_of(schema),
            lambda: PostgresSessionStore(DSN, schema=schema),
        )


# ---------------------------------------------------------------- processes


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """A Python process running ``code`` with the tests' import path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str]) -> None:
    """Kill the process if it still runs, and close its pipes."""
    proc.kill()
    proc.communicate()


def line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    got = proc.stdout.readline()
    if not got:
        proc.wait(10)
        assert proc.stderr is not None
        raise AssertionError(f"the process ended: {proc.stderr.read()}")
    return got.strip()


HOLDER = """
import asyncio, sys
from perdure.session import open_store
from perdure.errors import PerdureError

async def main():
    store = open_store(sys.argv[1])
    await store.create("s", exist_ok=True)
    async with store.writer_lock("s"):
        record = await store.get("s")
        print("locked", flush=True)
        sys.stdin.readline()  # the test says when to commit (after a SIGSTOP, say)
        messages = [*record.messages, {"role": "user", "content": [{"text": "late"}]}]
        try:
            await store.commit("s", messages, expected_tail=record.tail)
            print("committed", flush=True)
        except PerdureError as exc:
            print("refused", exc.code, exc.details.get("reason"), flush=True)
    store.close()

asyncio.run(main())
"""


async def try_lock(store: PostgresSessionStore) -> None:
    async with store.writer_lock("s"):
        pass


def test_a_killed_holders_lease_is_free_at_once(schema: str) -> None:
    from perdure.errors import SessionLockedError

    holder = spawn(HOLDER, url_of(schema, lease=30))
    store = PostgresSessionStore(DSN, schema=schema, lease=30)
    try:
        assert line(holder) == "locked"
        with pytest.raises(SessionLockedError) as info:
            asyncio.run(try_lock(store))
        assert info.value.details["reason"] == "leased"
        assert 25 < info.value.details["expires_in"] <= 30
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        started = time.monotonic()
        while True:  # the server ends the dead holder's connection within moments
            try:
                asyncio.run(try_lock(store))
                break
            except SessionLockedError:
                assert time.monotonic() - started < 5, "the dead holder's lease was not freed"
                time.sleep(0.05)
    finally:
        finish(holder)
        store.close()


def test_a_stalled_holder_is_fenced_once_its_lease_is_taken_over(schema: str) -> None:
    from perdure.errors import SessionLockedError

    holder = spawn(HOLDER, url_of(schema, lease=1))
    store = PostgresSessionStore(DSN, schema=schema, lease=1)
    try:
        assert line(holder) == "locked"
        holder.send_signal(signal.SIGSTOP)  # alive and connected, but renewing nothing

        async def take_over() -> None:
            async with store.writer_lock("s"):
                record = await store.get("s")
                mine = [*record.messages, {"role": "user", "content": [{"text": "mine"}]}]
                await store.commit("s", mine, expected_tail=record.tail)

        started = time.monotonic()
        while True:
            try:
                asyncio.run(take_over())
                break
            except SessionLockedError:
                assert time.monotonic() - started < 5, "the stalled holder's lease never expired"
                time.sleep(0.1)
        assert time.monotonic() - started >= 0.5  # it waited for the expiry
        holder.send_signal(signal.SIGCONT)
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert line(holder) == "refused session_locked lease_lost"
        assert holder.wait(10) == 0
        record = asyncio.run(store.get("s"))
        assert [m["content"][0]["text"] for m in record.messages] == ["mine"]
    finally:
        finish(holder)
        store.close()


WRITER = """
import asyncio, json, sys, time
from perdure.session import open_store
from perdure.errors import PerdureError, SessionConflictError, SessionLockedError

async def main():
    url, name, session, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    store = open_store(url)
    await store.create(session, exist_ok=True)
    turn, refused = 0, {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            async with store.writer_lock(session):
                record = await store.get(session)
                history = list(record.messages)
                tail = record.tail
                for part in (0, 1):  # a turn: two commits, as a Session makes them
                    text = json.dumps([name, turn, part])
                    history.append({"role": "user", "content": [{"text": text}]})
                    tail = (await store.commit(session, history, expected_tail=tail)).tail
            print("ack", turn, flush=True)
            turn += 1
        except (SessionLockedError, SessionConflictError) as exc:
            refused[exc.code] = refused.get(exc.code, 0) + 1
            await asyncio.sleep(0.002)
    print("refused", json.dumps(refused), flush=True)
    store.close()

asyncio.run(main())
"""


def test_writers_on_their_own_sessions_and_two_fighting_over_one(schema: str) -> None:
    url = url_of(schema)
    own = [spawn(WRITER, url, f"w{i}", f"own-{i}", "4") for i in range(4)]
    fighters = [spawn(WRITER, url, f"f{i}", "shared", "4") for i in range(2)]
    outputs = {}
    for name, proc in [*((f"w{i}", p) for i, p in enumerate(own)),
                       *((f"f{i}", p) for i, p in enumerate(fighters))]:  # fmt: skip
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err  # any untyped refusal would have crashed it
        outputs[name] = out.splitlines()
    store = PostgresSessionStore(DSN, schema=schema)

    def acked(name: str) -> int:
        return sum(1 for text in outputs[name] if text.startswith("ack "))

    def turns(session: str) -> list[tuple[str, int]]:
        texts = [
            json.loads(m["content"][0]["text"]) for m in asyncio.run(store.get(session)).messages
        ]
        pairs = [texts[i : i + 2] for i in range(0, len(texts), 2)]
        for first, second in pairs:  # never interleaved: a turn's two commits are adjacent
            assert first[:2] == second[:2], pairs
            assert (first[2], second[2]) == (0, 1), pairs
        return [(first[0], first[1]) for first, _ in pairs]

    for i in range(4):
        assert turns(f"own-{i}") == [(f"w{i}", n) for n in range(acked(f"w{i}"))]
        assert acked(f"w{i}") > 0
    shared = turns("shared")
    for name in ("f0", "f1"):  # every acknowledged turn is there once, in order
        assert [n for who, n in shared if who == name] == list(range(acked(name)))
    assert len(shared) == acked("f0") + acked("f1")
    refusals = [json.loads(text.split(" ", 1)[1]) for f in ("f0", "f1") for text in outputs[f]
                if text.startswith("refused ")]  # fmt: skip
    assert sum(sum(r.values()) for r in refusals) > 0, "the two writers never met"
    assert {code for r in refusals for code in r} <= {"session_locked", "session_conflict"}
    store.close()


# ---------------------------------------------------------------- a server restart


def _cluster() -> str | None:
    """The local cluster's version, when this test may restart it (root, pg_ctlcluster)."""
    if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None:
        return None
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions or "127.0.0.1" not in DSN:
        return None
    return versions[-1]


RESTART_WRITER = """
import asyncio, sys, time
from perdure.session import open_store
from perdure.errors import PerdureError
from perdure.testing.crash import crash_history

async def main():
    store = open_store(sys.argv[1], reconnect_timeout=20)
    deadline = time.monotonic() + float(sys.argv[2])
    await store.create("c", exist_ok=True)
    op, tail = 0, (await store.get("c")).tail
    while time.monotonic() < deadline:
        try:
            async with store.writer_lock("c"):
                for _ in range(3):
                    result = await store.commit(
                        "c", crash_history(op + 1), agent_state={"op": op + 1},
                        rewritten=(op + 1) % 5 == 0, expected_tail=tail,
                    )
                    op, tail = op + 1, result.tail
                    print("ack", op, flush=True)
        except PerdureError as exc:
            print("error", exc.code, exc.details.get("outcome"), flush=True)
            while True:  # read the session again, as a Session would on its next turn
                try:
                    record = await store.get("c")
                    break
                except PerdureError:
                    await asyncio.sleep(0.2)
            op, tail = record.agent_state.get("op", 0), record.tail
            print("resync", op, flush=True)
    store.close()

asyncio.run(main())
"""


@pytest.mark.skipif(_cluster() is None, reason="restarting the server needs root and pg_ctlcluster")
def test_a_server_restart_while_a_writer_runs_loses_and_invents_nothing(schema: str) -> None:
    version = _cluster()
    assert version is not None
    writer = spawn(RESTART_WRITER, url_of(schema), "12")
    try:
        acks_before = 0
        while acks_before < 20:  # let it write first
            if line(writer).startswith("ack "):
                acks_before += 1
        started = execute("SELECT pg_postmaster_start_time()")
        restart = subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
            capture_output=True,
            text=True,
            timeout=25,
            check=False,
        )
        assert restart.returncode == 0, restart.stderr
        assert execute("SELECT pg_postmaster_start_time()") != started  # it did restart
        out, err = writer.communicate(timeout=40)
    finally:
        if writer.poll() is None:
            finish(writer)
    assert writer.returncode == 0, err
    acked: list[int] = list(range(1, acks_before + 1))
    errors = []
    for text in out.splitlines():
        kind, *rest = text.split()
        if kind == "ack":
            acked.append(int(rest[0]))
        elif kind == "error":
            errors.append(rest)
        elif kind == "resync":
            # After a typed error the session holds the last acknowledged op, or the
            # one in flight (applied, its answer lost): never less, never a gap.
            assert int(rest[0]) in (acked[-1], acked[-1] + 1), (rest, acked[-3:])
            acked.append(int(rest[0]))
    # Every acknowledged op follows the one before it: nothing duplicated or skipped.
    assert all(b in (a + 1, a) for a, b in itertools.pairwise(acked)), acked
    assert acked[-1] > acks_before + 5, "the writer made no progress after the restart"
    assert all(code == "store_unavailable" for code, _ in errors), errors
    store = PostgresSessionStore(DSN, schema=schema)
    record = asyncio.run(store.get("c"))
    store.close()
    assert record.agent_state["op"] == acked[-1]
    assert record.messages == crash_history(acked[-1])
