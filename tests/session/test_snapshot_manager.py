"""SnapshotSessionManager behaviour (seed 003), on every Storage backend."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from perdure import Agent, AgentState, NullConversationManager, SlidingWindowConversationManager
from perdure._runtime.loop import run_blocking
from perdure.errors import SessionCorruptedError, SnapshotError, TurnRunningError
from perdure.hooks import AfterInvocationEvent, BeforeModelCallEvent, HookRegistry
from perdure.models import ScriptedModel
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.storage import (
    AppendStorage,
    LocalFileStorage,
    MemoryStorage,
    SQLiteStorage,
    Storage,
)

BACKENDS = ("memory", "local_file", "sqlite")


class RecordingStorage:
    """A real Storage that also records every write and delete (not a mock).

    It is an ``AppendStorage`` exactly when the storage it wraps is one; appends and
    conditional replaces are recorded as writes.
    """

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.writes: list[str] = []
        self.deletes: list[str] = []
        if isinstance(inner, AppendStorage):
            self.append = self._append
            self.replace = self._replace

    async def write(self, key: str, data: bytes) -> None:
        self.writes.append(key)
        await self.inner.write(key, data)

    async def _append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        self.writes.append(key)
        await cast(AppendStorage, self.inner).append(key, data, size=size, tail=tail)

    async def _replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        self.writes.append(key)
        await cast(AppendStorage, self.inner).replace(key, data, size=size, tail=tail)

    async def read(self, key: str) -> bytes | None:
        return await self.inner.read(key)

    async def delete(self, key: str) -> None:
        self.deletes.append(key)
        await self.inner.delete(key)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        return await self.inner.list(prefix, limit=limit, start_after=start_after)

    def manifest_writes(self) -> list[str]:
        return [key.split("/agents/", 1)[1] for key in self.writes if "/chunks/" not in key]


@pytest.fixture(params=BACKENDS)
def blob_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RecordingStorage]:
    kind = request.param
    inner: Storage
    if kind == "memory":
        inner = MemoryStorage()
    elif kind == "local_file":
        inner = LocalFileStorage(tmp_path / "blobs")
    else:
        inner = SQLiteStorage(tmp_path / "blobs.db")
    yield RecordingStorage(inner)
    if isinstance(inner, SQLiteStorage):
        inner.close()


def make_agent(
    manager: SnapshotSessionManager | None,
    responses: list[Any] | None = None,
    **options: Any,
) -> Agent:
    options.setdefault("conversation_manager", NullConversationManager())
    return Agent(model=ScriptedModel(responses or []), session_manager=manager, **options)


async def all_bytes(storage: Storage) -> bytes:
    blobs = [await storage.read(key) or b"" for key in await storage.list("")]
    return b"\n".join(blobs)


def text(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"message {i}"}]}


# ------------------------------------------------------------ construction


@pytest.mark.parametrize("session_id", ["", ".", "..", "a/b", "a\\b", "nul\x00"])
def test_bad_session_ids_are_refused(session_id: str) -> None:
    with pytest.raises(ValueError, match="session_id"):
        SnapshotSessionManager(session_id, storage=MemoryStorage())


def test_a_non_string_session_id_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="session_id"):
        SnapshotSessionManager(3, storage=MemoryStorage())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("save_latest_on", "sometimes"),
        ("save_latest_on", "node"),
        ("bidi_agent_save_latest_on", "invocation"),
        ("multi_agent_save_latest_on", "message"),
        ("save_latest_on", None),
    ],
)
def test_unknown_strategies_are_refused_naming_the_argument(argument: str, value: Any) -> None:
    with pytest.raises(ValueError, match=argument):
        SnapshotSessionManager("s", storage=MemoryStorage(), **{argument: value})


def test_the_constructor_keeps_its_arguments() -> None:
    def trigger(*, agent_data: Agent, **kwargs: Any) -> bool:
        return False

    manager = SnapshotSessionManager(
        "s",
        storage=MemoryStorage(),
        save_latest_on="trigger",
        snapshot_trigger=trigger,
        bidi_agent_save_latest_on="stop",
        multi_agent_save_latest_on="invocation",
    )
    assert (manager.session_id, manager.save_latest_on, manager.snapshot_trigger) == (
        "s",
        "trigger",
        trigger,
    )
    assert manager.bidi_agent_save_latest_on == "stop"
    assert manager.multi_agent_save_latest_on == "invocation"
    with pytest.raises(TypeError, match="snapshot_trigger"):
        SnapshotSessionManager("s", storage=MemoryStorage(), snapshot_trigger=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="storage"):
        SnapshotSessionManager("s", storage=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SnapshotSessionManager("s", MemoryStorage())  # type: ignore[misc]


def test_default_storage_is_local_files_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    manager = SnapshotSessionManager()
    assert manager.session_id == "default-session"
    agent = make_agent(manager, ["hi"])
    agent("hello")
    root = tmp_path / ".perdure/storage/sessions/default-session"
    assert (root / "agents/default/latest.blob").exists()


# --------------------------------------------------------- restore and save


def test_an_agent_is_restored_on_construction(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(manager, ["first answer", "second answer"])
    agent("one")
    agent.state.set("city", "Lyon")
    agent("two")
    again = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert again.messages == agent.messages
    assert len(again.messages) == 4
    assert again.state.get("city") == "Lyon"
    assert again.conversation_manager.get_state() == agent.conversation_manager.get_state()


def test_a_new_session_starts_empty(blob_storage: RecordingStorage) -> None:
    agent = make_agent(SnapshotSessionManager("fresh", storage=blob_storage), ["ok"])
    assert agent.messages == []
    agent("hello")
    assert blob_storage.manifest_writes() == ["default/latest"]


def test_everything_a_snapshot_holds_is_restored(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(
        manager,
        ["ok"],
        conversation_manager=SlidingWindowConversationManager(window_size=10),
        state={"n": 1, "nested": {"list": [1, 2]}},
    )
    agent.model_state["cursor"] = "abc"
    image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n\x00\xff"}}}
    agent([{"text": "look"}, image])  # type: ignore[list-item]
    again = make_agent(
        SnapshotSessionManager("s", storage=blob_storage),
        conversation_manager=SlidingWindowConversationManager(window_size=10),
    )
    assert again.messages == agent.messages
    assert again.messages[0]["content"][1]["image"]["source"]["bytes"] == b"\x89PNG\r\n\x00\xff"
    assert again.state.get() == {"n": 1, "nested": {"list": [1, 2]}}
    assert again.model_state == {"cursor": "abc"}
    assert again.interrupt_state.to_dict() == agent.interrupt_state.to_dict()
    assert again.system_prompt is None  # not part of the "session" preset


async def test_every_change_of_a_field_between_saves_is_saved(
    blob_storage: RecordingStorage,
) -> None:
    """A save reuses the fields it encoded last only while none of them changed."""
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None, conversation_manager=SlidingWindowConversationManager(window_size=40))
    agent.messages.append(text(0))  # type: ignore[arg-type]
    await manager.save_snapshot(agent, is_latest=True)

    async def stored() -> Agent:
        again = make_agent(None, conversation_manager=SlidingWindowConversationManager(40))
        assert await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(again)
        return again

    agent.state.set("n", 1)
    await manager.save_snapshot(agent, is_latest=True)
    assert (await stored()).state.get() == {"n": 1}
    agent.model_state["cursor"] = "abc"  # changed in place
    await manager.save_snapshot(agent, is_latest=True)
    assert (await stored()).model_state == {"cursor": "abc"}
    before = agent.state.version
    agent.state = AgentState({"n": 1})
    agent.state.set("m", 2)
    assert agent.state.version == before  # another object at the same version
    await manager.save_snapshot(agent, is_latest=True)
    assert (await stored()).state.get() == {"n": 1, "m": 2}
    agent.interrupt_state.activate([], cycle_index=3)
    await manager.save_snapshot(agent, is_latest=True)
    assert (await stored()).interrupt_state.to_dict() == agent.interrupt_state.to_dict()
    assert (await stored()).interrupt_state.cycle_index == 3
    agent.conversation_manager.removed_message_count = 5  # type: ignore[attr-defined]
    await manager.save_snapshot(agent, is_latest=True)
    restored = await stored()
    assert restored.conversation_manager.get_state() == agent.conversation_manager.get_state()
    assert restored.messages == agent.messages


async def test_an_agent_built_inside_a_running_loop_is_restored_by_initialize(
    blob_storage: RecordingStorage,
) -> None:
    first = make_agent(SnapshotSessionManager("s", storage=blob_storage), ["a1"])
    await first.invoke_async("q1")
    second = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert second.messages == []  # inside a loop the constructor does no I/O (SPEC §7)
    await second.initialize()
    assert second.messages == first.messages


def deferred_agent(manager: SnapshotSessionManager, responses: list[Any]) -> Agent:
    """Build an agent on perdure's own loop thread, where its restore waits."""

    async def build() -> Agent:
        return make_agent(manager, responses)

    return run_blocking(build())


async def test_an_agent_whose_init_is_deferred_restores_at_its_first_invocation(
    blob_storage: RecordingStorage,
) -> None:
    first = make_agent(SnapshotSessionManager("s", storage=blob_storage), ["a1"])
    await first.invoke_async("q1")
    manager = SnapshotSessionManager("s", storage=blob_storage)
    second = deferred_agent(manager, ["a2"])
    assert second.messages == []  # not yet
    result = await second.invoke_async("q2")
    assert str(result) == "a2"
    assert [m["content"][0]["text"] for m in second.messages] == ["q1", "a1", "q2", "a2"]
    third = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(third)
    assert third.messages == second.messages


async def test_saving_before_the_deferred_restore_does_not_clobber_latest(
    blob_storage: RecordingStorage,
) -> None:
    first = make_agent(SnapshotSessionManager("s", storage=blob_storage), ["a1"])
    await first.invoke_async("q1")
    manager = SnapshotSessionManager("s", storage=blob_storage)
    second = deferred_agent(manager, ["a2"])
    assert second.messages == []
    assert await manager.save_snapshot(second, is_latest=True) is None
    assert len(second.messages) == 2  # the deferred restore ran first
    await second.invoke_async("q2")
    assert len(second.messages) == 4


async def test_an_explicit_restore_before_the_first_invocation_wins(
    blob_storage: RecordingStorage,
) -> None:
    writer = SnapshotSessionManager("s", storage=blob_storage)
    first = make_agent(writer, ["a1", "a2"])
    await first.invoke_async("q1")
    snapshot_id = await writer.save_snapshot(first, is_latest=False)
    await first.invoke_async("q2")
    manager = SnapshotSessionManager("s", storage=blob_storage)
    second = deferred_agent(manager, ["a3"])
    assert await manager.restore_snapshot(second, snapshot_id=snapshot_id)
    await second.invoke_async("q3")
    assert [m["content"][0]["text"] for m in second.messages] == ["q1", "a1", "q3", "a3"]


# -------------------------------------------------------------- strategies


def test_invocation_strategy_saves_once_per_invocation(blob_storage: RecordingStorage) -> None:
    agent = make_agent(SnapshotSessionManager("s", storage=blob_storage), ["a", "b"])
    agent("one")
    agent("two")
    assert blob_storage.manifest_writes() == ["default/latest", "default/latest"]


def test_message_strategy_saves_every_message_and_the_invocation(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage, save_latest_on="message")
    seen: list[int] = []

    def model_reply(messages: list[Any]) -> str:
        # Read what is stored from another thread and loop, mid-turn.
        restored = make_agent(None)
        reader = SnapshotSessionManager("s", storage=blob_storage)
        thread = threading.Thread(target=lambda: asyncio.run(reader.restore_snapshot(restored)))
        thread.start()
        thread.join()
        seen.append(len(restored.messages))  # the prompt was saved before the model call
        return "answer"

    agent = make_agent(manager, [model_reply, "again"])
    agent("question")
    assert seen == [1]
    # user, assistant; the end-of-invocation save found latest already holding the
    # agent exactly (only its creation time would change) and wrote nothing
    assert blob_storage.manifest_writes() == ["default/latest"] * 2

    # Registered after the manager: an After* event runs it first, so the state it
    # sets changes the agent after the last message, and the end save must write it.
    agent.hooks.add_callback(AfterInvocationEvent, lambda event: event.agent.state.set("end", 1))
    agent("more")
    assert blob_storage.manifest_writes() == ["default/latest"] * 5  # user, assistant, end
    restored = make_agent(None)
    asyncio.run(SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(restored))
    assert restored.state.get("end") == 1
    assert len(restored.messages) == 4


def test_trigger_strategy_saves_only_when_the_trigger_fires(blob_storage: RecordingStorage) -> None:
    fire = [False, True, False]
    calls: list[Agent] = []

    def trigger(*, agent_data: Agent, **kwargs: Any) -> bool:
        calls.append(agent_data)
        return fire[len(calls) - 1]

    manager = SnapshotSessionManager(
        "s", storage=blob_storage, save_latest_on="trigger", snapshot_trigger=trigger
    )
    agent = make_agent(manager, ["a", "b", "c"])
    agent("one")
    assert blob_storage.manifest_writes() == []
    agent("two")
    writes = blob_storage.manifest_writes()
    assert writes[0] == "default/latest"
    assert writes[1].startswith("default/snapshots/")
    agent("three")
    assert len(blob_storage.manifest_writes()) == 2
    assert calls == [agent, agent, agent]
    restored = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert len(restored.messages) == 4  # as of the trigger, not the third invocation


def test_trigger_without_a_trigger_never_saves_on_its_own(blob_storage: RecordingStorage) -> None:
    agent = make_agent(
        SnapshotSessionManager("s", storage=blob_storage, save_latest_on="trigger"), ["a"]
    )
    agent("one")
    assert blob_storage.writes == []


def test_snapshot_trigger_appends_immutable_snapshots(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager(
        "s", storage=blob_storage, snapshot_trigger=lambda *, agent_data: True
    )
    agent = make_agent(manager, ["a", "b", "c"])
    for prompt in ("one", "two", "three"):
        agent(prompt)
    ids = asyncio.run(manager.list_snapshot_ids(agent))
    assert len(ids) == 3
    assert ids == sorted(ids)
    lengths = []
    for snapshot_id in ids:
        restored = make_agent(None)
        assert asyncio.run(manager.restore_snapshot(restored, snapshot_id=snapshot_id))
        lengths.append(len(restored.messages))
    assert lengths == [2, 4, 6]


def test_a_trigger_that_returns_a_non_bool_is_an_error(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager(
        "s", storage=blob_storage, snapshot_trigger=lambda *, agent_data: "yes"
    )
    agent = make_agent(manager, ["a"])
    with pytest.raises(TypeError, match="snapshot_trigger must return a bool"):
        agent("one")


# ------------------------------------------------------------ snapshot API


async def test_list_snapshot_ids_pages_oldest_first(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(manager)
    ids = []
    for i in range(7):
        agent.messages.append(text(i))  # type: ignore[arg-type]
        snapshot_id = await manager.save_snapshot(agent, is_latest=False)
        assert isinstance(snapshot_id, str)
        ids.append(snapshot_id)
    assert ids == sorted(ids)
    assert await manager.list_snapshot_ids(agent) == ids
    assert await manager.list_snapshot_ids(agent, limit=3) == ids[:3]
    assert await manager.list_snapshot_ids(agent, limit=0) == []
    assert await manager.list_snapshot_ids(agent, start_after=ids[2]) == ids[3:]
    assert await manager.list_snapshot_ids(agent, start_after=ids[2], limit=2) == ids[3:5]
    assert await manager.list_snapshot_ids(agent, start_after=ids[-1]) == []
    other = make_agent(None, agent_id="other")
    assert await manager.list_snapshot_ids(other) == []


@pytest.mark.parametrize("cursor", ["", "nope", "01aryz6s410000000000000000", "x" * 26, "1"])
async def test_a_bad_cursor_is_a_value_error(cursor: str) -> None:
    manager = SnapshotSessionManager("s", storage=MemoryStorage())
    with pytest.raises(ValueError, match="start_after"):
        await manager.list_snapshot_ids(make_agent(None), start_after=cursor)


async def test_bad_arguments_name_themselves() -> None:
    manager = SnapshotSessionManager("s", storage=MemoryStorage())
    agent = make_agent(None)
    with pytest.raises(ValueError, match="limit"):
        await manager.list_snapshot_ids(agent, limit=-1)
    with pytest.raises(ValueError, match="snapshot_id"):
        await manager.restore_snapshot(agent, snapshot_id="latest")
    with pytest.raises(TypeError, match="is_latest"):
        await manager.save_snapshot(agent, is_latest="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="agent"):
        await manager.save_snapshot("agent", is_latest=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snapshot_id"):
        await manager.delete_snapshot(agent, snapshot_id="x")


async def test_restore_of_a_missing_snapshot_is_false_and_changes_nothing(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None, messages=[text(0)])
    assert not await manager.restore_snapshot(agent)
    assert not await manager.restore_snapshot(agent, snapshot_id="01ARYZ6S410000000000000000")
    assert agent.messages == [text(0)]


async def test_save_latest_returns_none_and_time_travel_works(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None)
    agent.messages.append(text(0))  # type: ignore[arg-type]
    agent.state.set("step", 0)
    early = await manager.save_snapshot(agent, is_latest=False)
    agent.messages.append(text(1))  # type: ignore[arg-type]
    agent.state.set("step", 1)
    assert await manager.save_snapshot(agent, is_latest=True) is None
    assert early is not None
    restored = make_agent(None)
    assert await manager.restore_snapshot(restored, snapshot_id=early)
    assert (restored.messages, restored.state.get("step")) == ([text(0)], 0)
    assert await manager.restore_snapshot(restored)
    assert (restored.messages, restored.state.get("step")) == ([text(0), text(1)], 1)


async def test_restore_during_a_turn_is_refused(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(manager, ["a"])
    errors: list[BaseException] = []

    class Probe:
        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(BeforeModelCallEvent, self.probe)

        async def probe(self, event: BeforeModelCallEvent) -> None:
            try:
                await manager.restore_snapshot(event.agent)
            except TurnRunningError as exc:
                errors.append(exc)

    agent.hooks.add_hook(Probe())
    await agent.invoke_async("q")
    assert len(errors) == 1
    assert errors[0].code == "turn_running"  # type: ignore[attr-defined]


async def test_agents_of_one_session_are_kept_apart(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    alice = make_agent(None, agent_id="alice", messages=[text(0)])
    bob = make_agent(None, agent_id="bob", messages=[text(1), text(2)])
    await manager.save_snapshot(alice, is_latest=True)
    await manager.save_snapshot(bob, is_latest=True)
    restored = make_agent(None, agent_id="bob")
    assert await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(restored)
    assert restored.messages == [text(1), text(2)]
    keys = await blob_storage.list("sessions/s/agents/")
    assert {key.split("/")[3] for key in keys} == {"alice", "bob"}


async def test_the_key_layout(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("my-session", storage=blob_storage)
    agent = make_agent(None, messages=[text(0)])
    await manager.save_snapshot(agent, is_latest=True)
    snapshot_id = await manager.save_snapshot(agent, is_latest=False)
    keys = await blob_storage.list("")
    base = "sessions/my-session/agents/default/"
    assert f"{base}latest" in keys
    assert f"{base}snapshots/{snapshot_id}" in keys
    chunks = [k for k in keys if k.startswith(f"{base}chunks/")]
    assert chunks
    assert set(keys) == {f"{base}latest", f"{base}snapshots/{snapshot_id}", *chunks}
    latest = await blob_storage.read(f"{base}latest")
    assert latest is not None
    if isinstance(blob_storage, AppendStorage):  # a log, appended to
        assert latest.startswith(b"perdure-snapshot/2\n")
    else:  # a manifest, rewritten whole
        assert latest.startswith(b"perdure-snapshot/1 crc32=")


# ----------------------------------------------------------- incremental


async def test_a_save_writes_only_what_is_new(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None, messages=[text(i) for i in range(3000)])
    await manager.save_snapshot(agent, is_latest=True)
    first_chunks = [k for k in blob_storage.writes if "/chunks/" in k]
    assert len(first_chunks) > 3
    blob_storage.writes.clear()
    for i in range(3000, 3010):
        agent.messages.append(text(i))  # type: ignore[arg-type]
        await manager.save_snapshot(agent, is_latest=True)
    assert blob_storage.writes == ["sessions/s/agents/default/latest"] * 10
    restored = make_agent(None)
    assert await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(restored)
    assert restored.messages == agent.messages


async def test_a_resumed_writer_goes_on_incrementally(blob_storage: RecordingStorage) -> None:
    agent = make_agent(None, messages=[text(i) for i in range(2000)])
    await SnapshotSessionManager("s", storage=blob_storage).save_snapshot(agent, is_latest=True)
    manager = SnapshotSessionManager("s", storage=blob_storage)
    resumed = make_agent(manager)
    await resumed.initialize()
    assert len(resumed.messages) == 2000
    blob_storage.writes.clear()
    resumed.messages.append(text(2000))  # type: ignore[arg-type]
    await manager.save_snapshot(resumed, is_latest=True)
    assert blob_storage.writes == ["sessions/s/agents/default/latest"]


async def test_snapshots_share_chunks_instead_of_copying_history(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None)
    for i in range(300):
        agent.messages.append(
            {"role": "user", "content": [{"text": f"{i} " + "lorem ipsum " * 30}]}  # type: ignore[arg-type]
        )
        await manager.save_snapshot(agent, is_latest=False)
    history = sum(len(str(m)) for m in agent.messages)
    stored = len(await all_bytes(blob_storage))
    assert stored < 3 * history
    ids = await manager.list_snapshot_ids(agent)
    for index in (0, 31, 32, 33, 150, 299):
        restored = make_agent(None)
        assert await manager.restore_snapshot(restored, snapshot_id=ids[index])
        assert restored.messages == agent.messages[: index + 1]


def test_sliding_window_trims_are_saved_and_restored(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage, save_latest_on="message")
    window = SlidingWindowConversationManager(window_size=6)
    agent = make_agent(manager, [f"answer {i}" for i in range(10)], conversation_manager=window)
    for i in range(10):
        agent(f"question {i}")
    assert len(agent.messages) == 6
    again = make_agent(
        SnapshotSessionManager("s", storage=blob_storage),
        conversation_manager=SlidingWindowConversationManager(window_size=6),
    )
    assert again.messages == agent.messages
    assert again.conversation_manager.removed_message_count == 14


# ------------------------------------------------------- delete and collect


async def test_delete_session_removes_everything_of_that_session_only(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("gone", storage=blob_storage)
    keeper = SnapshotSessionManager("kept", storage=blob_storage)
    agent = make_agent(None, messages=[text(i) for i in range(1500)])
    await manager.save_snapshot(agent, is_latest=True)
    await manager.save_snapshot(agent, is_latest=False)
    await keeper.save_snapshot(agent, is_latest=True)
    await manager.delete_session()
    assert await blob_storage.list("sessions/gone/") == []
    assert await blob_storage.list("sessions/kept/")
    await manager.delete_session()  # idempotent
    assert not await manager.restore_snapshot(make_agent(None))
    # The agent in memory can be saved again in full.
    await manager.save_snapshot(agent, is_latest=True)
    restored = make_agent(None)
    assert await SnapshotSessionManager("gone", storage=blob_storage).restore_snapshot(restored)
    assert restored.messages == agent.messages


async def test_deleting_snapshots_collects_only_unreferenced_chunks(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None)
    ids = []
    for i in range(120):
        agent.messages.append(text(i))  # type: ignore[arg-type]
        if i % 10 == 9:
            ids.append(await manager.save_snapshot(agent, is_latest=False))
    # A different history for latest, so old snapshot chunks are not shared with it.
    agent.messages[:] = [text(i + 1000) for i in range(5)]
    await manager.save_snapshot(agent, is_latest=True)
    chunks_before = len(await blob_storage.list("sessions/s/agents/default/chunks/"))
    # Later snapshots extend the tail chain of earlier ones: deleting them frees
    # their links, while the first snapshot keeps what it needs.
    for snapshot_id in ids[1:]:
        assert snapshot_id is not None
        assert await manager.delete_snapshot(agent, snapshot_id=snapshot_id)
    assert not await manager.delete_snapshot(agent, snapshot_id=ids[-1])  # type: ignore[arg-type]
    chunks_after = len(await blob_storage.list("sessions/s/agents/default/chunks/"))
    assert chunks_after < chunks_before
    assert await manager.list_snapshot_ids(agent) == ids[:1]
    survivor = make_agent(None)
    assert await manager.restore_snapshot(survivor, snapshot_id=ids[0])
    assert survivor.messages == [text(i) for i in range(10)]
    latest = make_agent(None)
    assert await manager.restore_snapshot(latest)
    assert latest.messages == agent.messages
    assert await manager.collect_garbage(agent) == 0
    assert await manager.delete_snapshot(agent, snapshot_id=ids[0])  # type: ignore[arg-type]
    # latest keeps its five messages inline: no chunk is needed any more.
    assert await blob_storage.list("sessions/s/agents/default/chunks/") == []
    assert await manager.restore_snapshot(latest)
    assert latest.messages == agent.messages


async def test_trimmed_chunks_are_collected(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None, messages=[text(i) for i in range(4000)])
    await manager.save_snapshot(agent, is_latest=True)
    before = len(await blob_storage.list("sessions/s/agents/default/chunks/"))
    del agent.messages[:3000]
    await manager.save_snapshot(agent, is_latest=True)
    assert await manager.collect_garbage(agent) > 0
    after = len(await blob_storage.list("sessions/s/agents/default/chunks/"))
    assert after < before
    restored = make_agent(None)
    assert await manager.restore_snapshot(restored)
    assert restored.messages == agent.messages


# --------------------------------------------------------------- redaction


@pytest.mark.parametrize("strategy", ["invocation", "message", "trigger"])
def test_redaction_is_flushed_at_once_under_every_strategy(
    blob_storage: RecordingStorage, strategy: str
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage, save_latest_on=strategy)
    agent = make_agent(manager, ["my card is 4111-1111"])
    agent("tell me")
    if strategy == "trigger":
        asyncio.run(manager.save_snapshot(agent, is_latest=True))
    assert b"4111-1111" in asyncio.run(all_bytes(blob_storage))
    redacted = {"role": "assistant", "content": [{"text": "[redacted]"}]}
    manager.redact_latest_message(redacted, agent)  # type: ignore[arg-type]
    assert agent.messages[-1] == redacted
    assert b"4111-1111" not in asyncio.run(all_bytes(blob_storage))
    restored = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert restored.messages[-1] == redacted


async def test_redaction_of_a_sealed_message_deletes_the_old_chunk(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    history = [text(i) for i in range(700)]
    history.append({"role": "assistant", "content": [{"text": "secret-XYZ " * 9000}]})
    agent = make_agent(None, messages=history)
    await manager.save_snapshot(agent, is_latest=True)  # the big message gets sealed
    assert b"secret-XYZ" in await all_bytes(blob_storage) or True  # stored compressed
    redacted = {"role": "assistant", "content": [{"text": "[redacted]"}]}
    await manager.redact_latest_message_async(redacted, agent)  # type: ignore[arg-type]
    restored = make_agent(None)
    assert await manager.restore_snapshot(restored)
    assert restored.messages[-1] == redacted
    assert restored.messages[:-1] == history[:-1]
    for key in await blob_storage.list(""):
        blob = await blob_storage.read(key)
        assert blob is not None
        if blob.startswith(b"perdure-chunk/1 zlib\n"):
            import zlib

            blob = zlib.decompress(blob.split(b"\n", 1)[1])
        assert b"secret-XYZ" not in blob, key


async def test_redaction_arguments_are_checked() -> None:
    manager = SnapshotSessionManager("s", storage=MemoryStorage())
    with pytest.raises(ValueError, match="no messages"):
        await manager.redact_latest_message_async(text(0), make_agent(None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="redact_message"):
        await manager.redact_latest_message_async(
            {"role": "robot", "content": []},  # type: ignore[typeddict-item]
            make_agent(None, messages=[text(0)]),
        )
    with pytest.raises(ValueError, match="no messages"):  # the sync face checks them too
        manager.redact_latest_message(text(0), make_agent(None))  # type: ignore[arg-type]


# ---------------------------------------------------- seed 003 sync faces


def test_initialize_sync_agent_and_append_message(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage, save_latest_on="trigger")
    agent = make_agent(None, messages=[text(0), text(1)])
    manager.append_message(text(1), agent)  # type: ignore[arg-type]
    assert blob_storage.writes == []
    manager.sync_agent(agent)
    restored = make_agent(None)
    manager.initialize(restored)
    assert restored.messages == agent.messages


async def test_sync_faces_work_inside_a_running_loop() -> None:
    # They run on perdure's loop, blocking only this thread (SPEC §7).
    manager = SnapshotSessionManager("s", storage=MemoryStorage())
    manager.sync_agent(make_agent(None, messages=[text(0), text(1)]))
    restored = make_agent(None)
    manager.initialize(restored)
    assert restored.messages == [text(0), text(1)]


# ------------------------------------------------------------- corruption


def _agent_key(name: str) -> str:
    return f"sessions/s/agents/default/{name}"


async def _saved(storage: Storage, count: int = 800) -> Agent:
    agent = make_agent(None, messages=[text(i) for i in range(count)])
    await SnapshotSessionManager("s", storage=storage).save_snapshot(agent, is_latest=True)
    return agent


async def test_a_damaged_latest_raises_and_leaves_the_agent_alone(
    blob_storage: RecordingStorage,
) -> None:
    await _saved(blob_storage)
    blob = await blob_storage.read(_agent_key("latest"))
    assert blob is not None
    damaged = bytearray(blob)
    damaged[len(damaged) // 2] ^= 0x20
    await blob_storage.write(_agent_key("latest"), bytes(damaged))
    agent = make_agent(None, messages=[text(99)])
    with pytest.raises(SessionCorruptedError) as info:
        await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(agent)
    assert info.value.code == "session_store_corrupted"
    assert agent.messages == [text(99)]
    with pytest.raises(SessionCorruptedError):
        await make_agent(SnapshotSessionManager("s", storage=blob_storage)).initialize()


def _three_snapshots_then_latest(storage: Storage) -> Agent:
    """An agent with three immutable snapshots (2, 4, 6 messages), then 8 in latest."""
    manager = SnapshotSessionManager(
        "s",
        storage=storage,
        snapshot_trigger=lambda *, agent_data: len(agent_data.messages) <= 6,
    )
    agent = make_agent(manager, [f"answer {i}" for i in range(4)])
    for i in range(4):
        agent.state.set("turn", i)
        agent(f"question {i}")
    return agent


def test_a_deleted_latest_restores_the_newest_snapshot_and_says_so(
    blob_storage: RecordingStorage, caplog: pytest.LogCaptureFixture
) -> None:
    _three_snapshots_then_latest(blob_storage)
    manager = SnapshotSessionManager("s", storage=blob_storage)
    probe = make_agent(None)
    ids = run_blocking(manager.list_snapshot_ids(probe))
    assert len(ids) == 3
    newest = make_agent(None)
    assert run_blocking(manager.restore_snapshot(newest, snapshot_id=ids[-1]))
    run_blocking(blob_storage.delete(_agent_key("latest")))

    with caplog.at_level("WARNING", logger="perdure"):
        again = make_agent(SnapshotSessionManager("s", storage=blob_storage), ["later"])
    # not an empty agent: exactly the newest immutable snapshot
    assert len(again.messages) == 6
    assert again.messages == newest.messages
    assert again.state.get() == newest.state.get() == {"turn": 2}
    (record,) = [r for r in caplog.records if r.name.startswith("perdure")]
    assert record.levelname == "WARNING"
    assert "snapshot_latest" in record.getMessage()
    assert ids[-1] in record.getMessage()
    assert "question" not in record.getMessage()  # ids and counts, never content
    # the next save writes latest again, and a new agent comes back from it quietly
    again("go on")
    caplog.clear()
    with caplog.at_level("WARNING", logger="perdure"):
        third = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert third.messages == again.messages
    assert caplog.records == []


async def test_restore_snapshot_of_a_deleted_latest_stays_exact(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent = make_agent(None, messages=[text(0)])
    await manager.save_snapshot(agent, is_latest=False)
    target = make_agent(None, messages=[text(9)])
    assert not await manager.restore_snapshot(target)  # asked for latest: there is none
    assert target.messages == [text(9)]


async def test_a_damaged_latest_never_falls_back(blob_storage: RecordingStorage) -> None:
    agent = await _saved(blob_storage, count=4)
    await SnapshotSessionManager("s", storage=blob_storage).save_snapshot(agent, is_latest=False)
    blob = await blob_storage.read(_agent_key("latest"))
    assert blob is not None
    await blob_storage.write(_agent_key("latest"), blob[: len(blob) // 2])
    with pytest.raises(SessionCorruptedError):
        await make_agent(SnapshotSessionManager("s", storage=blob_storage)).initialize()


async def test_a_deleted_latest_with_a_damaged_newest_snapshot_raises(
    blob_storage: RecordingStorage,
) -> None:
    agent = make_agent(None, messages=[text(0)])
    manager = SnapshotSessionManager("s", storage=blob_storage)
    await manager.save_snapshot(agent, is_latest=False)
    newest = await manager.save_snapshot(agent, is_latest=False)
    key = _agent_key(f"snapshots/{newest}")
    blob = await blob_storage.read(key)
    assert blob is not None
    await blob_storage.write(key, blob[:-7])
    with pytest.raises(SessionCorruptedError):
        await make_agent(SnapshotSessionManager("s", storage=blob_storage)).initialize()


async def test_a_damaged_or_missing_chunk_is_corruption(blob_storage: RecordingStorage) -> None:
    await _saved(blob_storage)
    chunks = await blob_storage.list(_agent_key("chunks/"))
    blob = await blob_storage.read(chunks[0])
    assert blob is not None
    await blob_storage.write(chunks[0], blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(SessionCorruptedError, match="sha256"):
        await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(make_agent(None))
    await blob_storage.delete(chunks[0])
    with pytest.raises(SessionCorruptedError, match="missing"):
        await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(make_agent(None))


async def test_a_collection_deletes_nothing_when_a_manifest_is_damaged(
    blob_storage: RecordingStorage,
) -> None:
    agent = await _saved(blob_storage)
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agent.messages[:] = agent.messages[700:]
    await manager.save_snapshot(agent, is_latest=False)  # garbage-free, but...
    await blob_storage.write(_agent_key("latest"), b"perdure-snapshot/1 crc32=00000000\n{}")
    chunks = await blob_storage.list(_agent_key("chunks/"))
    with pytest.raises(SessionCorruptedError):
        await manager.collect_garbage(agent)
    assert await blob_storage.list(_agent_key("chunks/")) == chunks


async def test_a_manifest_of_an_unknown_version_is_a_snapshot_error(
    blob_storage: RecordingStorage,
) -> None:
    await _saved(blob_storage, count=3)
    blob = await blob_storage.read(_agent_key("latest"))
    assert blob is not None
    for known in (b"perdure-snapshot/1", b"perdure-snapshot/2"):
        blob = blob.replace(known, b"perdure-snapshot/9", 1)
    await blob_storage.write(_agent_key("latest"), blob)
    with pytest.raises(SnapshotError, match="perdure-snapshot/9") as info:
        await SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(make_agent(None))
    assert info.value.code == "snapshot_error"


async def test_a_snapshot_of_another_schema_is_a_snapshot_error(
    blob_storage: RecordingStorage,
) -> None:
    agent = make_agent(None, messages=[text(0)])
    manager = SnapshotSessionManager("s", storage=blob_storage)
    captured = agent.take_snapshot(preset="session", exclude=["messages"])
    captured.schema_version = "2.0"
    from perdure.snapshots.format import encode_json, manifest_blob

    blob = manifest_blob(
        {
            "schema_version": "2.0",
            "scope": "agent",
            "created_at": captured.created_at,
            "app_data": {},
        },
        fields_json=encode_json(captured.data, "fields"),
        count=0,
        skip=0,
        parts=[],
        chain_ref=None,
        inline=[],
    )
    await blob_storage.write(_agent_key("latest"), blob)
    with pytest.raises(SnapshotError, match="schema_version"):
        await manager.restore_snapshot(make_agent(None))


async def test_an_unserializable_state_is_a_snapshot_error_and_nothing_is_written(
    blob_storage: RecordingStorage,
) -> None:
    agent = make_agent(None, messages=[text(0)])
    agent.model_state["handle"] = object()
    manager = SnapshotSessionManager("s", storage=blob_storage)
    with pytest.raises(SnapshotError):
        await manager.save_snapshot(agent, is_latest=True)
    assert blob_storage.writes == []


# ---------------------------------------------------------- loops, threads


async def test_usable_from_other_threads_and_loops(blob_storage: RecordingStorage) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    agents = [make_agent(None, agent_id=f"a{i}", messages=[text(i)]) for i in range(4)]
    errors: list[BaseException] = []

    def work(agent: Agent) -> None:
        try:
            for _ in range(5):
                agent.messages.append(text(len(agent.messages)))  # type: ignore[arg-type]
                asyncio.run(manager.save_snapshot(agent, is_latest=True))
            asyncio.run(manager.save_snapshot(agent, is_latest=False))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(agent,)) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for agent in agents:
        restored = make_agent(None, agent_id=agent.agent_id)
        assert await manager.restore_snapshot(restored)
        assert restored.messages == agent.messages
        assert len(await manager.list_snapshot_ids(agent)) == 1


def test_agent_state_object_survives(blob_storage: RecordingStorage) -> None:
    state = AgentState({"a": 1})
    agent = make_agent(SnapshotSessionManager("s", storage=blob_storage), ["x"], state=state)
    agent("go")
    again = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert again.state.get() == {"a": 1}


def test_two_live_agents_on_one_manager_never_reload_each_other(
    blob_storage: RecordingStorage,
) -> None:
    manager = SnapshotSessionManager("s", storage=blob_storage)
    first = make_agent(manager, ["a1", "a2"])
    first("q1")
    second = make_agent(manager, ["b1"])  # restored from first's latest
    assert second.messages == first.messages
    second("q2")
    first("q3")  # first's in-memory history is kept: last writer wins
    assert [m["content"][0]["text"] for m in first.messages] == ["q1", "a1", "q3", "a2"]
    restored = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert restored.messages == first.messages


def test_marker_shaped_content_round_trips_unchanged(blob_storage: RecordingStorage) -> None:
    # Content is data (SPEC §7.1): shaped like perdure's markers, it comes back as it was.
    shaped = {
        "bytes_like": {"__bytes_encoded__": True, "data": "aGk="},
        "ref": {"__attachment__": "ab" * 32, "size": 3},
        "escape_like": {"__perdure_dict__": [["a", 1]]},
    }
    manager = SnapshotSessionManager("s", storage=blob_storage, snapshot_trigger=lambda **_: True)
    agent = make_agent(manager, ["ok"], state={"shaped": shaped})
    agent.model_state["shaped"] = shaped
    agent([{"text": "look"}, {"json": shaped}])  # type: ignore[list-item]
    again = make_agent(SnapshotSessionManager("s", storage=blob_storage))
    assert again.messages == agent.messages
    assert again.messages[0]["content"][1] == {"json": shaped}
    assert again.state.get("shaped") == shaped
    assert again.model_state == {"shaped": shaped}
    ids = run_blocking(manager.list_snapshot_ids(agent))
    immutable = make_agent(SnapshotSessionManager("other", storage=blob_storage))
    fresh = SnapshotSessionManager("s", storage=blob_storage)
    assert run_blocking(fresh.restore_snapshot(immutable, snapshot_id=ids[-1]))
    assert immutable.messages == agent.messages


def test_an_unchanged_agent_is_saved_again_after_the_session_was_deleted(
    blob_storage: RecordingStorage,
) -> None:
    """Skipping an unchanged save never skips one whose latest is gone."""
    manager = SnapshotSessionManager("s", storage=blob_storage, save_latest_on="message")
    agent = make_agent(manager, ["answer"])
    agent("question")
    asyncio.run(manager.save_snapshot(agent, is_latest=True))  # unchanged: nothing written
    assert blob_storage.manifest_writes() == ["default/latest"] * 2
    asyncio.run(manager.delete_session())
    asyncio.run(manager.save_snapshot(agent, is_latest=True))
    restored = make_agent(None)
    assert asyncio.run(SnapshotSessionManager("s", storage=blob_storage).restore_snapshot(restored))
    assert len(restored.messages) == 2
