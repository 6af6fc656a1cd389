"""Issue 20's end-to-end test (SPEC §9): for each persistent store kind, a conversation
holding an email, a phone number, a Luhn-valid card and an IBAN runs through an
encrypted ``Session`` — tool calls, state, a checkpoint, an export, a compaction, an
import and memory extraction into an encrypted memory store — and then every byte
the run wrote is read behind perdure's back: every file under the test's directory
(and every row of every SQLite table), every row of every table of the test's
PostgreSQL schema (``SELECT *``), every value of every key under the test's Redis
prefix (``SCAN``). None of the values may be there, neither in clear nor in base64.

Run twice: filtered (``PIIRedactor``) and encrypted — the issue's case, where not
even the filter's placeholders may be readable — and encrypted alone, which proves
the encryption by itself keeps the raw values out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import session_stores
from server_bytes import postgres_bytes, redis_bytes
from session_stores import make_store

from crypto_keys import cipher
from perdure import Agent
from perdure.hygiene import PIIRedactor
from perdure.memory import ExtractionConfig, LocalMemoryStore, MemoryManager, MemoryStore
from perdure.models import ScriptedModel
from perdure.session import Session
from pii import (
    CARD,
    EMAIL,
    FORBIDDEN,
    IBAN,
    PHONE,
    SECRETS,
    files_under,
    find_account,
    pii_script,
    run,
    sqlite_rows,
)

KINDS = ["file", "sqlite", "postgres", "redis"]
# Text that only a readable message body, state or memory would hold: the filter's
# placeholders and the tool's name.
CLEAR_MARKERS = [b"[email]", b"[card]", b"[iban]", b"[phone]", b"find_account", b"Thanks!"]


def _memory_store(kind: str, root: Path) -> MemoryStore:
    if kind == "postgres":
        from perdure.memory import PostgresMemoryStore
        from postgres_server import DSN

        (schema,) = session_stores.PG_SCHEMAS  # beside the sessions: SELECT * reads both
        return PostgresMemoryStore(DSN, namespace="alice", schema=schema, cipher=cipher())
    return LocalMemoryStore(
        root / "memory.sqlite", namespace="alice", cipher=cipher(), searchable=False
    )


def _written(kind: str, root: Path) -> bytes:
    """Every byte the run wrote: the files under ``root`` and the server's rows or keys."""
    out = []
    for path in files_under(root):
        data = path.read_bytes()
        out.append(data)
        if data.startswith(b"SQLite format 3"):
            out.append(sqlite_rows(path))
    if kind == "postgres":
        out.append(postgres_bytes())
    if kind == "redis":
        out.append(redis_bytes())
    return b"\n".join(out)


def _run(kind: str, root: Path, filters: list[Any]) -> tuple[list[bytes], MemoryStore]:
    """The conversation; what was stored after each step that rewrites something."""
    root.mkdir(parents=True)
    store = make_store(kind, root, cipher=cipher())
    memory = _memory_store(kind, root)
    extractor = ScriptedModel([f"- The user's email is {EMAIL}.\n- Their IBAN is {IBAN}."])
    manager = MemoryManager(
        [memory],
        injection=False,
        extraction=ExtractionConfig(extractor=extractor, outbox=root / "outbox.sqlite"),
        filters=filters,
    )
    session = Session(store, "s1", filters=filters)
    agent = Agent(
        model=ScriptedModel(pii_script()),
        tools=[find_account],
        session_manager=session,
        memory_manager=manager,
    )
    agent(f"Hi, I am {EMAIL}, phone {PHONE}. Which account does card {CARD} pay into?")
    agent.state.set("contact", {"email": EMAIL, "phones": [PHONE]})
    run(session.save())
    run(manager.add(f"The user's card is {CARD}."))
    mark = run(session.checkpoint("after the lookup"))
    exported = run(session.export_checkpoint(mark.checkpoint_id))
    agent("Thanks!")
    snapshots = [_written(kind, root)]  # before the compaction rewrites the history
    assert run(session.compact()).status == "compacted"
    run(session.import_checkpoint(exported))
    manager.close()
    snapshots.append(_written(kind, root))
    return snapshots, memory


@pytest.mark.parametrize("kind", KINDS)
def test_filtered_and_encrypted_nothing_readable_is_written(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    written, memory = _run(kind, root, [PIIRedactor()])
    for snapshot in written:
        for secret in SECRETS:
            for form in FORBIDDEN[secret]:
                assert form not in snapshot, f"{secret!r} ({form!r}) stored in {kind}"
        for marker in CLEAR_MARKERS:
            assert marker not in snapshot, f"{marker!r} readable in what {kind} stored"
        assert b"~pd1~" in snapshot
    # Everything reads back, filtered, with the key.
    resumed = Agent(
        model=ScriptedModel([]),
        session_manager=Session.resume(make_store(kind, root, cipher=cipher()), "s1"),
    )
    text = json.dumps(resumed.messages)
    assert "[email]" in text
    assert all(secret not in text for secret in SECRETS)
    remembered = json.dumps([entry.content for entry in run(memory.list())])
    assert "[email]" in remembered
    assert "[card]" in remembered
    memory.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
def test_encryption_alone_keeps_the_raw_values_out(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    written, memory = _run(kind, root, [])
    for snapshot in written:
        for secret in SECRETS:
            for form in FORBIDDEN[secret]:
                assert form not in snapshot, f"{secret!r} ({form!r}) stored in {kind}"
    resumed = Agent(
        model=ScriptedModel([]),
        session_manager=Session.resume(make_store(kind, root, cipher=cipher()), "s1"),
    )
    assert EMAIL in json.dumps(resumed.messages)  # unfiltered: the key gives it all back
    assert CARD in json.dumps([entry.content for entry in run(memory.list())])
    memory.close()  # type: ignore[attr-defined]
