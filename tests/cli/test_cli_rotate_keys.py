"""``perdure rotate-keys`` (SPEC §9): re-encrypts in place and resumes after SIGKILL.

The command runs as a real process over a file and a SQLite store whose sessions
and checkpoints are under key ``k1``; it kills itself (SIGKILL) at a random write
step 20 times, the store checked readable with the old and new keys after each kill,
then runs to the end: every record must read with a cipher that holds ``k2`` only.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from crypto_keys import K1, K2, cipher
from perdure.checkpoints.store import CheckpointMeta, CheckpointRecord
from perdure.cli.main import cli
from perdure.crypto import AESGCMCipher
from perdure.errors import DecryptionError
from perdure.maintenance import verify_store
from perdure.session import SessionStore, open_store
from perdure.session.ulid import new_ulid
from pii import run

SESSIONS = 120
MESSAGES = 24
ONLY_K2 = AESGCMCipher(keys={"k2": K2}, active="k2")
SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])


def _history(session_id: str) -> list[Any]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"{session_id}/{i}"}]}
        for i in range(MESSAGES)
    ]


def _url(kind: str, tmp_path: Path) -> str:
    return f"file:{tmp_path / 'store'}" if kind == "file" else f"sqlite:{tmp_path / 'p.db'}"


async def _fill(store: SessionStore) -> None:
    for n in range(SESSIONS):
        session_id = f"s{n:03d}"
        await store.create(session_id)
        await store.commit(session_id, _history(session_id), agent_state={"n": n})
        if n % 10 == 0:
            meta = CheckpointMeta(new_ulid(), session_id, "manual", None, MESSAGES, "2026-01-01Z")
            await store.checkpoints.put(  # type: ignore[attr-defined]
                CheckpointRecord(meta, _history(session_id), {"n": n})
            )


async def _check(store: SessionStore) -> None:
    """Every session and checkpoint reads, and holds what was written."""
    for n in range(SESSIONS):
        session_id = f"s{n:03d}"
        record = await store.get(session_id)
        assert record.messages == _history(session_id)
        assert record.agent_state == {"n": n}
        checkpoints = store.checkpoints  # type: ignore[attr-defined]
        for meta in await checkpoints.list(session_id):
            assert (await checkpoints.get(session_id, meta.checkpoint_id)).messages == (
                _history(session_id)
            )


async def _rotated(url: str) -> int:
    """How many sessions read with k2 alone."""
    store = open_store(url, cipher=ONLY_K2)
    count = 0
    for n in range(SESSIONS):
        try:
            await store.get(f"s{n:03d}")
        except DecryptionError:
            continue
        count += 1
    store.close()  # type: ignore[attr-defined]
    return count


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    encoded = {k: base64.b64encode(v).decode() for k, v in {"k1": K1, "k2": K2}.items()}
    path.write_text(json.dumps({"keys": encoded, "active": "k1"}))
    return path


def _command(url: str, keys: Path) -> list[str]:
    return [
        sys.executable, "-m", "perdure.cli.main", "rotate-keys",
        "--store", url, "--to", "k2", "--keys-file", str(keys),
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_rotation_killed_20_times_always_resumes(kind: str, tmp_path: Path) -> None:
    url = _url(kind, tmp_path)
    store = open_store(url, cipher=cipher("k1"))
    run(_fill(store))
    store.close()  # type: ignore[attr-defined]
    keys = _key_file(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS])}
    rng = random.Random(20)
    states: list[int] = []
    for _ in range(20):
        # Killed at a random write step of its own: inside a session's rewrite, a
        # checkpoint's replace, or between them (tests/rotate_keys_child.py).
        killed = subprocess.run(
            [sys.executable, str(Path(TESTS) / "rotate_keys_child.py"),
             str(rng.randint(1, 40)), *_command(url, keys)[3:]],
            env=env, capture_output=True, timeout=300,
        )  # fmt: skip
        # Killed, or done before its step came: never an error of its own.
        assert killed.returncode in (-signal.SIGKILL, 0), killed.stderr
        # Killed anywhere, the store reads with the keys it had.
        both = open_store(url, cipher=cipher("k2"))
        run(_check(both))
        both.close()  # type: ignore[attr-defined]
        states.append(run(_rotated(url)))
    # The kills landed all through the rotation: it moved on a little each time.
    assert sum(0 < rotated < SESSIONS for rotated in states) >= 5, states
    assert states == sorted(states), states  # a resumed run never undoes one before it
    done = subprocess.run(_command(url, keys), env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert b"everything is under key 'k2'" in done.stdout
    only_k2 = open_store(url, cipher=ONLY_K2)
    run(_check(only_k2))
    only_k2.close()  # type: ignore[attr-defined]
    keyless = open_store(url)
    assert run(verify_store(keyless)).clean
    keyless.close()  # type: ignore[attr-defined]
    # k1 alone reads none of it now.
    only_k1 = open_store(url, cipher=AESGCMCipher(keys={"k1": K1}, active="k1"))
    with pytest.raises(DecryptionError):
        run(only_k1.get("s000"))
    only_k1.close()  # type: ignore[attr-defined]


def test_rotate_keys_reports_and_takes_keys_from_the_environment(tmp_path: Path) -> None:
    url = _url("sqlite", tmp_path)
    store = open_store(url, cipher=cipher("k1"))
    run(store.create("a"))
    run(store.commit("a", _history("a")))
    store.close()  # type: ignore[attr-defined]
    keys = _key_file(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["rotate-keys", "--store", url, "--to", "k2", "--json"],
        env={"PERDURE_KEYS_FILE": str(keys), "PERDURE_KEYS": ""},
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["sessions_rotated"] == 1
    assert report["keys_seen"] == ["k1"]
    again = runner.invoke(cli, ["rotate-keys", "--store", url, "--to", "k2", "--json"],
                          env={"PERDURE_KEYS": keys.read_text()})  # fmt: skip
    assert json.loads(again.output)["sessions_rotated"] == 0  # nothing left to do
    assert run(open_store(url, cipher=ONLY_K2).get("a")).messages == _history("a")


def test_rotate_keys_refuses_missing_or_unknown_keys(tmp_path: Path) -> None:
    url = _url("sqlite", tmp_path)
    store = open_store(url, cipher=cipher("k1"))
    run(store.create("a"))
    store.close()  # type: ignore[attr-defined]
    runner = CliRunner()
    none = runner.invoke(cli, ["rotate-keys", "--store", url, "--to", "k2"],
                         env={"PERDURE_KEYS": "", "PERDURE_KEYS_FILE": ""})  # fmt: skip
    assert none.exit_code == 2
    assert "no keys" in none.output
    keys = _key_file(tmp_path)
    unknown = runner.invoke(
        cli, ["rotate-keys", "--store", url, "--to", "k9", "--keys-file", str(keys)]
    )
    assert unknown.exit_code == 2
    assert "--to: key 'k9'" in unknown.output
    missing = runner.invoke(
        cli,
        ["rotate-keys", "--store", f"sqlite:{tmp_path / 'none.db'}", "--to", "k2",
         "--keys-file", str(keys)],
    )  # fmt: skip
    assert missing.exit_code == 3


def test_every_command_reads_an_encrypted_store_with_the_keys_in_the_environment(
    tmp_path: Path,
) -> None:
    url = _url("file", tmp_path)
    store = open_store(url, cipher=cipher("k1"))
    run(store.create("a"))
    run(store.commit("a", _history("a")))
    store.close()  # type: ignore[attr-defined]
    keys = _key_file(tmp_path)
    runner = CliRunner()
    history = ["sessions", "history", "a", "--store", url, "--json"]
    keyless = runner.invoke(cli, history, env={"PERDURE_KEYS": "", "PERDURE_KEYS_FILE": ""})
    assert keyless.exit_code == 6
    assert "[decryption]" in keyless.output
    keyed = runner.invoke(cli, history, env={"PERDURE_KEYS_FILE": str(keys), "PERDURE_KEYS": ""})
    assert keyed.exit_code == 0, keyed.output
    assert "a/3" in keyed.output
    # verify needs no key; with one it reads everything too.
    for env in ({"PERDURE_KEYS": ""}, {"PERDURE_KEYS_FILE": str(keys), "PERDURE_KEYS": ""}):
        assert runner.invoke(cli, ["verify", "--store", url], env=env).exit_code == 0
    # A damaged record is healed with the key: the rest is rewritten encrypted.
    (journal,) = (tmp_path / "store").rglob("journal.jsonl")
    data = bytearray(journal.read_bytes())
    at = data.rindex(b"~pd1~") + 10
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    journal.write_bytes(bytes(data))
    env = {"PERDURE_KEYS_FILE": str(keys), "PERDURE_KEYS": ""}
    assert runner.invoke(cli, ["verify", "--store", url], env=env).exit_code == 1
    healed = runner.invoke(cli, ["repair", "--store", url, "--apply"], env=env)
    assert healed.exit_code == 0, healed.output
    assert runner.invoke(cli, ["verify", "--store", url], env={"PERDURE_KEYS": ""}).exit_code == 0
    several = runner.invoke(
        cli,
        history,
        env={"PERDURE_KEYS": json.dumps({"keys": json.loads(keys.read_text())["keys"]})},
    )
    assert several.exit_code == 2
    assert '"active"' in several.output


def _snapshots(root: Path, active: str) -> Any:
    from perdure.session import SnapshotSessionManager
    from perdure.storage import LocalFileStorage

    storage = LocalFileStorage(root, cipher=cipher(active) if active != "k2-only" else ONLY_K2)
    return SnapshotSessionManager("s", storage=storage)


def _raw_key_ids(root: Path) -> set[str]:
    from perdure.crypto import envelope_key_id

    blobs = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]
    assert blobs
    return {envelope_key_id(p.read_bytes()) for p in blobs}


def _saved_agent(root: Path, turns: int) -> list[Any]:
    from perdure import Agent
    from perdure.models import ScriptedModel

    manager = _snapshots(root, "k1")
    agent = Agent(ScriptedModel([f"a{i}" for i in range(turns)]), session_manager=manager)
    for i in range(turns):
        agent(f"q{i}")
        if i % 7 == 0:
            run(manager.save_snapshot(agent, is_latest=False))  # an immutable snapshot too
    return list(agent.messages)


def _restored(root: Path) -> list[Any]:
    from perdure import Agent
    from perdure.models import ScriptedModel

    return list(Agent(ScriptedModel([]), session_manager=_snapshots(root, "k2-only")).messages)


def test_rotate_keys_of_a_snapshot_storage_killed_anywhere_resumes(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    history = _saved_agent(root, 40)  # latest, immutable snapshots and sealed chunks
    assert _raw_key_ids(root) == {"k1"}
    keys = _key_file(tmp_path)
    command = ["rotate-keys", "--storage", f"file:{root}", "--to", "k2", "--keys-file", str(keys)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS])}
    rng = random.Random(7)
    mixed = 0
    for _ in range(8):
        killed = subprocess.run(
            [sys.executable, str(Path(TESTS) / "rotate_keys_child.py"), str(rng.randint(1, 12)),
             *command],
            env=env, capture_output=True, timeout=300,
        )  # fmt: skip
        assert killed.returncode in (-signal.SIGKILL, 0), killed.stderr
        # Killed anywhere, the agent comes back whole with both keys at hand.
        from perdure import Agent
        from perdure.models import ScriptedModel

        both = Agent(ScriptedModel([]), session_manager=_snapshots(tmp_path / "snapshots", "k2"))
        assert both.messages == history
        mixed += _raw_key_ids(root) == {"k1", "k2"}
    assert mixed >= 2  # the kills landed part-way through
    done = subprocess.run(
        [sys.executable, "-m", "perdure.cli.main", *command, "--json"],
        env=env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["to"] == "k2"
    assert report["blobs_changed"] == 0
    assert _raw_key_ids(root) == {"k2"}
    assert _restored(root) == history  # k2 alone reads it all
    again = CliRunner().invoke(cli, [*command, "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["blobs_rotated"] == 0  # nothing left to do


def test_rotate_keys_of_a_storage_leaves_a_blob_another_writer_replaced(tmp_path: Path) -> None:
    from perdure.rotation import rotate_storage_keys
    from perdure.storage import MemoryStorage

    class Racing(MemoryStorage):
        async def read(self, key: str) -> bytes | None:
            data = await super().read(key)
            if key == "a":  # another writer saves "a" between the version read and now
                await super().write("a", b"new a")
            return data

    racing = Racing(cipher=cipher("k1"))
    run(racing.write("a", b"old a"))
    run(racing.write("b", b"old b"))

    def opened(tally: Any) -> MemoryStorage:
        racing.cipher = tally  # the rotation's cipher from now on (a public attribute)
        return racing

    report = run(rotate_storage_keys(opened, cipher("k2")))
    assert (report.blobs_checked, report.blobs_rotated, report.blobs_changed) == (2, 1, 1)
    assert run(racing.read("a")) == b"new a"  # the other writer's, not the old bytes
    assert run(racing.read("b")) == b"old b"


def test_rotate_keys_takes_a_store_or_a_storage_not_both(tmp_path: Path) -> None:
    keys = _key_file(tmp_path)
    runner = CliRunner()
    both = runner.invoke(
        cli,
        ["rotate-keys", "--store", f"sqlite:{tmp_path / 'p.db'}", "--storage",
         f"file:{tmp_path / 's'}", "--to", "k2", "--keys-file", str(keys)],
    )  # fmt: skip
    assert both.exit_code == 2
    assert "give one of --store, --storage and --memory" in both.output
    missing = runner.invoke(
        cli,
        ["rotate-keys", "--storage", f"file:{tmp_path / 'none'}", "--to", "k2",
         "--keys-file", str(keys)],
    )  # fmt: skip
    assert missing.exit_code == 3
    assert not (tmp_path / "none").exists()
