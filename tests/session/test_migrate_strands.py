"""migrate_strands: sessions written by the Strands Agents SDK become perdure sessions.

The source directories are written here in Strands' own layouts (``FileSessionManager``
message logs and ``SnapshotSessionManager`` snapshots on a ``LocalFileStorage``), byte
for byte as Strands writes them: indented JSON, bytes as ``__bytes_encoded__`` markers.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import assert_model_valid
from perdure import Agent, SummarizingConversationManager
from perdure.agent.conversation.pairing import INTERRUPTED_TOOL_RESULT_TEXT
from perdure.migrate.strands import MigrationReport, SessionMigration, migrate_strands
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.session.rules import utc_now
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message

T0 = "2025-06-01T10:00:00.000000+00:00"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


# ------------------------------------------------------------- Strands layouts


def write_json(path: Path, data: Any) -> None:
    """As Strands' FileSessionManager._write_file: indented, UTF-8, not ASCII-escaped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def encode(value: Any) -> Any:
    """Strands' encode_bytes_values."""
    if isinstance(value, bytes):
        return {"__bytes_encoded__": True, "data": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encode(v) for v in value]
    return value


def user(text: str) -> Message:
    return {"role": "user", "content": [{"text": text}]}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": [{"text": text}]}


def use(tool_use_id: str, text: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"text": text},
            {"toolUse": {"toolUseId": tool_use_id, "name": "lookup", "input": {"q": text}}},
        ],
    }


def result(tool_use_id: str, text: str) -> Message:
    return {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": tool_use_id,
                    "status": "success",
                    "content": [{"text": text}],
                }
            }
        ],
    }


def file_session(
    root: Path,
    session_id: str,
    messages: list[Message],
    *,
    agent_id: str = "default",
    state: dict[str, Any] | None = None,
    removed: int = 0,
    manager: str = "SlidingWindowConversationManager",
    redactions: dict[int, Message] | None = None,
    interrupt_state: dict[str, Any] | None = None,
) -> Path:
    """A FileSessionManager session; returns the agent directory."""
    session_dir = root / f"session_{session_id}"
    write_json(
        session_dir / "session.json",
        {"session_id": session_id, "session_type": "AGENT", "created_at": T0, "updated_at": T0},
    )
    agent_dir = session_dir / "agents" / f"agent_{agent_id}"
    write_json(
        agent_dir / "agent.json",
        {
            "agent_id": agent_id,
            "state": state or {},
            "conversation_manager_state": {"__name__": manager, "removed_message_count": removed},
            "_internal_state": {
                "interrupt_state": interrupt_state
                or {"interrupts": {}, "context": {}, "activated": False}
            },
            "created_at": T0,
            "updated_at": T0,
        },
    )
    redactions = redactions or {}
    for index, message in enumerate(messages):
        redact = redactions.get(index)
        write_json(
            agent_dir / "messages" / f"message_{index}.json",
            {
                "message": encode(message),
                "message_id": index,
                "redact_message": None if redact is None else encode(redact),
                "created_at": T0,
                "updated_at": T0,
            },
        )
    return agent_dir


def snapshot_blob(messages: list[Message], **data: Any) -> dict[str, Any]:
    return {
        "scope": "agent",
        "schema_version": "1.0",
        "created_at": "2025-06-02T09:00:00.000Z",
        "data": encode(
            {
                "messages": messages,
                "state": data.get("state", {}),
                "conversation_manager_state": {
                    "__name__": "SlidingWindowConversationManager",
                    "removed_message_count": data.get("removed", 0),
                },
                "interrupt_state": {"interrupts": {}, "context": {}, "activated": False},
                "system_prompt": data.get("system_prompt"),
            }
        ),
        "app_data": {},
    }


def snapshot_session(
    root: Path,
    session_id: str,
    latest: dict[str, Any] | None,
    history: list[dict[str, Any]],
    agent_id: str = "default",
) -> Path:
    """A SnapshotSessionManager session on LocalFileStorage(root)."""
    base = root / "session" / session_id / "scopes" / "agent" / agent_id / "snapshots"
    if latest is not None:
        write_json(base / "snapshot_latest.json", latest)
    for index, blob in enumerate(history):
        snapshot_id = f"{1748854800000 + index:013d}_{index:032x}"
        write_json(base / "immutable_history" / f"snapshot_{snapshot_id}.json", blob)
    return base


def normal_messages(count: int = 16) -> list[Message]:
    """user / toolUse / toolResult / answer turns; every text names its index."""
    out: list[Message] = []
    turn = 0
    while len(out) < count:
        i = len(out)
        pattern = [
            user(f"m{i} question {turn}"),
            use(f"t{turn}", f"m{i + 1} looking up"),
            result(f"t{turn}", f"m{i + 2} found"),
            assistant(f"m{i + 3} answer {turn}"),
        ]
        out.extend(pattern[: count - len(out)])
        turn += 1
    return out


def texts(messages: list[Message]) -> list[str]:
    """Every text, tool results' included, in order."""
    out: list[str] = []
    for message in messages:
        for block in message["content"]:
            if "text" in block:
                out.append(block["text"])
            if "toolResult" in block:
                out.extend(b["text"] for b in block["toolResult"]["content"] if "text" in b)
    return out


@pytest.fixture
def strands_dir(tmp_path: Path) -> Path:
    root = tmp_path / "strands"
    file_session(root, "normal", normal_messages(16), state={"city": "Paris", "visits": 3})
    # Strands #859: the process died while the tool ran; the next prompt came anyway.
    file_session(
        root,
        "dangling",
        [user("m0 book it"), use("t0", "m1 booking"), user("m2 hello?"), assistant("m3 hi")],
    )
    orphan: Message = {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "ghost", "status": "success", "content": []}},
            {"text": "m2 and now?"},
        ],
    }
    file_session(root, "orphan", [user("m0 hi"), assistant("m1 hello"), orphan, assistant("m3")])
    file_session(
        root,
        "redacted",
        [user("my card is 4111 1111 1111 1111"), assistant("noted")],
        redactions={0: user("[REDACTED]")},
    )
    picture: Message = {
        "role": "user",
        "content": [
            {"text": "what is this?"},
            {"image": {"format": "png", "source": {"bytes": PNG}}},
        ],
    }
    file_session(root, "image", [picture, assistant("a tiny png")])
    broken = file_session(
        root, "broken", [user("m0"), assistant("m1"), user("m2"), assistant("m3")]
    )
    (broken / "messages" / "message_2.json").write_text('{"message": {"role": "us', "utf-8")
    file_session(root, "trimmed", normal_messages(8), removed=4)
    file_session(root, "team", [user("plan it"), assistant("planned")], agent_id="planner")
    file_session(root, "team", [user("write it"), assistant("written")], agent_id="writer")
    file_session(root, "both", [user("old log"), assistant("old answer")])
    snapshot_session(
        root,
        "both",
        snapshot_blob([user("from the snapshot"), assistant("snapshot answer")]),
        [],
    )
    first = [user("s0 hi"), assistant("s1 hello")]
    second = [*first, user("s2 find x"), use("ts", "s3 searching"), user("s4 still there?")]
    snapshot_session(
        root,
        "snap",
        snapshot_blob([*second, assistant("s5 yes")], state={"step": 3}, system_prompt="be brief"),
        [snapshot_blob(first, state={"step": 1}), snapshot_blob(second, state={"step": 2})],
    )
    return root


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def bare(messages: Any) -> Any:
    """Messages (or one) without the ``metadata`` the migration keeps beside them."""
    if isinstance(messages, dict):
        return {k: v for k, v in messages.items() if k != "metadata"}
    return [bare(m) for m in messages]


@pytest.fixture(params=["file", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "file":
        yield FileSessionStore(tmp_path / "perdure-store")
    else:
        sqlite = SQLiteSessionStore(tmp_path / "perdure.db")
        yield sqlite
        sqlite.close()


def by_id(report: MigrationReport) -> dict[str, SessionMigration]:
    return {entry.session_id: entry for entry in report.sessions if entry.layout == "snapshot"} | {
        entry.session_id: entry
        for entry in report.sessions
        if entry.layout == "file_session_manager" and entry.status != "skipped"
    }


def resume(store: SessionStore, session_id: str, answer: str = "fine") -> Agent:
    return Agent(model=ScriptedModel([answer]), session_manager=Session.resume(store, session_id))


# ------------------------------------------------------------------------- tests


def test_every_session_is_imported_and_resumes_model_valid(
    strands_dir: Path, store: SessionStore
) -> None:
    report = run(migrate_strands(strands_dir, store))
    entries = by_id(report)
    assert set(entries) == {
        "normal",
        "dangling",
        "orphan",
        "redacted",
        "image",
        "broken",
        "trimmed",
        "team.planner",
        "team.writer",
        "both",
        "snap",
    }
    assert {e.session_id: e.status for e in entries.values()} == dict.fromkeys(entries, "imported")
    for session_id in entries:
        agent = resume(store, session_id)
        assert_model_valid(agent.messages)
        agent("one more turn")
        model = agent.model
        assert isinstance(model, ScriptedModel)
        assert_model_valid(model.requests[-1]["messages"])


def test_message_files_are_ordered_by_number_not_name(
    strands_dir: Path, store: SessionStore
) -> None:
    entry = by_id(run(migrate_strands(strands_dir, store)))["normal"]
    assert (entry.messages_read, entry.messages_imported) == (16, 16)
    stored = run(store.get("normal")).messages
    assert bare(stored) == normal_messages(16)
    assert [int(t.split()[0][1:]) for t in texts(stored)] == list(range(16))
    agent = resume(store, "normal")
    assert bare(agent.messages) == normal_messages(16)
    assert agent.state.get() == {"city": "Paris", "visits": 3}


def test_a_dangling_tool_use_gets_a_placeholder_result(
    strands_dir: Path, store: SessionStore
) -> None:
    entry = by_id(run(migrate_strands(strands_dir, store)))["dangling"]
    assert (entry.placeholders_added, entry.orphans_dropped) == (1, 0)
    stored = run(store.get("dangling")).messages
    assert len(stored) == 4
    placeholder = stored[2]["content"][0]["toolResult"]
    assert placeholder["toolUseId"] == "t0"
    assert placeholder["status"] == "error"
    assert placeholder["content"] == [{"text": INTERRUPTED_TOOL_RESULT_TEXT}]
    assert stored[2]["content"][1] == {"text": "m2 hello?"}
    assert_model_valid(stored)


def test_an_orphan_tool_result_is_dropped(strands_dir: Path, store: SessionStore) -> None:
    entry = by_id(run(migrate_strands(strands_dir, store)))["orphan"]
    assert (entry.placeholders_added, entry.orphans_dropped) == (0, 1)
    stored = run(store.get("orphan")).messages
    assert bare(stored[2]) == user("m2 and now?")


def test_a_redaction_replaces_the_message_and_the_original_is_not_imported(
    strands_dir: Path, store: SessionStore, tmp_path: Path
) -> None:
    entry = by_id(run(migrate_strands(strands_dir, store)))["redacted"]
    assert entry.redactions_applied == 1
    assert bare(run(store.get("redacted")).messages[0]) == user("[REDACTED]")
    written = b"".join(p.read_bytes() for p in tmp_path.glob("perdure*/**/*") if p.is_file())
    written += b"".join(p.read_bytes() for p in tmp_path.glob("perdure.db*") if p.is_file())
    assert b"4111 1111 1111 1111" not in written  # the card number, not a stray digit run in a hash


def test_bytes_come_back_as_bytes(strands_dir: Path, store: SessionStore) -> None:
    run(migrate_strands(strands_dir, store))
    agent = resume(store, "image")
    image = agent.messages[0]["content"][1]["image"]
    assert image["source"]["bytes"] == PNG


def test_a_malformed_message_file_is_reported_and_the_rest_imported(
    strands_dir: Path, store: SessionStore
) -> None:
    report = run(migrate_strands(strands_dir, store))
    entry = by_id(report)["broken"]
    assert entry.status == "imported"
    assert [f.path for f in entry.skipped_files] == [
        "session_broken/agents/agent_default/messages/message_2.json"
    ]
    assert "malformed JSON" in entry.skipped_files[0].reason
    assert texts(run(store.get("broken")).messages) == ["m0", "m1", "m3"]
    assert not report.ok


def test_removed_message_count_keeps_the_whole_history_and_the_agents_view(
    strands_dir: Path, store: SessionStore
) -> None:
    run(migrate_strands(strands_dir, store))
    assert bare(run(store.get("trimmed")).messages) == normal_messages(8)
    agent = resume(store, "trimmed")
    assert agent.conversation_manager.removed_message_count == 4
    assert bare(agent.messages) == normal_messages(8)[4:]


def test_several_agents_become_session_dot_agent(strands_dir: Path, store: SessionStore) -> None:
    run(migrate_strands(strands_dir, store))
    assert texts(run(store.get("team.planner")).messages) == ["plan it", "planned"]
    assert texts(run(store.get("team.writer")).messages) == ["write it", "written"]


def test_the_snapshot_layout_gives_history_state_and_checkpoints(
    strands_dir: Path, store: SessionStore
) -> None:
    report = run(migrate_strands(strands_dir, store))
    entry = by_id(report)["snap"]
    assert entry.checkpoints_imported == 2
    assert entry.placeholders_added == 1  # the toolUse "ts" never got a result
    assert any("system prompt is not imported" in note for note in entry.notes)
    agent = resume(store, "snap")
    assert agent.state.get() == {"step": 3}
    assert texts(agent.messages)[-1] == "s5 yes"
    checkpoints = run(store.checkpoints.list("snap"))  # type: ignore[attr-defined]
    assert [(c.trigger, c.message_count) for c in checkpoints] == [("import", 2), ("import", 5)]
    assert checkpoints[0].label.startswith("strands snapshot 1748854800000_")
    record = run(store.checkpoints.get("snap", checkpoints[1].checkpoint_id))  # type: ignore[attr-defined]
    assert record.agent_state["state"] == {"step": 2}
    assert_model_valid(record.messages, allow_pending_last=True)


def test_the_snapshot_layout_supersedes_the_message_log_of_the_same_agent(
    strands_dir: Path, store: SessionStore
) -> None:
    report = run(migrate_strands(strands_dir, store))
    log = next(e for e in report.sessions if e.source == "session_both/agents/agent_default")
    assert log.status == "skipped"
    assert "superseded by the snapshot layout" in (log.reason or "")
    assert texts(run(store.get("both")).messages) == ["from the snapshot", "snapshot answer"]


def test_dry_run_writes_nothing(strands_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "never"
    report = run(migrate_strands(strands_dir, FileSessionStore(target), dry_run=True))
    assert report.dry_run
    assert {e.status for e in report.sessions} == {"would_import", "skipped"}
    assert by_id(report)["snap"].checkpoints_imported == 2
    assert not target.exists()


def test_an_existing_session_is_skipped_unless_overwrite(
    strands_dir: Path, store: SessionStore
) -> None:
    agent = Agent(model=ScriptedModel(["mine"]), session_manager=Session(store, "normal"))
    agent("a perdure conversation")
    report = run(migrate_strands(strands_dir, store))
    entry = next(e for e in report.sessions if e.session_id == "normal")
    assert entry.status == "skipped"
    assert "already exists" in (entry.reason or "")
    assert len(run(store.get("normal")).messages) == 2
    dry = by_id(run(migrate_strands(strands_dir, store, dry_run=True, overwrite=True)))["normal"]
    assert (dry.status, dry.notes) == ("would_import", ["would replace the existing session"])
    assert len(run(store.get("normal")).messages) == 2
    again = by_id(run(migrate_strands(strands_dir, store, overwrite=True)))["normal"]
    assert again.status == "imported"
    assert bare(run(store.get("normal")).messages) == normal_messages(16)


def test_strays_and_unknown_blocks_are_reported_not_dropped_silently(tmp_path: Path) -> None:
    root = tmp_path / "strands"
    agent_dir = file_session(root, "odd", [user("m0"), assistant("m1")])
    (agent_dir / "messages" / "message_1.json.tmp").write_text("{}", "utf-8")
    cached: Message = {"role": "user", "content": [{"text": "m2"}, {"cachePoint": {}}]}  # type: ignore[list-item]
    write_json(
        agent_dir / "messages" / "message_2.json",
        {"message": cached, "message_id": 2, "redact_message": None},
    )
    (root / "session_odd" / "multi_agents" / "multi_agent_g").mkdir(parents=True)
    snapshot_session(root, "weird", {"scope": "agent", "schema_version": "9.9", "data": {}}, [])
    store = FileSessionStore(tmp_path / "store")
    report = run(migrate_strands(root, store))
    paths = {f.path: f.reason for f in report.all_skipped_files}
    assert "session_odd/agents/agent_default/messages/message_1.json.tmp" in paths
    assert "session_odd/multi_agents/multi_agent_g" in paths
    assert (
        "unsupported snapshot schema_version"
        in paths["session/weird/scopes/agent/default/snapshots/snapshot_latest.json"]
    )
    odd = next(e for e in report.sessions if e.session_id == "odd")
    assert any("cachePoint" in note for note in odd.notes)
    assert texts(run(store.get("odd")).messages) == ["m0", "m1", "m2"]


def test_numbering_gaps_and_a_summary_message_are_handled(tmp_path: Path) -> None:
    root = tmp_path / "strands"
    agent_dir = file_session(
        root,
        "sum",
        normal_messages(8),
        removed=4,
        manager="SummarizingConversationManager",
    )
    data = json.loads((agent_dir / "agent.json").read_text("utf-8"))
    data["conversation_manager_state"]["summary_message"] = user("summary of m0-m3")
    write_json(agent_dir / "agent.json", data)
    (agent_dir / "messages" / "message_6.json").unlink()
    store = FileSessionStore(tmp_path / "store")
    entry = run(migrate_strands(root, store)).sessions[0]
    assert any("[6] are missing" in note for note in entry.notes)
    stored = run(store.get("sum")).messages
    assert stored[4] == user("summary of m0-m3")
    # 7 files read, the summary added, and a placeholder for t1 whose result was message 6
    assert (len(stored), entry.placeholders_added) == (9, 1)
    assert stored[7]["content"][0]["toolResult"]["toolUseId"] == "t1"
    saved = run(store.get("sum")).agent_state["conversation_manager_state"]
    assert saved == {"__name__": "SummarizingConversationManager", "removed_message_count": 4}
    agent = Agent(
        model=ScriptedModel(["ok"]),
        conversation_manager=SummarizingConversationManager(),
        session_manager=Session.resume(store, "sum"),
    )
    assert agent.messages[0] == user("summary of m0-m3")  # the view Strands restored
    assert_model_valid(agent.messages)


def test_an_unknown_conversation_manager_drops_its_state_with_a_note(tmp_path: Path) -> None:
    root = tmp_path / "strands"
    file_session(root, "custom", normal_messages(4), removed=2, manager="MyManager")
    store = FileSessionStore(tmp_path / "store")
    entry = run(migrate_strands(root, store)).sessions[0]
    assert any("'MyManager' has no perdure counterpart" in note for note in entry.notes)
    agent = resume(store, "custom")
    assert bare(agent.messages) == normal_messages(4)


def test_pending_interrupts_are_converted(tmp_path: Path) -> None:
    root = tmp_path / "strands"
    interrupts = {
        "interrupts": {"i1": {"id": "i1", "name": "approve", "reason": "ok?", "response": None}},
        "context": {"tool_results": []},
        "activated": True,
    }
    file_session(root, "hitl", [user("go"), assistant("hm")], interrupt_state=interrupts)
    store = FileSessionStore(tmp_path / "store")
    run(migrate_strands(root, store))
    saved = run(store.get("hitl")).agent_state["internal_state"]["interrupt_state"]
    assert saved["activated"] is True
    assert saved["interrupts"]["i1"]["name"] == "approve"


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        run(migrate_strands(tmp_path / "missing", FileSessionStore(tmp_path / "s")))
    with pytest.raises(TypeError, match="SessionStore"):
        run(migrate_strands(tmp_path, object()))  # type: ignore[arg-type]


def test_an_id_perdure_cannot_hold_fails_that_session_only(tmp_path: Path) -> None:
    root = tmp_path / "strands"
    file_session(root, "a\\b", [user("hi"), assistant("hello")])
    file_session(root, "fine", [user("hi"), assistant("hello")])
    store = FileSessionStore(tmp_path / "store")
    seen: list[tuple[str, int, int]] = []
    report = run(
        migrate_strands(
            root, store, progress=lambda e, done, total: seen.append((e.status, done, total))
        )
    )
    statuses = {e.strands_session_id: (e.status, e.reason or "") for e in report.sessions}
    assert statuses["a\\b"][0] == "failed"
    assert "not a valid perdure session id" in statuses["a\\b"][1]
    assert statuses["fine"] == ("imported", "")
    assert not report.ok
    assert seen == [("failed", 1, 2), ("imported", 2, 2)]
    assert report.to_dict()["counts"] == {
        "imported": 1,
        "would_import": 0,
        "skipped": 0,
        "failed": 1,
    }


def test_timestamps_usage_and_the_sessions_creation_time_are_kept(
    tmp_path: Path, store: SessionStore
) -> None:
    """Issue 23: what perdure has no field for goes into each message's metadata."""
    root = tmp_path / "strands"
    agent_dir = file_session(root, "kept", normal_messages(4))
    record = agent_dir / "messages" / "message_1.json"
    data = json.loads(record.read_text())
    data["created_at"] = "2025-06-01T10:00:05.000000+00:00"
    data["updated_at"] = "2025-06-01T10:00:07.000000+00:00"
    data["message"]["metadata"] = {
        "usage": {"inputTokens": 12, "outputTokens": 5, "totalTokens": 17},
        "metrics": {"latencyMs": 840},
    }
    write_json(record, data)
    entry = by_id(run(migrate_strands(root, store)))["kept"]
    assert entry.status == "imported"
    assert entry.strands_created_at == T0
    kept = run(store.get("kept"))
    # The session keeps Strands' creation time as its own (UTC, as perdure writes it).
    assert kept.meta.created_at == "2025-06-01T10:00:00.000000Z"
    assert [m.created_at for m in run(store.list())] == ["2025-06-01T10:00:00.000000Z"]
    assert kept.meta.updated_at > kept.meta.created_at  # the import wrote it
    stored = kept.messages
    assert bare(stored) == normal_messages(4)
    assert stored[0]["metadata"] == {  # type: ignore[typeddict-item]
        "strands": {"message_id": 0, "created_at": T0, "updated_at": T0}
    }
    assert stored[1]["metadata"] == {  # type: ignore[typeddict-item]
        "strands": {
            "message_id": 1,
            "created_at": "2025-06-01T10:00:05.000000+00:00",
            "updated_at": "2025-06-01T10:00:07.000000+00:00",
        },
        "usage": {"inputTokens": 12, "outputTokens": 5, "totalTokens": 17},
        "metrics": {"latencyMs": 840},
    }
    # The metadata stays beside the conversation: a resumed agent goes on, and the
    # model is sent role and content only by the provider formats.
    agent = resume(store, "kept")
    agent("and then?")
    from perdure.models._anthropic_format import to_anthropic_messages
    from perdure.models._openai_format import to_openai_messages

    model = agent.model
    assert isinstance(model, ScriptedModel)
    sent = model.requests[-1]["messages"]
    assert any("metadata" in m for m in sent)  # the loop passes messages as stored
    assert not any("metadata" in m for m in to_openai_messages(sent, None))
    assert not any("metadata" in m for m in to_anthropic_messages(sent))


@pytest.mark.parametrize("stamp", ["2025-06-01T10:00:00", "last tuesday"])
def test_an_unusable_session_creation_time_is_kept_in_metadata(
    tmp_path: Path, store: SessionStore, stamp: str
) -> None:
    """A creation time that names no instant (no offset, no time) is not guessed at."""
    root = tmp_path / "strands"
    file_session(root, "odd", normal_messages(2))
    meta = root / "session_odd" / "session.json"
    write_json(meta, {**json.loads(meta.read_text()), "created_at": stamp})
    started = utc_now()
    entry = by_id(run(migrate_strands(root, store)))["odd"]
    assert entry.status == "imported"
    assert any("created_at is unusable" in note for note in entry.notes), entry.notes
    record = run(store.get("odd"))
    assert record.meta.created_at >= started  # the migration's time
    assert record.messages[0]["metadata"]["strands"]["session_created_at"] == stamp  # type: ignore[typeddict-item]


def test_strict_refuses_a_session_with_an_unreadable_message(
    tmp_path: Path, store: SessionStore
) -> None:
    root = tmp_path / "strands"
    broken = file_session(root, "broken", normal_messages(4))
    file_session(root, "fine", normal_messages(2))
    (broken / "messages" / "message_2.json").write_bytes(b"{not json")
    report = run(migrate_strands(root, store, strict=True))
    entries = by_id(report)
    assert entries["fine"].status == "imported"
    assert entries["broken"].status == "failed"
    assert entries["broken"].reason is not None
    assert "message_2.json" in entries["broken"].reason
    assert not report.ok
    assert [m.session_id for m in run(store.list())] == ["fine"]  # nothing half-imported
    # Without --strict the session is imported with its gap (and the gap reported).
    relaxed = by_id(run(migrate_strands(root, store)))["broken"]
    assert (relaxed.status, relaxed.messages_read) == ("imported", 3)
