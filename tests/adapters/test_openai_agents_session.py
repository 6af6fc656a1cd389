"""PerdureSession: the OpenAI Agents SDK's Session protocol on every perdure store.

Its answers are compared call by call with the SDK's own ``SQLiteSession``; a real
``Runner.run`` (with a local fake model) stores and resumes a conversation through it;
two processes write one session; damage is a typed error.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from oa_support import STORE_KINDS, import_agents, items, opened, store_url

agents = import_agents()

from agents import Agent, Runner, function_tool  # noqa: E402
from agents.agent_output import AgentOutputSchemaBase  # noqa: E402
from agents.handoffs import Handoff  # noqa: E402
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent  # noqa: E402
from agents.memory import Session, SessionSettings, SQLiteSession  # noqa: E402
from agents.model_settings import ModelSettings  # noqa: E402
from agents.models.interface import Model, ModelTracing  # noqa: E402
from agents.run import RunConfig  # noqa: E402
from agents.tool import Tool  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from perdure import Agent as PerdureAgent  # noqa: E402
from perdure.adapters.openai_agents import PerdureSession  # noqa: E402
from perdure.errors import (  # noqa: E402
    SessionCorruptedError,
    SessionLockedError,
    SessionMismatchError,
)
from perdure.maintenance import repair_store, verify_store  # noqa: E402
from perdure.models import ScriptedModel  # noqa: E402
from perdure.session import Session as PerdureStoreSession  # noqa: E402
from perdure.session import SessionStore, open_store  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(params=STORE_KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(str(request.param), tmp_path, request)


@pytest.fixture
def store(url: str, request: pytest.FixtureRequest) -> SessionStore:
    return opened(url, request)


def test_it_is_a_session_of_the_sdk(store: SessionStore) -> None:
    session = PerdureSession("s", store)
    assert isinstance(session, Session)
    assert session.session_settings == SessionSettings()


# --------------------------------------------------------------- the protocol


async def test_limit_pop_and_clear_follow_the_protocol(store: SessionStore) -> None:
    session = PerdureSession("conv", store)
    assert await session.get_items() == []
    assert await session.get_items(0) == []
    assert await session.pop_item() is None
    stream = items()
    first = list(islice(stream, 7))
    await session.add_items(first)
    more = list(islice(stream, 5))
    await session.add_items(more)
    every = first + more
    assert await session.get_items() == every
    assert await session.get_items(3) == every[-3:]  # the last N, oldest first
    assert await session.get_items(1) == every[-1:]
    assert await session.get_items(100) == every
    assert await session.get_items(0) == []
    assert await session.get_items(-1) == every  # SQLite's LIMIT -1: no limit
    assert await session.pop_item() == every[-1]
    assert await session.get_items() == every[:-1]
    assert await session.pop_item() == every[-2]
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.add_items(every[:2])
    assert await session.get_items() == every[:2]


async def test_session_settings_give_the_default_limit(store: SessionStore) -> None:
    session = PerdureSession("conv", store, session_settings={"limit": 2})
    assert isinstance(session.session_settings, SessionSettings)
    batch = list(islice(items(), 5))
    await session.add_items(batch)
    assert await session.get_items() == batch[-2:]
    assert await session.get_items(4) == batch[-4:]  # an explicit limit wins


async def test_a_limited_read_reads_only_the_last_items(store: SessionStore) -> None:
    session = PerdureSession("conv", store)
    await session.add_items(list(islice(items(), 10)))
    offsets: list[int] = []
    real = store.get

    async def spying(session_id: str, *, offset: int = 0) -> Any:
        offsets.append(offset)
        return await real(session_id, offset=offset)

    store.get = spying  # type: ignore[method-assign]
    try:
        assert len(await session.get_items(3)) == 3
    finally:
        del store.get  # type: ignore[method-assign]
    assert offsets[-1] == 7  # the metadata first, then only the last three
    assert 0 not in offsets


async def test_items_round_trip_exactly_and_are_copied(store: SessionStore) -> None:
    session = PerdureSession("conv", store)
    batch = list(islice(items(), 14))
    mine = copy.deepcopy(batch)
    await session.add_items(mine)
    mine[0]["content"] = "changed after adding"
    back = await session.get_items()
    assert back == batch
    assert json.dumps(back, sort_keys=True) == json.dumps(batch, sort_keys=True)
    # Read by another instance over the same store: equal too.
    assert await PerdureSession("conv", store).get_items() == batch


async def test_add_of_many_items_is_one_commit(store: SessionStore) -> None:
    session = PerdureSession("conv", store)
    await session.add_items(list(islice(items(), 2)))
    commits: list[int] = []
    real = store.commit

    async def counting(session_id: str, messages: Any, **kwargs: Any) -> Any:
        commits.append(len(messages))
        return await real(session_id, messages, **kwargs)

    store.commit = counting  # type: ignore[method-assign]
    try:
        await session.add_items(list(islice(items(), 9)))
    finally:
        del store.commit  # type: ignore[method-assign]
    assert commits == [11]  # one commit, of the whole history as the store sees it
    assert len(await session.get_items()) == 11


async def test_bad_items_are_refused_before_anything_is_stored(store: SessionStore) -> None:
    session = PerdureSession("conv", store)
    await session.add_items([{"role": "user", "content": "kept"}])
    with pytest.raises(TypeError, match=r"items\[1\]"):
        await session.add_items([{"role": "user", "content": "a"}, "not an item"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"items\[0\] cannot be stored as JSON"):
        await session.add_items([{"role": "user", "content": b"bytes"}])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        await session.add_items([{"role": "user", "content": float("nan")}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="items must be a list"):
        await session.add_items({"role": "user", "content": "x"})  # type: ignore[arg-type]
    assert await session.get_items() == [{"role": "user", "content": "kept"}]


def test_bad_arguments_name_themselves(store: SessionStore) -> None:
    with pytest.raises(ValueError):
        PerdureSession("a/b", store)
    with pytest.raises(TypeError, match="store"):
        PerdureSession("s", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lock_timeout"):
        PerdureSession("s", store, lock_timeout=-1)


async def _same_answers(seed: int, perdure: PerdureSession, sdk: SQLiteSession) -> None:
    rng = random.Random(seed)
    stream = items()
    for step in range(45):
        op = rng.choice(["add", "add", "get", "get", "pop", "clear"])
        where = f"seed {seed} step {step} {op}"
        if op == "add":
            batch = list(islice(stream, rng.choice([0, 1, 2, 5])))
            assert await perdure.add_items(copy.deepcopy(batch)) == await sdk.add_items(
                copy.deepcopy(batch)
            ), where
        elif op == "get":
            limit = rng.choice([None, 0, 1, 2, 3, 10, -1])
            assert await perdure.get_items(limit) == await sdk.get_items(limit), where
        elif op == "pop":
            assert await perdure.pop_item() == await sdk.pop_item(), where
        else:
            await perdure.clear_session()
            await sdk.clear_session()
    assert await perdure.get_items() == await sdk.get_items()


@pytest.mark.parametrize("seed", [1, 2])
async def test_answers_as_the_sdks_sqlite_session_for_any_sequence(
    store: SessionStore, seed: int
) -> None:
    sdk = SQLiteSession("conv")
    try:
        await _same_answers(seed, PerdureSession("conv", store), sdk)
    finally:
        sdk.close()


async def test_sessions_are_apart(store: SessionStore) -> None:
    a, b = PerdureSession("a", store), PerdureSession("b", store)
    await a.add_items([{"role": "user", "content": "to a"}])
    await b.add_items([{"role": "user", "content": "to b"}])
    await a.clear_session()
    assert await a.get_items() == []
    assert await b.get_items() == [{"role": "user", "content": "to b"}]


@pytest.mark.parametrize("kind", ["file", "sqlite", "memory"])
async def test_an_expired_session_reads_empty_and_starts_afresh(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    store = opened(url + "?ttl=0.3", request)
    session = PerdureSession("conv", store)
    await session.add_items([{"role": "user", "content": "old"}])
    await asyncio.sleep(0.5)
    assert await session.get_items() == []
    assert await session.get_items(1) == []
    assert await session.pop_item() is None
    await session.add_items([{"role": "user", "content": "new"}])
    assert await PerdureSession("conv", store).get_items() == [{"role": "user", "content": "new"}]


async def test_a_cancelled_add_still_stores_all_its_items(tmp_path: Path) -> None:
    session = PerdureSession("conv", f"file:{tmp_path / 'store'}")
    try:
        batch = list(islice(items(), 5))
        task = asyncio.create_task(session.add_items(batch))
        await asyncio.sleep(0)  # it has started its commit
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await session.get_items() == batch  # the caller knows the outcome: all of it
    finally:
        session.close()


# ------------------------------------------------------------ writers and locks


async def test_a_held_lock_is_waited_for_then_refused(store: SessionStore) -> None:
    session = PerdureSession("conv", store, lock_timeout=0)
    await session.add_items([{"role": "user", "content": "one"}])
    async with store.writer_lock("conv"):
        with pytest.raises(SessionLockedError):
            await session.add_items([{"role": "user", "content": "refused"}])
        with pytest.raises(SessionLockedError):
            await session.pop_item()
        with pytest.raises(SessionLockedError):
            await session.clear_session()
    assert await session.get_items() == [{"role": "user", "content": "one"}]

    patient = PerdureSession("conv", store, lock_timeout=5)
    released = asyncio.Event()

    async def hold_briefly() -> None:
        async with store.writer_lock("conv"):
            released.set()
            await asyncio.sleep(0.2)

    holder = asyncio.create_task(hold_briefly())
    await released.wait()
    await patient.add_items([{"role": "user", "content": "two"}])  # retried, then in
    await holder
    assert [i["content"] for i in await patient.get_items()] == ["one", "two"]  # type: ignore[typeddict-item]


async def test_two_sessions_see_each_others_writes(store: SessionStore) -> None:
    a, b = PerdureSession("conv", store), PerdureSession("conv", store)
    stream = items()
    batch = list(islice(stream, 12))
    await a.add_items(batch[:3])
    await b.add_items(batch[3:5])  # a's view is stale now
    await a.add_items(batch[5:6])  # refused as stale by the store, read again, appended
    assert await b.get_items() == batch[:6]
    assert await b.pop_item() == batch[5]
    assert await a.get_items(2) == batch[3:5]  # a knew 6 items; there are 5
    await b.clear_session()
    assert await a.get_items(3) == []
    await a.add_items(batch[6:8])
    await b.add_items(batch[8:9])
    assert await a.get_items(10) == batch[6:9]
    assert await a.get_items() == await b.get_items() == batch[6:9]


async def test_concurrent_adds_in_one_process_lose_nothing(store: SessionStore) -> None:
    sessions = [PerdureSession("conv", store) for _ in range(3)]

    async def writer(n: int, session: PerdureSession) -> None:
        for k in range(8):
            await session.add_items([{"role": "user", "content": f"{n}:{k}"}])

    await asyncio.gather(*(writer(n, s) for n, s in enumerate(sessions)))
    got = [i["content"] for i in await sessions[0].get_items()]  # type: ignore[typeddict-item]
    assert sorted(got) == sorted(f"{n}:{k}" for n in range(3) for k in range(8))
    for n in range(3):  # each writer's items in its order
        mine = [c for c in got if c.startswith(f"{n}:")]
        assert mine == [f"{n}:{k}" for k in range(8)]


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from perdure.adapters.openai_agents import PerdureSession

    async def main(url, tag, count):
        session = PerdureSession("shared", url, lock_timeout=30)
        try:
            for k in range(count):
                await session.add_items([{"role": "user", "content": f"{tag}:{k}"}])
        finally:
            session.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "redis"])
def test_two_processes_on_one_session_lose_no_item(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    count = 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, tag, str(count)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    store = opened(url, request)
    got = [i["content"] for i in asyncio.run(PerdureSession("shared", store).get_items())]  # type: ignore[typeddict-item]
    assert len(got) == 2 * count
    for tag in ("a", "b"):
        assert [c for c in got if c.startswith(tag)] == [f"{tag}:{k}" for k in range(count)]
    assert asyncio.run(verify_store(store)).clean


# ---------------------------------------------------------------- end to end


def _message(text: str, n: int) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{n}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class FakeModel(Model):
    """Canned responses, one per call; records the input of every call."""

    def __init__(self, outputs: list[list[Any]]) -> None:
        self.outputs = outputs
        self.inputs: list[list[TResponseInputItem]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        assert isinstance(input, list)
        self.inputs.append(copy.deepcopy(input))
        return ModelResponse(output=self.outputs.pop(0), usage=Usage(), response_id=None)

    async def stream_response(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError
        yield  # pragma: no cover


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_runner_stores_and_resumes_a_conversation(url: str) -> None:
    model = FakeModel(
        [
            [
                ResponseFunctionToolCall(
                    id="fc_1",
                    type="function_call",
                    call_id="call_1",
                    name="add",
                    arguments='{"a": 2, "b": 3}',
                    status="completed",
                )
            ],
            [_message("2 + 3 = 5", 2)],
            [_message("You asked for 2 + 3; it was 5.", 3)],
        ]
    )
    agent = Agent(name="calc", instructions="Add numbers.", model=model, tools=[add])
    config = RunConfig(tracing_disabled=True)
    # memory: keeps nothing past its store object: share that one.
    shared = open_store(url) if url == "memory:" else None
    session = PerdureSession("user-42", shared or url)
    try:
        first = await Runner.run(agent, "What is 2 + 3?", session=session, run_config=config)
        assert first.final_output == "2 + 3 = 5"
    finally:
        session.close()

    # A new process would open the session afresh: a new object, a new store.
    resumed = PerdureSession("user-42", shared or url)
    try:
        stored = await resumed.get_items()
        assert [i.get("type", "message") for i in stored] == [
            "message",
            "function_call",
            "function_call_output",
            "message",
        ]
        assert stored[0] == {"role": "user", "content": "What is 2 + 3?"}
        assert stored[1]["call_id"] == "call_1"  # type: ignore[typeddict-item]
        assert stored[1]["arguments"] == '{"a": 2, "b": 3}'  # type: ignore[typeddict-item]
        assert stored[2]["output"] == "5"  # type: ignore[typeddict-item]

        second = await Runner.run(agent, "What did I ask?", session=resumed, run_config=config)
        assert second.final_output == "You asked for 2 + 3; it was 5."
        # The model saw the whole stored conversation, then the new question.
        assert model.inputs[2][: len(stored)] == stored
        assert model.inputs[2][len(stored)] == {"role": "user", "content": "What did I ask?"}
        after = await resumed.get_items()
        assert after[: len(stored)] == stored
        assert len(after) == len(stored) + 2
        report = await verify_store(resumed.store)
        assert report.clean, report.damage
        assert report.sessions_checked == 1
    finally:
        resumed.close()


# The SDK's run_sync keeps one event loop across calls but calls shutdown_asyncgens
# after each: an async generator first run by a later call (a store's writer-lock
# context manager) makes Python warn, then runs normally.
@pytest.mark.filterwarnings(
    "ignore:asynchronous generator .* was scheduled after loop.shutdown_asyncgens:ResourceWarning"
)
def test_runner_run_sync_keeps_the_conversation_across_calls(url: str) -> None:
    """``Runner.run_sync`` drives the run on the thread's default loop, outside any test loop."""
    model = FakeModel([[_message("first", 1)], [_message("second", 2)]])
    agent = Agent(name="plain", model=model)
    config = RunConfig(tracing_disabled=True)
    loop = asyncio.new_event_loop()  # the default loop run_sync finds, and keeps open
    asyncio.set_event_loop(loop)
    store = open_store(url)
    session = PerdureSession("sync", store)
    try:
        first = Runner.run_sync(agent, "one", session=session, run_config=config)
        assert first.final_output == "first"
        second = Runner.run_sync(agent, "two", session=session, run_config=config)
        assert second.final_output == "second"
        assert model.inputs[1][0] == {"role": "user", "content": "one"}
        stored = loop.run_until_complete(session.get_items())
        assert len(stored) == 4
        assert stored[2] == {"role": "user", "content": "two"}
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
        asyncio.set_event_loop(None)
        loop.close()


# ------------------------------------------------------------------- damage


async def test_a_damaged_journal_is_an_error_never_an_empty_list(tmp_path: Path) -> None:
    url = f"file:{tmp_path / 'store'}"
    session = PerdureSession("conv", url)
    batch = list(islice(items(), 6))
    await session.add_items(batch[:3])
    await session.add_items(batch[3:])
    session.close()
    journal = tmp_path / "store" / "sessions" / "conv" / "journal.jsonl"
    data = bytearray(journal.read_bytes())
    at = data.index(b"question 1")
    data[at] ^= 0x01  # one bit, in the first record (not a torn tail)
    journal.write_bytes(bytes(data))

    damaged = PerdureSession("conv", url)
    try:
        with pytest.raises(SessionCorruptedError) as caught:
            await damaged.get_items()
        assert caught.value.code == "session_store_corrupted"
        with pytest.raises(SessionCorruptedError):
            await damaged.pop_item()
        report = await verify_store(damaged.store)
        assert report.damaged_sessions == ("conv",)
    finally:
        damaged.close()


async def test_repair_heals_what_the_adapter_stored(tmp_path: Path) -> None:
    root = tmp_path / "store"
    session = PerdureSession("conv", f"file:{root}")
    for n in range(4):
        await session.add_items([{"role": "user", "content": f"item {n}"}])
    session.close()
    journal = root / "sessions" / "conv" / "journal.jsonl"
    data = bytearray(journal.read_bytes())
    data[data.index(b"item 1")] ^= 0x01
    journal.write_bytes(bytes(data))

    report = await repair_store(root, dry_run=False)
    assert report.quarantined == 1
    healed = PerdureSession("conv", f"file:{root}")
    try:
        # The bad record went to quarantine; every other item reads back as stored.
        assert [i["content"] for i in await healed.get_items()] == [  # type: ignore[typeddict-item]
            "item 0",
            "item 2",
            "item 3",
        ]
        await healed.add_items([{"role": "user", "content": "after"}])
        assert len(await healed.get_items()) == 4
        assert (await verify_store(healed.store)).clean
    finally:
        healed.close()


async def test_a_changed_sqlite_row_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    session = PerdureSession("conv", f"sqlite:{path}")
    await session.add_items(list(islice(items(), 4)))
    session.close()
    with sqlite3.connect(path) as conn:
        key, body = conn.execute(
            "SELECT key, body FROM perdure_messages ORDER BY key LIMIT 1"
        ).fetchone()
        conn.execute(
            "UPDATE perdure_messages SET body = ? WHERE key = ?",
            (body.replace("question 1", "question 9"), key),
        )
    damaged = PerdureSession("conv", f"sqlite:{path}")
    try:
        with pytest.raises(SessionCorruptedError):
            await damaged.get_items()
    finally:
        damaged.close()


async def test_a_session_of_a_perdure_agent_is_not_read_as_items(tmp_path: Path) -> None:
    store = open_store(f"file:{tmp_path / 'store'}")
    agent = PerdureAgent(
        model=ScriptedModel(["hello"]),
        session_manager=PerdureStoreSession(store, "conv"),
    )
    await agent.invoke_async("hi")
    with pytest.raises(SessionMismatchError) as caught:
        await PerdureSession("conv", store).get_items()
    assert caught.value.details["index"] == 0


@pytest.mark.parametrize("read_first", [False, True])
async def test_a_session_of_a_perdure_agent_is_neither_added_to_nor_wiped(
    tmp_path: Path, read_first: bool
) -> None:
    store = open_store(f"sqlite:{tmp_path / 's.db'}")
    agent = PerdureAgent(
        model=ScriptedModel(["Noted."]),
        session_manager=PerdureStoreSession(store, "conv"),
    )
    await agent.invoke_async("I prefer dark mode.")
    before = (await store.get("conv")).messages
    session = PerdureSession("conv", store)
    if read_first:  # a failed read must not let a later write through unchecked
        with pytest.raises(SessionMismatchError):
            await session.get_items()
    with pytest.raises(SessionMismatchError) as caught:
        await session.add_items([{"role": "user", "content": "hello"}])
    assert caught.value.details["index"] == 1  # the newest message, checked
    with pytest.raises(SessionMismatchError):
        await session.clear_session()
    with pytest.raises(SessionMismatchError):
        await session.pop_item()
    assert (await store.get("conv")).messages == before
    resumed = await PerdureAgent.create(
        model=ScriptedModel([]), session_manager=PerdureStoreSession.resume(store, "conv")
    )
    assert resumed.messages == before


async def test_items_never_stand_after_a_perdure_agents_message(tmp_path: Path) -> None:
    # Another writer appends a message of its own to an items session: the next add,
    # whose known tail is now stale, reads the session again and finds it at the end.
    store = open_store(f"file:{tmp_path / 'store'}")
    session = PerdureSession("conv", store)
    await session.add_items([{"role": "user", "content": "hi"}])
    record = await store.get("conv")
    other = {"role": "assistant", "content": [{"text": "an agent's answer"}]}
    await store.commit("conv", [*record.messages, other], expected_tail=record.tail)
    stored = (await store.get("conv")).messages
    with pytest.raises(SessionMismatchError) as caught:
        await session.add_items([{"role": "user", "content": "more"}])
    assert caught.value.details["index"] == 1
    assert (await store.get("conv")).messages == stored
