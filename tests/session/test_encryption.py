"""Encryption at rest in every session store (SPEC §9): what is written is ciphertext,
the chain covers it (``verify`` needs no key), a wrong or missing key is
``DecryptionError``, older keys and older plain rows still read."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from server_bytes import postgres_bytes, redis_bytes
from session_stores import STORE_KINDS, make_store

from crypto_keys import K1, K2, cipher
from perdure.checkpoints.store import CheckpointMeta, CheckpointRecord
from perdure.crypto import AESGCMCipher
from perdure.errors import DecryptionError
from perdure.maintenance import verify_store
from perdure.session import SessionStore
from perdure.session.ulid import new_ulid
from pii import files_under

SECRET = "alice.smith@example.com"
STATE_SECRET = "state-secret-4711"
PERSISTENT = [kind for kind in STORE_KINDS if kind != "memory"]


def _stored(kind: str, tmp_path: Path) -> bytes:
    """Every byte the store of ``kind`` wrote, read behind its back."""
    if kind == "postgres":
        return postgres_bytes()
    if kind == "redis":
        return redis_bytes()
    out = []
    for path in files_under(tmp_path):
        data = path.read_bytes()
        out.append(data)
        if data.startswith(b"SQLite format 3"):
            with sqlite3.connect(path) as db:
                out.append("\n".join(db.iterdump()).encode())
    return b"\n".join(out)


def _messages(n: int = 3) -> list[Any]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"{SECRET} #{i}"}]}
        for i in range(n)
    ]


async def _fill(store: SessionStore, session_id: str = "s1") -> list[Any]:
    messages = _messages()
    await store.create(session_id)
    tail = (await store.commit(session_id, messages, agent_state={"k": STATE_SECRET})).tail
    messages.append({"role": "user", "content": [{"image": {"format": "png", "source": {
        "bytes": SECRET.encode() * 100}}}]})  # fmt: skip
    await store.commit(session_id, messages, expected_tail=tail)
    # A commit without expected_tail compares with the stored last message.
    messages.append({"role": "assistant", "content": [{"text": "ok"}]})
    await store.commit(session_id, messages)
    return messages


@pytest.mark.parametrize("kind", PERSISTENT)
async def test_everything_written_is_ciphertext_and_reads_back(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path, cipher=cipher())
    messages = await _fill(store)
    record = await store.get("s1")
    assert record.messages == messages
    assert record.agent_state == {"k": STATE_SECRET}
    assert (await store.get("s1", offset=3)).messages == messages[3:]
    written = _stored(kind, tmp_path)
    assert written
    assert SECRET.encode() not in written
    assert STATE_SECRET.encode() not in written
    assert b"~pd1~" in written  # the bodies are there, sealed


@pytest.mark.parametrize("kind", PERSISTENT)
async def test_the_check_finds_what_an_unencrypted_store_writes(kind: str, tmp_path: Path) -> None:
    await _fill(make_store(kind, tmp_path))
    written = _stored(kind, tmp_path)
    assert SECRET.encode() in written
    assert STATE_SECRET.encode() in written


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_a_wrong_or_missing_key_is_decryption_error(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path, cipher=cipher())
    await _fill(store)
    if kind == "memory":  # one object: the others read the same data through it
        store.cipher = None  # type: ignore[attr-defined]
        keyless: SessionStore = store
    else:
        keyless = make_store(kind, tmp_path)
    with pytest.raises(DecryptionError) as missing:
        await keyless.get("s1")
    assert missing.value.code == "decryption"
    assert missing.value.details["reason"] == "no_cipher"
    wrong = AESGCMCipher(keys={"k1": K1[::-1]}, active="k1")
    if kind == "memory":
        store.cipher = wrong  # type: ignore[attr-defined]
        other: SessionStore = store
    else:
        other = make_store(kind, tmp_path, cipher=wrong)
    with pytest.raises(DecryptionError) as bad:
        await other.get("s1")
    assert bad.value.details["reason"] == "authentication_failed"


@pytest.mark.parametrize("kind", PERSISTENT)
async def test_old_keys_and_old_plain_rows_still_read(kind: str, tmp_path: Path) -> None:
    plain = make_store(kind, tmp_path)
    await plain.create("s1")
    before = _messages(2)
    tail = (await plain.commit("s1", before)).tail
    under_k1 = make_store(kind, tmp_path, cipher=cipher("k1"))
    more = [*before, *_messages(2)]
    tail = (await under_k1.commit("s1", more, expected_tail=tail)).tail
    under_k2 = make_store(kind, tmp_path, cipher=cipher("k2"))
    most = [*more, {"role": "user", "content": [{"text": "last"}]}]
    await under_k2.commit("s1", most, expected_tail=tail)
    assert (await under_k2.get("s1")).messages == most


@pytest.mark.parametrize("kind", PERSISTENT)
async def test_verify_needs_no_key_and_still_finds_damage(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path, cipher=cipher())
    await _fill(store)
    checkpoints: Any = store.checkpoints  # type: ignore[attr-defined]
    meta = CheckpointMeta(new_ulid(), "s1", "manual", None, 5, "2026-01-01T00:00:00Z")
    await checkpoints.put(CheckpointRecord(meta, _messages(), {"k": STATE_SECRET}))
    keyless = make_store(kind, tmp_path)
    report = await verify_store(keyless)
    assert report.clean, report
    assert (report.sessions_checked, report.checkpoints_checked) == (1, 1)
    if kind not in ("file", "sqlite"):
        return
    _flip_a_ciphertext_byte(kind, tmp_path)
    report = await verify_store(make_store(kind, tmp_path))
    assert not report.clean
    assert report.damaged_sessions == ("s1",)


def _flip_a_ciphertext_byte(kind: str, tmp_path: Path) -> None:
    """Change one base64 character inside the first sealed message body."""
    if kind == "file":
        (journal,) = [p for p in files_under(tmp_path) if p.name == "journal.jsonl"]
        data = bytearray(journal.read_bytes())
        at = data.index(b"~pd1~") + 20
        data[at] = ord("A") if data[at] != ord("A") else ord("B")
        journal.write_bytes(bytes(data))
        return
    with sqlite3.connect(tmp_path / "sessions.db") as db:
        key, body = db.execute("SELECT key, body FROM perdure_messages ORDER BY key").fetchone()
        at = body.index("~pd1~") + 20
        body = body[:at] + ("A" if body[at] != "A" else "B") + body[at + 1 :]
        db.execute("UPDATE perdure_messages SET body = ? WHERE key = ?", (body, key))


def test_a_cipher_that_is_no_cipher_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"cipher must be a perdure\.crypto\.Cipher"):
        make_store("sqlite", tmp_path, cipher=b"k" * 32)


def test_a_snapshot_manager_with_a_cipher_writes_ciphertext(tmp_path: Path) -> None:
    from perdure import Agent, SnapshotSessionManager
    from perdure.models import ScriptedModel
    from perdure.storage import LocalFileStorage

    storage = LocalFileStorage(tmp_path / "blobs")

    def manager(c: Any) -> SnapshotSessionManager:
        return SnapshotSessionManager(
            "s1", storage=storage, cipher=c, snapshot_trigger=lambda **_: True
        )

    agent = Agent(model=ScriptedModel(["noted"]), session_manager=manager(cipher()))
    agent(f"my mail is {SECRET}")
    agent.state.set("k", STATE_SECRET)
    written = b"".join(path.read_bytes() for path in files_under(tmp_path))
    assert written
    assert SECRET.encode() not in written
    restored = Agent(model=ScriptedModel([]), session_manager=manager(cipher("k2")))
    assert SECRET in str(restored.messages)
    with pytest.raises(DecryptionError):
        Agent(model=ScriptedModel([]), session_manager=manager(None))


async def test_verify_without_the_key_checks_the_state_too(tmp_path: Path) -> None:
    store = make_store("sqlite", tmp_path, cipher=cipher())
    await _fill(store)
    store.close()  # type: ignore[attr-defined]
    with sqlite3.connect(tmp_path / "sessions.db") as db:
        (body,) = db.execute("SELECT body FROM perdure_states").fetchone()
        at = body.index("~pd1~") + 12
        body = body[:at] + ("A" if body[at] != "A" else "B") + body[at + 1 :]
        db.execute("UPDATE perdure_states SET body = ?", (body,))
    report = await verify_store(make_store("sqlite", tmp_path))
    assert report.damaged_sessions == ("s1",)
    assert report.damage[0].kind == "bad_state"


async def test_repair_quarantines_a_damaged_encrypted_checkpoint_without_the_key(
    tmp_path: Path,
) -> None:
    from perdure.maintenance import repair_store

    store = make_store("file", tmp_path, cipher=cipher())
    await _fill(store)
    checkpoints: Any = store.checkpoints  # type: ignore[attr-defined]
    for _ in range(2):
        meta = CheckpointMeta(new_ulid(), "s1", "manual", None, 5, "2026-01-01T00:00:00Z")
        await checkpoints.put(CheckpointRecord(meta, _messages(), {}))
    damaged = checkpoints.checkpoint_path("s1", meta.checkpoint_id)
    data = bytearray(damaged.read_bytes())
    at = data.index(b'"sealed":"') + 20
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    damaged.write_bytes(bytes(data))
    keyless = make_store("file", tmp_path)
    report = await repair_store(keyless, dry_run=False)  # type: ignore[arg-type]
    assert [c.status for c in report.checkpoints] == ["quarantined"]
    assert (await verify_store(make_store("file", tmp_path))).clean
    assert len(await make_store("file", tmp_path, cipher=cipher()).checkpoints.list("s1")) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_verify_without_the_key_finds_a_checkpoint_that_holds_another(
    kind: str, tmp_path: Path
) -> None:
    store = make_store(kind, tmp_path, cipher=cipher())
    await _fill(store)
    checkpoints: Any = store.checkpoints  # type: ignore[attr-defined]
    ids = []
    for _ in range(2):
        meta = CheckpointMeta(new_ulid(), "s1", "manual", None, 5, "2026-01-01T00:00:00Z")
        await checkpoints.put(CheckpointRecord(meta, _messages(), {}))
        ids.append(meta.checkpoint_id)
    store.close()  # type: ignore[attr-defined]
    if kind == "file":
        first = checkpoints.checkpoint_path("s1", ids[0])
        first.write_bytes(checkpoints.checkpoint_path("s1", ids[1]).read_bytes())
    else:
        with sqlite3.connect(tmp_path / "sessions.db") as db:
            body, digest = db.execute(
                "SELECT body, hash FROM perdure_checkpoints WHERE checkpoint_id = ?", (ids[1],)
            ).fetchone()
            db.execute(
                "UPDATE perdure_checkpoints SET body = ?, hash = ? WHERE checkpoint_id = ?",
                (body, digest, ids[0]),
            )
    report = await verify_store(make_store(kind, tmp_path))
    assert [d.checkpoint_id for d in report.damage] == [ids[0]]


@pytest.mark.parametrize("kind", PERSISTENT)
async def test_rotate_keys_moves_every_store_kind_to_the_new_key(kind: str, tmp_path: Path) -> None:
    from perdure.rotation import rotate_keys

    store = make_store(kind, tmp_path, cipher=cipher("k1"))
    messages = await _fill(store)
    checkpoints: Any = store.checkpoints  # type: ignore[attr-defined]
    meta = CheckpointMeta(new_ulid(), "s1", "manual", None, 5, "2026-01-01T00:00:00Z")
    await checkpoints.put(CheckpointRecord(meta, _messages(), {"k": STATE_SECRET}))
    report = await rotate_keys(lambda c: make_store(kind, tmp_path, cipher=c), cipher("k2"))
    assert report.to_dict() | {"to": "k2"} == {
        "to": "k2",
        "sessions_checked": 1,
        "sessions_rotated": 1,
        "checkpoints_checked": 1,
        "checkpoints_rotated": 1,
        "keys_seen": ["k1"],
    }
    only_k2 = make_store(kind, tmp_path, cipher=AESGCMCipher(keys={"k2": K2}, active="k2"))
    record = await only_k2.get("s1")
    assert record.messages == messages
    assert record.agent_state == {"k": STATE_SECRET}
    got = await only_k2.checkpoints.get("s1", meta.checkpoint_id)  # type: ignore[attr-defined]
    assert got.agent_state == {"k": STATE_SECRET}
    again = await rotate_keys(lambda c: make_store(kind, tmp_path, cipher=c), cipher("k2"))
    assert (again.sessions_rotated, again.checkpoints_rotated) == (0, 0)
