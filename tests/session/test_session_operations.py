"""Session operations (SPEC §7, seed 002): checkpoint, restore, compact, fork,
export/import — on every store that keeps checkpoints."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from session_stores import make_store

from helpers import assert_model_valid, tool_call
from perdure import Agent, SummarizingConversationManager, tool
from perdure.errors import (
    CheckpointImportError,
    CheckpointNotFoundError,
    ModelError,
    SessionMismatchError,
    StoreNotWiredError,
    TurnRunningError,
)
from perdure.hooks import (
    BeforeCompactEvent,
    HookEvent,
    SessionCheckpointedEvent,
    SessionCompactedEvent,
    SessionRestoredEvent,
)
from perdure.models import ScriptedModel
from perdure.session import (
    CheckpointMeta,
    CheckpointRecord,
    FileCheckpointStore,
    FileSessionStore,
    Session,
    SessionStore,
)
from perdure.session.ulid import new_ulid
from perdure.types.json import compact_json_bytes


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    return key.upper()


class Events:
    """Records the session events an agent emits, in order."""

    def __init__(self) -> None:
        self.seen: list[HookEvent] = []

    def register_hooks(self, registry: Any) -> None:
        for kind in (SessionCheckpointedEvent, SessionCompactedEvent, SessionRestoredEvent):
            registry.add_callback(kind, self.seen.append)

    def names(self) -> list[str]:
        out = []
        for e in self.seen:
            name = type(e).__name__.removeprefix("Session").removesuffix("Event")
            trigger = getattr(e, "trigger", None)
            out.append(f"{name}:{trigger}" if name == "Checkpointed" else name)
        return out


def chatty(session: Session, script: list[Any], **kwargs: Any) -> Agent:
    return Agent(model=ScriptedModel(script), tools=[lookup], session_manager=session, **kwargs)


def conversation(
    store: SessionStore, sid: str = "s", turns: int = 3
) -> tuple[Session, Agent, Events]:
    events = Events()
    session = Session(store, sid)
    agent = chatty(
        session, [f"answer {i}" for i in range(turns)] + ["summary text", "more"], hooks=[events]
    )
    for i in range(turns):
        agent(f"question {i}")
    return session, agent, events


def texts(messages: list[Any]) -> list[str]:
    return [b.get("text", "?") for m in messages for b in m["content"]]


# ----------------------------------------------------------------------------- checkpoint


def test_checkpoint_list_and_monotonic_ids(store: SessionStore) -> None:
    session, _agent, events = conversation(store)
    metas = [run(session.checkpoint(f"mark {i}")) for i in range(5)]
    assert all(isinstance(m, CheckpointMeta) for m in metas)
    first = metas[0]
    assert (first.session_id, first.trigger, first.label, first.message_count) == (
        "s",
        "manual",
        "mark 0",
        6,
    )
    ids = [m.checkpoint_id for m in metas]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    assert [m.checkpoint_id for m in run(session.list_checkpoints())] == ids  # oldest first
    assert events.names() == ["Checkpointed:manual"] * 5


def test_checkpoint_captures_state_changed_between_turns(store: SessionStore) -> None:
    session, agent, _ = conversation(store)
    agent.state.set("budget", 50)
    meta = run(session.checkpoint())
    record = run(session.checkpoints.get("s", meta.checkpoint_id))  # type: ignore[union-attr]
    assert record.agent_state["state"] == {"budget": 50}


def test_operations_are_refused_while_a_turn_runs(store: SessionStore) -> None:
    session = Session(store, "s")
    seen: dict[str, Any] = {}
    mark: list[CheckpointMeta] = []

    @tool
    async def meddle() -> str:
        """Try every operation mid-turn."""
        for name, call in [
            ("checkpoint", lambda: session.checkpoint()),
            ("delete", lambda: session.delete_checkpoint(mark[0].checkpoint_id)),
        ]:
            try:
                await call()
            except TurnRunningError as exc:
                seen[name] = exc.code
        seen["compact"] = await session.compact()
        seen["restore"] = await session.restore(mark[0].checkpoint_id)
        return "done"

    agent = Agent(
        model=ScriptedModel(["first", tool_call("t", "meddle"), "end"]),
        tools=[meddle],
        session_manager=session,
    )
    agent("one")
    mark.append(run(session.checkpoint()))
    before = run(store.get("s")).tail
    agent("two")
    assert seen["checkpoint"] == "turn_running"
    assert seen["delete"] == "turn_running"
    assert (seen["compact"].status, seen["compact"].reason) == ("rejected", "turn_running")
    assert (seen["restore"].status, seen["restore"].reason) == ("rejected", "turn_running")
    assert len(run(session.list_checkpoints())) == 1  # no side effect, no queue
    assert run(store.get("s")).tail != before  # only the turn itself wrote


def test_delete_checkpoint_is_idempotent_and_checks_ids(store: SessionStore) -> None:
    session, _, _ = conversation(store)
    meta = run(session.checkpoint())
    run(session.delete_checkpoint(meta.checkpoint_id))
    run(session.delete_checkpoint(meta.checkpoint_id))
    assert run(session.list_checkpoints()) == []
    with pytest.raises(ValueError, match="ULID"):
        run(session.delete_checkpoint("not-a-ulid"))


def test_retention_evicts_the_oldest_whatever_the_trigger(tmp_path: Path, store_kind: str) -> None:
    store = make_store(store_kind, tmp_path, max_checkpoints=2)
    session, _agent, _ = conversation(store)
    first = run(session.checkpoint("a"))
    run(session.restore(first.checkpoint_id))  # writes a pre_restore checkpoint
    third = run(session.checkpoint("c"))
    kept = run(session.list_checkpoints())
    assert [m.trigger for m in kept] == ["pre_restore", "manual"]
    assert kept[-1].checkpoint_id == third.checkpoint_id


# ----------------------------------------------------------------------------- restore


def test_restore_replaces_history_after_a_pre_restore_checkpoint(store: SessionStore) -> None:
    session, agent, events = conversation(store)
    mark = run(session.checkpoint("before more"))
    agent("question 3")
    agent.state.set("late", True)
    result = run(session.restore(mark.checkpoint_id))
    assert result.status == "restored"
    assert (result.from_messages, result.to_messages) == (8, 6)
    assert result.pre_restore_checkpoint_id is not None
    assert len(agent.messages) == 6
    assert agent.state.get("late") is None
    assert run(store.get("s")).messages == agent.messages
    assert events.names() == ["Checkpointed:manual", "Checkpointed:pre_restore", "Restored"]
    # the pre_restore checkpoint holds what was there, so the restore can be undone
    undo = run(session.restore(result.pre_restore_checkpoint_id))
    assert undo.to_messages == 8
    # a restored session resumes model-valid
    assert str(agent("after undo")) == "more"
    assert_model_valid(agent.messages)
    resumed = chatty(Session.resume(store, "s"), [])
    assert resumed.messages == agent.messages


def test_restoring_the_same_checkpoint_twice_rotates_twice(store: SessionStore) -> None:
    session, _, _ = conversation(store)
    mark = run(session.checkpoint())
    run(session.restore(mark.checkpoint_id))
    tail = run(store.get("s")).tail
    run(session.restore(mark.checkpoint_id, checkpoint=False))
    assert run(store.get("s")).tail != tail
    assert [m.trigger for m in run(session.list_checkpoints())] == ["manual", "pre_restore"]


def test_restore_errors(store: SessionStore) -> None:
    session, _, _ = conversation(store)
    with pytest.raises(ValueError, match="ULID"):
        run(session.restore("nope"))
    with pytest.raises(CheckpointNotFoundError) as info:
        run(session.restore(new_ulid()))
    assert info.value.code == "checkpoint_not_found"
    with pytest.raises(CheckpointNotFoundError):
        run(session.fork(new_ulid()))
    with pytest.raises(CheckpointNotFoundError):
        run(session.export_checkpoint(new_ulid()))
    unwired = Session(store, "s", checkpoints=False)
    assert run(unwired.restore(new_ulid())).reason == "store_not_wired"
    with pytest.raises(StoreNotWiredError) as wired:
        run(unwired.fork(new_ulid()))
    assert wired.value.code == "store_not_wired"


class ByIdCheckpoints:
    """Any CheckpointStore object: this one keys checkpoints by id alone."""

    def __init__(self) -> None:
        self.data: dict[str, CheckpointRecord] = {}

    async def put(self, record: CheckpointRecord) -> None:
        self.data[record.meta.checkpoint_id] = record

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        if checkpoint_id not in self.data:
            raise CheckpointNotFoundError(checkpoint_id)
        return self.data[checkpoint_id]

    async def list(self, session_id: str) -> list[CheckpointMeta]:
        return [r.meta for k, r in sorted(self.data.items()) if r.meta.session_id == session_id]

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        self.data.pop(checkpoint_id, None)


def test_checkpoints_of_another_session_are_a_mismatch(store: SessionStore) -> None:
    shared = ByIdCheckpoints()
    a = Session(store, "a", checkpoints=shared)
    chatty(a, ["x"])("hello")
    b = Session(store, "b", checkpoints=shared)
    chatty(b, ["y"])("hi")
    mark = run(b.checkpoint())
    with pytest.raises(SessionMismatchError) as info:
        run(a.restore(mark.checkpoint_id))
    assert info.value.code == "session_mismatch"
    assert texts(run(store.get("a")).messages) == ["hello", "x"]


def test_independent_checkpoint_directory_outlives_the_session(
    tmp_path: Path, store: SessionStore
) -> None:
    session = Session(store, "s", checkpoints=tmp_path / "ckpts")
    chatty(session, ["x"])("hello")
    meta = run(session.checkpoint())
    run(store.delete("s"))
    assert [m.checkpoint_id for m in run(FileCheckpointStore(tmp_path / "ckpts").list("s"))] == [
        meta.checkpoint_id
    ]


def test_checkpoints_beside_a_file_session_are_deleted_with_it(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    session, _, _ = conversation(store)
    meta = run(session.checkpoint())
    path = store.session_dir("s") / "checkpoints" / f"{meta.checkpoint_id}.json"
    assert json.loads(path.read_bytes())["record"]["meta"]["checkpoint_id"] == meta.checkpoint_id
    run(store.delete("s"))
    assert not path.exists()


# ----------------------------------------------------------------------------- compact


def test_compact_folds_the_prefix_after_a_pre_compaction_checkpoint(store: SessionStore) -> None:
    session, agent, events = conversation(store)
    result = run(session.compact(instructions="keep the launch code"))
    assert result.status == "compacted"
    assert result.removed_range == (0, 4)
    assert result.compaction_id
    assert result.checkpoint_id
    assert texts(agent.messages) == [
        "Summary of the earlier conversation:\nsummary text",
        "question 2",
        "answer 2",
    ]
    request = agent.model.requests[-1]  # type: ignore[attr-defined]
    sent = request["messages"][0]["content"][0]["text"]
    assert "keep the launch code" in sent
    assert "question 0" in sent
    assert "question 2" not in sent
    assert events.names() == ["Checkpointed:pre_compaction", "Compacted"]
    # compacted messages never come back after reopen
    assert texts(run(store.get("s")).messages) == texts(agent.messages)
    assert texts(chatty(Session.resume(store, "s"), []).messages) == texts(agent.messages)
    # and the checkpoint written first holds everything
    record = run(session.checkpoints.get("s", result.checkpoint_id))  # type: ignore[union-attr]
    assert len(record.messages) == 6
    assert str(agent("go on")) == "more"


def test_compact_never_splits_a_tool_pair(store: SessionStore) -> None:
    session = Session(store, "s")
    agent = chatty(session, [tool_call("t1", "lookup", key="a"), "A", "summary", "B"])
    agent("first")
    agent([{"text": "second"}])
    result = run(session.compact())
    assert result.removed_range == (0, 4)
    assert_model_valid(agent.messages)
    # the tool round of the first turn went into the summary as a whole
    assert texts(agent.messages) == [
        "Summary of the earlier conversation:\nB",
        "second",
        "summary",
    ]
    assert "[called tool lookup" in agent.model.requests[-1]["messages"][0]["content"][0]["text"]  # type: ignore[attr-defined]


def test_compact_rejections_and_failures(store: SessionStore) -> None:
    empty = Session(store, "empty")
    chatty(empty, [])
    assert (run(empty.compact()).status, run(empty.compact()).reason) == (
        "rejected",
        "empty_history",
    )
    assert run(Session(store, "no-agent").compact()).reason == "not_configured"

    one = Session(store, "one")
    chatty(one, ["only answer"])("only question")
    nothing = run(one.compact())
    assert (nothing.status, nothing.reason) == ("failed", "nothing_to_compact")
    assert nothing.checkpoint_id is not None  # a failed compaction keeps its checkpoint

    for script, reason in [("", "summary_malformed"), (ModelError("down"), "model_error")]:
        sid = f"fail-{reason}"
        session = Session(store, sid)
        agent = chatty(session, ["a0", "a1", script])
        agent("q0")
        agent("q1")
        before = run(store.get(sid)).messages
        result = run(session.compact())
        assert (result.status, result.reason) == ("failed", reason)
        assert result.checkpoint_id is not None
        assert run(store.get(sid)).messages == before  # history untouched
        assert [m.trigger for m in run(session.list_checkpoints())] == ["pre_compaction"]


def test_a_hook_can_block_compaction(store: SessionStore) -> None:
    session, agent, _events = conversation(store)

    def block(event: BeforeCompactEvent) -> None:
        event.cancel = "not now"

    agent.hooks.add_callback(BeforeCompactEvent, block)
    result = run(session.compact())
    assert (result.status, result.reason) == ("rejected", "hook_blocked")
    assert run(session.list_checkpoints()) == []  # nothing written
    assert len(agent.messages) == 6


def test_compact_without_a_checkpoint(store: SessionStore) -> None:
    session, _, events = conversation(store)
    result = run(session.compact(checkpoint=False))
    assert result.status == "compacted"
    assert result.checkpoint_id is None
    assert events.names() == ["Compacted"]


def test_summarizing_manager_compacts_during_a_turn(store: SessionStore) -> None:
    events = Events()
    summarizer = ScriptedModel(["the user asked four questions"])
    manager = SummarizingConversationManager(
        context_threshold_tokens=60,
        preserve_recent_messages=2,
        summary_ratio=0.5,
        summarization_model=summarizer,
        summarization_prompt="Be terse.",
    )
    session = Session(store, "auto")
    agent = Agent(
        model=ScriptedModel([f"answer {i} " + "x" * 40 for i in range(6)]),
        conversation_manager=manager,
        session_manager=session,
        hooks=[events],
    )
    for i in range(4):
        agent(f"question {i}")
    assert "Checkpointed:pre_compaction" in events.names()
    assert "Compacted" in events.names()
    assert summarizer.requests[0]["system_prompt"] == "Be terse."
    assert agent.messages[0]["content"][0]["text"].endswith("the user asked four questions")
    assert texts(run(store.get("auto")).messages) == texts(agent.messages)
    assert_model_valid(agent.messages)


def test_summarizing_manager_without_a_session_works_in_memory() -> None:
    manager = SummarizingConversationManager(
        context_threshold_tokens=40,
        preserve_recent_messages=2,
        summarization_model=ScriptedModel(["s"] * 5),
    )
    agent = Agent(
        model=ScriptedModel([f"a{i} " + "y" * 40 for i in range(5)]), conversation_manager=manager
    )
    for i in range(3):
        agent(f"q{i}")
    assert agent.messages[0]["content"][0]["text"].startswith("Summary of the earlier conversation")
    assert_model_valid(agent.messages)
    with pytest.raises(ValueError, match="summary_ratio"):
        SummarizingConversationManager(summary_ratio=0)


# ----------------------------------------------------------------------------- fork, export


def test_fork_starts_a_new_session_and_leaves_the_source_alone(store: SessionStore) -> None:
    session, agent, _ = conversation(store)
    mark = run(session.checkpoint())
    agent("question 3")
    new_id = run(session.fork(mark.checkpoint_id))
    assert new_id != "s"
    assert len(run(store.get(new_id)).messages) == 6
    assert len(run(store.get("s")).messages) == 8
    forked = chatty(Session.resume(store, new_id), ["forked answer"])
    assert str(forked("branch")) == "forked answer"


def test_export_import_round_trips_across_two_stores(tmp_path: Path, store: SessionStore) -> None:
    image = bytes(range(256)) * 30
    session = Session(store, "src")
    agent = chatty(session, ["nice", "bye"])
    agent([{"text": "look"}, {"image": {"format": "png", "source": {"bytes": image}}}])
    agent.state.set("k", "v")
    meta = run(session.checkpoint("to move"))
    data = run(session.export_checkpoint(meta.checkpoint_id))
    doc = json.loads(data)
    assert doc["format"] == "perdure-checkpoint/1"
    assert list(doc["attachments"]) == [__import__("hashlib").sha256(image).hexdigest()]
    other_store = make_store("file", tmp_path / "other")
    target = Session(other_store, "dst")
    chatty(target, [])
    imported = run(target.import_checkpoint(data))
    assert (imported.trigger, imported.session_id, imported.label) == ("import", "dst", "to move")
    record = run(target.checkpoints.get("dst", imported.checkpoint_id))  # type: ignore[union-attr]
    assert record.messages == run(store.get("src")).messages  # byte-identical history
    result = run(target.restore(imported.checkpoint_id))
    assert result.status == "restored"
    restored = run(other_store.get("dst"))
    assert restored.messages[0]["content"][1]["image"]["source"]["bytes"] == image
    assert restored.agent_state["state"] == {"k": "v"}


def exported(tmp_path: Path) -> tuple[Session, bytes]:
    store = make_store("memory", tmp_path)
    session = Session(store, "s")
    agent = chatty(session, ["ok"])
    agent([{"text": "hi"}, {"image": {"format": "png", "source": {"bytes": b"\x89PNG" * 10}}}])
    meta = run(session.checkpoint("x"))
    return session, run(session.export_checkpoint(meta.checkpoint_id))


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.floats(0, 1, exclude_max=True), flip=st.integers(1, 255))
def test_a_tampered_byte_anywhere_is_rejected_and_writes_nothing(
    tmp_path: Path, position: float, flip: int
) -> None:
    session, data = exported(tmp_path)
    tampered = bytearray(data)
    tampered[int(position * len(data))] ^= flip
    before = run(session.list_checkpoints())
    with pytest.raises(CheckpointImportError) as info:
        run(session.import_checkpoint(bytes(tampered)))
    assert info.value.code == "checkpoint_import_invalid"
    assert run(session.list_checkpoints()) == before


@pytest.mark.parametrize(
    "bad",
    [b"", b"not json", b"[]", b'{"format": "perdure-checkpoint/2"}', "text".encode("utf-16"), 42],
)
def test_malformed_imports_are_rejected(tmp_path: Path, bad: Any) -> None:
    session, _ = exported(tmp_path)
    with pytest.raises(CheckpointImportError):
        run(session.import_checkpoint(bad))


def test_lone_surrogates_survive_turns_checkpoints_and_export(
    tmp_path: Path, store: SessionStore
) -> None:
    # Text decoded with surrogateescape (a file name) or half a UTF-16 pair: UTF-8
    # cannot carry it, and no store, checkpoint or export may fail the turn over it.
    odd = "name \udc80\udcff and \ud800"
    session = Session(store, "src")
    agent = chatty(session, [f"answer {odd}"])
    agent(f"question {odd}")
    agent.state.set("path", odd)
    run(session.save())
    meta = run(session.checkpoint("odd"))
    record = run(session.checkpoints.get("src", meta.checkpoint_id))  # type: ignore[union-attr]
    assert record.messages == run(store.get("src")).messages
    data = run(session.export_checkpoint(meta.checkpoint_id))
    other_store = make_store("file", tmp_path / "other")
    target = Session(other_store, "dst")
    chatty(target, [])
    imported = run(target.import_checkpoint(data))
    assert run(target.restore(imported.checkpoint_id)).status == "restored"
    assert run(other_store.get("dst")).messages == run(store.get("src")).messages
    stored = run(store.get("src"))
    assert stored.messages[0]["content"][0]["text"] == f"question {odd}"  # type: ignore[typeddict-item]
    assert stored.messages[-1]["content"][0]["text"] == f"answer {odd}"  # type: ignore[typeddict-item]
    assert stored.agent_state["state"]["path"] == odd


SHAPED_INPUT = {
    "ref": {"__attachment__": "ab" * 32, "size": 3},
    "bytes_like": {"__bytes_encoded__": True, "data": "aGk="},
    "escape_like": {"__perdure_dict__": [["a", 1]]},
}


def test_marker_shaped_content_survives_checkpoints_export_import_and_restore(
    tmp_path: Path, store: SessionStore
) -> None:
    session = Session(store, "src")
    agent = chatty(session, [tool_call("t1", "lookup", key="a", extra=SHAPED_INPUT), "done"])
    agent("go")
    agent.state.set("shaped", SHAPED_INPUT)
    run(session.save())
    stored = run(store.get("src"))
    assert stored.messages == agent.messages
    assert stored.messages[1]["content"][0]["toolUse"]["input"]["extra"] == SHAPED_INPUT  # type: ignore[typeddict-item]
    assert stored.agent_state["state"]["shaped"] == SHAPED_INPUT
    meta = run(session.checkpoint("shaped"))
    record = run(session.checkpoints.get("src", meta.checkpoint_id))  # type: ignore[union-attr]
    assert record.messages == agent.messages
    assert CheckpointRecord.from_json_bytes(record.to_json_bytes()).messages == agent.messages
    data = run(session.export_checkpoint(meta.checkpoint_id))
    other_store = make_store("file", tmp_path / "other")
    target = Session(other_store, "dst")
    chatty(target, [])
    imported = run(target.import_checkpoint(data))
    assert run(target.restore(imported.checkpoint_id)).status == "restored"
    restored = run(other_store.get("dst"))
    assert restored.messages == agent.messages
    assert restored.agent_state["state"]["shaped"] == SHAPED_INPUT


def export_with(tmp_path: Path, messages: Any) -> bytes:
    """A correctly signed export holding ``messages`` (as an attacker could write one)."""
    _, data = exported(tmp_path)
    doc = json.loads(data)
    doc["messages"] = messages
    doc["checkpoint"]["message_count"] = len(messages)
    del doc["sha256"]
    doc["sha256"] = hashlib.sha256(compact_json_bytes(doc, sort_keys=True)).hexdigest()
    return compact_json_bytes(doc, sort_keys=True)


@pytest.mark.parametrize("depth", [201, 500])
def test_an_import_nested_too_deep_is_refused(tmp_path: Path, depth: int) -> None:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    data = export_with(tmp_path, [{"role": "user", "content": [{"json": value}]}])
    session, _ = exported(tmp_path / "target")
    before = run(session.list_checkpoints())
    with pytest.raises(CheckpointImportError) as info:
        run(session.import_checkpoint(data))
    assert info.value.code == "checkpoint_import_invalid"
    assert run(session.list_checkpoints()) == before


def test_an_import_nested_beyond_the_parser_is_refused(tmp_path: Path) -> None:
    session, data = exported(tmp_path)
    deep = data.replace(b'"messages":[', b'"messages":[' + b"[" * 5000 + b"]" * 5000 + b",", 1)
    with pytest.raises(CheckpointImportError):
        run(session.import_checkpoint(deep))
