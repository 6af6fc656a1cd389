"""Persistence filters (SPEC §9): nothing a filter removed is in any byte perdure wrote.

A conversation with an email, a phone number, a Luhn-valid card and an IBAN runs
through a filtered ``Session`` on real file and SQLite stores — tool calls, state set
between turns, a checkpoint, an export, a compaction, memory extraction — and then
every file under the test's directory is read byte for byte (and every row of every
SQLite table selected) looking for those values, in clear and in base64.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, SnapshotSessionManager
from perdure.errors import FilterFailedError
from perdure.hygiene import FilterChain, PersistedItem, PIIRedactor
from perdure.memory import ExtractionConfig, LocalMemoryStore, MemoryManager
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.storage import LocalFileStorage, SQLiteStorage
from perdure.stores.sqlite import SQLiteSessionStore
from pii import (
    CARD,
    EMAIL,
    IBAN,
    PHONE,
    SECRETS,
    assert_found,
    assert_nothing_leaked,
    files_under,
    find_account,
    pii_script,
    run,
    sqlite_rows,
)

STORES = ["file", "sqlite"]


def _store(kind: str, root: Path) -> SessionStore:
    if kind == "file":
        return FileSessionStore(root / "sessions")
    return SQLiteSessionStore(root / "sessions.db")


@pytest.mark.parametrize("kind", STORES)
def test_a_filtered_session_writes_no_pii_anywhere(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    redactor = PIIRedactor()
    store = _store(kind, root)
    memory = LocalMemoryStore(root / "memory.sqlite", namespace="alice")
    extractor = ScriptedModel([f"- The user's email is {EMAIL}.\n- Their IBAN is {IBAN}."])
    manager = MemoryManager(
        [memory],
        injection=False,
        extraction=ExtractionConfig(extractor=extractor),
        filters=[redactor],
    )
    session = Session(store, "s1", filters=[redactor])
    agent = Agent(
        model=ScriptedModel(pii_script()),
        tools=[find_account],
        session_manager=session,
        memory_manager=manager,
    )
    agent(f"Hi, I am {EMAIL}, phone {PHONE}. Which account does card {CARD} pay into?")
    # The live agent keeps the originals for this turn.
    assert EMAIL in json.dumps(agent.messages)
    assert CARD in json.dumps(agent.messages)
    agent.state.set("contact", {"email": EMAIL, "phones": [PHONE]})
    run(session.save())
    run(manager.add(f"The user's card is {CARD}."))

    mark = run(session.checkpoint("after the lookup"))
    exported = run(session.export_checkpoint(mark.checkpoint_id))
    (root / "export.json").write_bytes(exported)
    agent("Thanks!")
    result = run(session.compact())
    assert result.status == "compacted"
    imported = run(session.import_checkpoint(exported))
    assert imported.trigger == "import"
    store.close()
    memory.close()
    manager.close()

    # What the model was sent came from the live agent: the originals.
    assert CARD in json.dumps(agent.model.requests[0]["messages"])  # type: ignore[attr-defined]
    # And what the extractor was sent came from the (filtered) outbox.
    assert EMAIL not in json.dumps(extractor.requests)
    assert "[email]" in json.dumps(extractor.requests)

    files = assert_nothing_leaked(root)
    assert files >= 3

    # After a resume the agent sees the filtered version.
    store = _store(kind, root)
    resumed = Agent(
        model=ScriptedModel([]), session_manager=Session.resume(store, "s1", filters=[redactor])
    )
    text = json.dumps(resumed.messages)
    assert "[email]" in text
    assert "[phone]" in text
    assert "[card]" in text
    assert all(secret not in text for secret in SECRETS)
    assert resumed.state.get("contact") == {"email": "[email]", "phones": ["[phone]"]}
    store.close()


@pytest.mark.parametrize("kind", STORES)
def test_the_leak_check_finds_what_an_unfiltered_session_writes(kind: str, tmp_path: Path) -> None:
    """Without filters the same run leaves every value on disk: the check is no tautology."""
    root = tmp_path / "data"
    store = _store(kind, root)
    session = Session(store, "s1")
    agent = Agent(model=ScriptedModel(pii_script()), tools=[find_account], session_manager=session)
    agent(f"Hi, I am {EMAIL}, phone {PHONE}. Which account does card {CARD} pay into?")
    mark = run(session.checkpoint())
    exported = run(session.export_checkpoint(mark.checkpoint_id))
    store.close()
    everything = b"".join(path.read_bytes() for path in files_under(root))
    if kind == "sqlite":
        everything += sqlite_rows(root / "sessions.db")
    for secret in SECRETS:
        assert_found(everything, secret)
        assert_found(exported, secret)
    with pytest.raises(AssertionError):
        assert_nothing_leaked(root)


def test_base64_forms_are_looked_for() -> None:
    blob = base64.b64encode(b"xx" + EMAIL.encode() + b"yyy")
    assert_found(blob, EMAIL)


@pytest.mark.parametrize("storage_kind", ["file", "sqlite"])
def test_a_filtered_snapshot_manager_writes_no_pii(storage_kind: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    storage = (
        LocalFileStorage(root / "blobs")
        if storage_kind == "file"
        else SQLiteStorage(root / "blobs.db")
    )
    redactor = PIIRedactor()
    manager = SnapshotSessionManager(
        "snap", storage=storage, save_latest_on="message", filters=[redactor]
    )
    agent = Agent(
        agent_id="a1",
        model=ScriptedModel(pii_script()),
        tools=[find_account],
        session_manager=manager,
    )
    agent(f"Hi, I am {EMAIL}, phone {PHONE}. Which account does card {CARD} pay into?")
    agent.state.set("contact", EMAIL)
    run(manager.save_snapshot(agent, is_latest=False))
    run(manager.save_snapshot(agent, is_latest=True))
    assert EMAIL in json.dumps(agent.messages)  # the live agent keeps the originals
    if storage_kind == "sqlite":
        storage.close()  # type: ignore[attr-defined]
    assert_nothing_leaked(root)

    storage = (
        LocalFileStorage(root / "blobs")
        if storage_kind == "file"
        else SQLiteStorage(root / "blobs.db")
    )
    again = SnapshotSessionManager("snap", storage=storage, filters=[redactor])
    resumed = Agent(agent_id="a1", model=ScriptedModel(["ok"]), session_manager=again)
    text = json.dumps(resumed.messages)
    assert "[email]" in text
    assert "[card]" in text
    assert "[iban]" in text
    assert all(secret not in text for secret in SECRETS)
    assert resumed.state.get("contact") == "[email]"
    # The restored (already filtered) history is saved again without a rewrite.
    resumed(f"one more thing: {PHONE}")
    assert resumed.messages[-2]["content"][0]["text"] == f"one more thing: {PHONE}"
    if storage_kind == "sqlite":
        storage.close()  # type: ignore[attr-defined]
    assert_nothing_leaked(root)


@pytest.mark.parametrize("kind", STORES)
def test_checkpoints_and_exports_of_a_session_stored_before_filters_are_filtered(
    kind: str, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    store = _store(kind, root)
    agent = Agent(
        model=ScriptedModel(pii_script()),
        tools=[find_account],
        session_manager=Session(store, "s1"),
    )
    agent(f"Hi, I am {EMAIL}, phone {PHONE}. Which account does card {CARD} pay into?")
    old = run(Session(store, "s1").checkpoint())  # unfiltered, as it was
    session = Session.resume(store, "s1", filters=[PIIRedactor()])
    Agent(model=ScriptedModel([]), session_manager=session)
    exported = run(session.export_checkpoint(old.checkpoint_id))
    assert all(secret not in exported.decode() for secret in SECRETS)
    raw_export = run(Session(store, "s1").export_checkpoint(old.checkpoint_id))
    assert CARD in raw_export.decode()
    imported = run(session.import_checkpoint(raw_export))
    record = run(session.checkpoints.get("s1", imported.checkpoint_id))  # type: ignore[union-attr]
    assert all(secret not in json.dumps(record.messages) for secret in SECRETS)
    new = run(session.checkpoint())
    record = run(session.checkpoints.get("s1", new.checkpoint_id))  # type: ignore[union-attr]
    assert all(secret not in json.dumps(record.messages) for secret in SECRETS)
    run(session.restore(new.checkpoint_id, checkpoint=False))
    stored = run(store.get("s1"))
    assert all(secret not in json.dumps(stored.messages) for secret in SECRETS)
    store.close()


# ------------------------------------------------------------------ composition, failure


def test_filters_compose_in_order_and_see_kind_and_target(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    def first(item: PersistedItem) -> Any:
        seen.append((item.kind, item.write))
        if item.kind == "message":
            return {**item.value, "content": [{"text": "one"}]}
        return item.value

    def second(item: PersistedItem) -> Any:
        if item.kind == "message":
            assert item.value["content"] == [{"text": "one"}]  # what `first` returned
            return {**item.value, "content": [{"text": item.value["content"][0]["text"] + "+two"}]}
        return item.value

    store = FileSessionStore(tmp_path / "s")
    session = Session(store, "s", filters=[first, second])
    agent = Agent(model=ScriptedModel(["hello"]), session_manager=session)
    agent("hi")
    agent.state.set("k", "v")
    run(session.save())
    assert [m["content"] for m in agent.messages] == [[{"text": "hi"}], [{"text": "hello"}]]
    stored = run(store.get("s"))
    assert [m["content"] for m in stored.messages] == [[{"text": "one+two"}]] * 2
    assert ("message", "session") in seen
    assert ("agent_state", "session") in seen
    mark = run(session.checkpoint())
    assert ("message", "checkpoint") in seen
    run(session.export_checkpoint(mark.checkpoint_id))
    assert ("message", "export") in seen


@pytest.mark.parametrize("kind", STORES)
def test_a_failing_filter_fails_the_write_and_writes_nothing(kind: str, tmp_path: Path) -> None:
    armed = {"on": False}

    def fragile(item: PersistedItem) -> Any:
        if armed["on"] and item.kind == "message":
            raise RuntimeError(f"cannot handle {item.value}")
        return item.value

    store = _store(kind, tmp_path)
    session = Session(store, "s", filters=[fragile])
    agent = Agent(model=ScriptedModel(["first", "second"]), session_manager=session)
    agent("one")
    before = run(store.get("s"))
    armed["on"] = True
    with pytest.raises(FilterFailedError) as caught:
        agent(f"two {EMAIL}")
    assert caught.value.code == "filter_failed"
    assert EMAIL not in str(caught.value)  # the error never carries the value
    assert isinstance(caught.value.__cause__, RuntimeError)
    after = run(store.get("s"))
    assert after.messages == before.messages
    assert after.tail == before.tail
    store.close()


def test_a_filter_returning_the_wrong_type_fails_the_write(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "s")
    session = Session(store, "s", filters=[lambda item: "not a message"])
    agent = Agent(model=ScriptedModel(["hello"]), session_manager=session)
    with pytest.raises(FilterFailedError, match="returned a str"):
        agent("hi")
    assert run(store.get("s")).messages == []


def test_memory_add_is_filtered_or_fails_whole(tmp_path: Path) -> None:
    memory = LocalMemoryStore(tmp_path / "m.sqlite", namespace="n")
    manager = MemoryManager([memory], injection=False, filters=[PIIRedactor()])
    run(manager.add(f"email {EMAIL}"))
    assert [e.content for e in run(memory.list())] == ["email [email]"]

    def boom(item: PersistedItem) -> Any:
        raise ValueError("no")

    failing = MemoryManager([memory], injection=False, filters=[boom])
    with pytest.raises(FilterFailedError):
        run(failing.add("anything"))
    assert run(memory.count()) == 1
    memory.close()


def test_filters_argument_is_checked() -> None:
    with pytest.raises(TypeError, match="filters"):
        FilterChain(PIIRedactor())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"filters\[1\]"):
        FilterChain([PIIRedactor(), 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="filters"):
        Session(FileSessionStore("unused"), "s", filters="x")  # type: ignore[arg-type]


def test_a_redactor_never_mutates_what_it_filters() -> None:
    message = {"role": "user", "content": [{"text": EMAIL}]}
    before = copy.deepcopy(message)
    chain = FilterChain([PIIRedactor()])
    assert chain.message(message, "session")["content"] == [{"text": "[email]"}]
    assert message == before


@pytest.mark.parametrize("kind", STORES)
def test_a_commit_without_expected_tail_compares_filtered_with_filtered(
    kind: str, tmp_path: Path
) -> None:
    """A store checks that such a commit extends its history by comparing its last stored
    message — filtered — with the commit's message at that index: filtered too."""
    store = _store(kind, tmp_path)
    session = Session(store, "s", filters=[PIIRedactor()])
    agent = Agent(model=ScriptedModel([f"mail {EMAIL}", "again"]), session_manager=session)
    agent(f"I am {EMAIL}")
    session._tail = None  # as a writer that passes no expected tail: check_extends decides
    agent("more")
    stored = run(store.get("s")).messages
    assert [m["content"][0]["text"] for m in stored] == [
        "I am [email]",
        "mail [email]",
        "more",
        "again",
    ]
    store.close()
