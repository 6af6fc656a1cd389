"""Session: persistence through the agent's hooks, on every store (SPEC §7)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

from helpers import assert_model_valid, tool_call
from perdure import Agent, SlidingWindowConversationManager, ToolContext, tool
from perdure.errors import SessionConflictError, SessionNotFoundError, TurnRunningError
from perdure.models import ScriptedModel
from perdure.models.stream import ModelResponse
from perdure.session import Session, SessionStore, read_history_page
from perdure.types import Message

RUNS: list[str] = []


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    RUNS.append(key)
    return key.upper()


@tool
def ask(question: str, context: ToolContext) -> str:
    """Ask the human.

    Args:
        question: what to ask.
    """
    return f"answer={context.interrupt('ask', question)}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    RUNS.clear()


def agent_on(session: Session, script: list[Any], **kwargs: Any) -> Agent:
    return Agent(
        model=ScriptedModel(script), tools=[lookup, ask], session_manager=session, **kwargs
    )


def test_new_session_persists_every_message_and_resumes(store: SessionStore) -> None:
    session = Session(store)
    agent = agent_on(session, [tool_call("t1", "lookup", key="a"), "A it is"])
    agent("find a")
    stored = asyncio.run(store.get(session.session_id))
    assert stored.messages == agent.messages
    resumed = agent_on(Session.resume(store, session.session_id), ["more"])
    assert resumed.messages == agent.messages
    resumed("and then?")
    assert asyncio.run(store.get(session.session_id)).messages == resumed.messages
    assert len(resumed.messages) == 6


def test_resume_of_unknown_session_is_session_not_found(store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError) as info:
        Session.resume(store, "never-created")
    assert info.value.code == "session_not_found"


def test_open_or_create_by_id(store: SessionStore) -> None:
    agent_on(Session(store, "mine"), ["hi"])("hello")
    again = agent_on(Session(store, "mine"), [])
    assert len(again.messages) == 2


def test_restore_order_state_internal_state_manager_offset_messages(store: SessionStore) -> None:
    manager = SlidingWindowConversationManager(window_size=4)
    session = Session(store, "s")
    agent = agent_on(session, ["a1", "a2", "a3"], conversation_manager=manager, state={"step": 1})
    agent.model_state["cursor"] = "c1"
    for prompt in ["q1", "q2", "q3"]:
        agent(prompt)
    assert manager.removed_message_count == 2
    assert len(asyncio.run(store.get("s")).messages) == 6  # the store keeps everything
    fresh_manager = SlidingWindowConversationManager(window_size=4)
    resumed = agent_on(Session.resume(store, "s"), [], conversation_manager=fresh_manager)
    assert fresh_manager.removed_message_count == 2
    assert resumed.messages == agent.messages  # restored from the offset
    assert resumed.state.get() == {"step": 1}
    assert resumed.model_state == {"cursor": "c1"}


def test_model_state_changed_in_place_is_persisted_by_each_turn(store: SessionStore) -> None:
    # The session compares the model state with a copy of what it stored: a change
    # deep inside it, in place, is still a change.
    agent = agent_on(Session(store, "s"), ["a1", "a2", "a3"])
    agent.model_state["cursor"] = {"pages": [1]}
    agent("q1")
    for page in (2, 3):
        agent.model_state["cursor"]["pages"].append(page)
        agent("q")
        resumed = agent_on(Session.resume(store, "s"), [])
        assert resumed.model_state == {"cursor": {"pages": list(range(1, page + 1))}}


def test_state_changed_between_turns_needs_save(store: SessionStore) -> None:
    session = Session(store, "s")
    agent = agent_on(session, ["ok"])
    agent("hi")
    agent.state.set("preference", "dark mode")
    asyncio.run(session.save())
    resumed = agent_on(Session.resume(store, "s"), [])
    assert resumed.state.get("preference") == "dark mode"


def test_state_sync_is_skipped_when_nothing_changed(store: SessionStore) -> None:
    writes: list[bool] = []
    original = store.commit

    async def counting(*args: Any, **kwargs: Any) -> Any:
        writes.append(kwargs.get("agent_state") is not None)
        return await original(*args, **kwargs)

    store.commit = counting  # type: ignore[method-assign]
    session = Session(store, "s")
    agent = agent_on(session, ["a", "b"])
    agent("one")
    assert writes == [False, False]  # two messages, state untouched
    agent.state.set("k", 1)
    agent("two")
    assert writes[2:] == [True, False]  # the changed state rides on the next commit only
    asyncio.run(session.save())
    assert len(writes) == 4  # nothing changed: save wrote nothing


def test_pending_interrupts_survive_a_restart(store: SessionStore) -> None:
    agent = agent_on(Session(store, "s"), [tool_call("t1", "ask", question="budget?")])
    result = agent("help me")
    assert result.stop_reason == "interrupt"
    interrupt = result.interrupts[0]
    resumed = agent_on(Session.resume(store, "s"), ["thanks"])
    assert [i.id for i in resumed.interrupt_state.pending] == [interrupt.id]
    done = resumed([{"interruptResponse": {"interruptId": interrupt.id, "response": "$50"}}])
    assert done.stop_reason == "end_turn"
    assert resumed.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "answer=$50"}]
    assert not agent_on(Session.resume(store, "s"), []).interrupt_state.activated


def test_checkpoint_resume_across_restart_runs_pending_tools_once(store: SessionStore) -> None:
    agent = agent_on(Session(store, "s"), [tool_call("t1", "lookup", key="x")], checkpointing=True)
    paused = agent("go")
    assert paused.checkpoint is not None
    wire = paused.checkpoint.to_dict()
    resumed = agent_on(Session.resume(store, "s"), ["done"], checkpointing=True)
    assert resumed.messages[-1]["content"][0]["toolUse"]["toolUseId"] == "t1"  # left pending
    step = resumed([{"checkpointResume": {"checkpoint": wire}}])
    assert step.checkpoint is not None
    assert step.checkpoint.position == "after_tools"
    again = agent_on(Session.resume(store, "s"), ["done"], checkpointing=True)
    final = again([{"checkpointResume": {"checkpoint": step.checkpoint.to_dict()}}])
    assert str(final) == "done"
    assert RUNS == ["x"]
    assert_model_valid(asyncio.run(store.get("s")).messages)


def broken_history() -> list[Message]:
    return [
        {"role": "user", "content": [{"text": "start"}]},
        {
            "role": "assistant",
            "content": [
                {"toolUse": {"toolUseId": "dangling", "name": "lookup", "input": {"key": "a"}}}
            ],
        },
        {"role": "user", "content": [{"text": "crashed and came back"}]},
        {"role": "assistant", "content": [{"text": "hello again"}]},
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "orphan",
                        "status": "success",
                        "content": [{"text": "?"}],
                    }
                },
                {"text": "next"},
            ],
        },
    ]


def test_broken_tool_pairs_are_repaired_and_written_back_once(store: SessionStore) -> None:
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", broken_history()))
    first = agent_on(Session.resume(store, "s"), [])
    assert_model_valid(first.messages)
    dangling_results = [
        b["toolResult"] for m in first.messages for b in m["content"] if "toolResult" in b
    ]
    assert [r["toolUseId"] for r in dangling_results] == ["dangling"]
    assert dangling_results[0]["status"] == "error"
    stored = asyncio.run(store.get("s"))
    assert stored.messages == first.messages  # written back
    tail = stored.tail
    agent_on(Session.resume(store, "s"), [])
    assert asyncio.run(store.get("s")).tail == tail  # not repaired (rewritten) again
    resumed = agent_on(Session.resume(store, "s"), ["fine"])
    assert str(resumed("continue")) == "fine"  # never stays unusable


def test_stale_session_gets_conflict_and_journal_never_interleaves(store: SessionStore) -> None:
    first = agent_on(Session(store, "s"), ["a", "never"])
    first("one")
    second = agent_on(Session.resume(store, "s"), ["b"])
    second("two")
    with pytest.raises(SessionConflictError) as info:
        first("stale writer")
    assert info.value.code == "session_conflict"
    stored = asyncio.run(store.get("s")).messages
    assert [m["content"][0]["text"] for m in stored] == ["one", "a", "two", "b"]


def test_redact_latest_message_is_persisted(store: SessionStore) -> None:
    session = Session(store, "s")
    agent = agent_on(session, ["my card is 4111-1111"])
    agent("hi")
    redacted: Message = {"role": "assistant", "content": [{"text": "[REDACTED]"}]}
    asyncio.run(session.redact_latest_message(redacted))
    assert agent.messages[-1] == redacted
    assert asyncio.run(store.get("s")).messages[-1] == redacted
    assert agent_on(Session.resume(store, "s"), []).messages[-1] == redacted


def test_bytes_round_trip_through_a_session(store: SessionStore) -> None:
    image = bytes(range(256)) * 20
    agent = agent_on(Session(store, "s"), ["nice picture"])
    agent([{"text": "look"}, {"image": {"format": "png", "source": {"bytes": image}}}])
    resumed = agent_on(Session.resume(store, "s"), [])
    assert resumed.messages[0]["content"][1]["image"]["source"]["bytes"] == image


def test_history_pages_of_live_and_dormant_sessions(store: SessionStore) -> None:
    session = Session(store, "s")
    agent = agent_on(session, [tool_call("t1", "lookup", key="a"), "done", "two"])
    agent("one")
    agent("two")
    page = asyncio.run(session.history(offset=2, limit=1))
    assert (page.offset, page.next_offset, page.total) == (1, 3, 6)
    dormant = asyncio.run(read_history_page(store, "s", offset=4, limit=50))
    assert dormant.messages == agent.messages[4:]


def test_save_during_a_turn_is_refused(store: SessionStore) -> None:
    session = Session(store, "s")
    errors: list[BaseException] = []

    @tool
    async def saver() -> str:
        """Try to save mid-turn."""
        try:
            await session.save()
        except TurnRunningError as exc:
            errors.append(exc)
        return "ok"

    agent = Agent(
        model=ScriptedModel([tool_call("t", "saver"), "end"]),
        tools=[saver],
        session_manager=session,
    )
    agent("go")
    assert len(errors) == 1


def test_store_usable_from_another_loop_while_a_turn_runs(store: SessionStore) -> None:
    started = threading.Event()
    release = threading.Event()

    @tool
    def slow() -> str:
        """Wait for the test."""
        started.set()
        release.wait(5)
        return "ok"

    agent = Agent(
        model=ScriptedModel([tool_call("t", "slow"), "end"]),
        tools=[slow],
        session_manager=Session(store, "s"),
    )
    runner = threading.Thread(target=lambda: agent("go"))
    runner.start()
    assert started.wait(5)
    listed = asyncio.run(store.list())  # sync code, its own loop, while the turn runs
    page = asyncio.run(read_history_page(store, "s", offset=0, limit=10))
    release.set()
    runner.join()
    assert [m.session_id for m in listed] == ["s"]
    assert page.total >= 2
    time.sleep(0)


async def test_session_in_an_async_app(store: SessionStore) -> None:
    session = await Session.open(store, "async-s")
    agent = Agent(model=ScriptedModel(["hi"]), session_manager=session)
    await agent.invoke_async("hello")
    resumed_session = await Session.open(store, "async-s", must_exist=True)
    resumed = Agent(model=ScriptedModel(["again"]), session_manager=resumed_session)
    assert resumed.messages == []  # inside a loop the constructor does no I/O (SPEC §7)
    await resumed.initialize()
    assert len(resumed.messages) == 2
    await resumed.invoke_async("more")
    assert [m["content"][0]["text"] for m in resumed.messages] == ["hello", "hi", "more", "again"]
    with pytest.raises(SessionNotFoundError):
        await Session.open(store, "nope", must_exist=True)


def deep(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("bad_input", "path", "why"),
    [
        ({"x": float("nan")}, "messages[1].content[1].toolUse.input.x", "nan"),
        ({"x": float("inf")}, "messages[1].content[1].toolUse.input.x", "inf"),
        ({"x": {7: "seven"}}, "messages[1].content[1].toolUse.input.x", "key 7"),
        ({"x": deep(500)}, "messages[1].content[1].toolUse.input.x", "nesting deeper than 200"),
    ],
)
def test_an_unstorable_model_answer_is_refused_before_the_history_changes(
    store: SessionStore, bad_input: dict[str, Any], path: str, why: str
) -> None:
    # SPEC §7.1: refused before it reaches the history, the path named; the agent
    # stays usable and what is stored equals what it holds.
    # As is (a ModelResponse): as a provider's parsed JSON, not deep-copied by the script.
    bad = ModelResponse(tool_call("t1", "lookup", narration="let me look", **bad_input), "tool_use")
    session = Session(store, "s")
    agent = agent_on(session, [bad, "fine, without the tool"])
    with pytest.raises(ValueError) as info:
        agent("find x")
    assert str(info.value).startswith(path), str(info.value)[:200]
    assert why in str(info.value)
    assert agent.messages == [{"role": "user", "content": [{"text": "find x"}]}]
    assert asyncio.run(store.get("s")).messages == agent.messages
    assert str(agent("try again")) == "fine, without the tool"
    assert asyncio.run(store.get("s")).messages == agent.messages
    assert len(agent.messages) == 3
    assert RUNS == []


def test_an_unstorable_tool_result_is_refused_and_the_call_closed_next_turn(
    store: SessionStore,
) -> None:
    @tool
    def measure() -> list[Any]:
        """Measure (returns content blocks, one of them unstorable)."""
        return [{"text": "ok"}, {"json": {"ratio": float("nan")}}]

    session = Session(store, "s")
    agent = Agent(
        model=ScriptedModel([tool_call("t1", "measure"), "closed"]),
        tools=[measure],
        session_manager=session,
    )
    with pytest.raises(ValueError, match=r"messages\[2\]\.content\[0\]\.toolResult"):
        agent("measure it")
    assert asyncio.run(store.get("s")).messages == agent.messages
    assert str(agent("go on")) == "closed"
    stored = asyncio.run(store.get("s")).messages
    assert stored == agent.messages
    assert_model_valid(stored)


class _SlowAck:
    """A store whose commits, once armed, land and are then acknowledged never (until
    the caller gives up): the moment a cancelled turn leaves a commit's outcome unknown."""

    def __init__(self, inner: SessionStore) -> None:
        self._inner = inner
        self.armed = False
        self.landed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit(self, session_id: str, messages: Any, **options: Any) -> Any:
        result = await self._inner.commit(session_id, messages, **options)
        if self.armed:
            self.armed = False
            self.landed.set()
            await asyncio.sleep(3600)  # stored, never acknowledged: cancelled here
        return result


async def test_a_turn_cancelled_after_its_commit_landed_leaves_the_session_usable(
    store: SessionStore,
) -> None:
    slow = _SlowAck(store)
    session = Session(slow, "cancelled")  # type: ignore[arg-type]
    agent = await Agent.create(
        model=ScriptedModel(["one", "two", "three"]), tools=[lookup], session_manager=session
    )
    await agent.invoke_async("first")
    slow.armed = True
    turn = asyncio.create_task(agent.invoke_async("second"))
    await slow.landed.wait()
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert len((await store.get("cancelled")).messages) == 3  # the user message landed
    # Before: every later turn failed with SessionConflictError ("another writer").
    result = await agent.invoke_async("third")
    assert result.stop_reason == "end_turn"
    stored = (await store.get("cancelled")).messages
    assert stored == agent.messages
    assert_model_valid(stored)
    resumed = await Agent.create(
        model=ScriptedModel([]), session_manager=Session.resume(store, "cancelled")
    )
    assert resumed.messages == agent.messages


async def test_turns_cancelled_at_any_moment_never_strand_the_agent(store: SessionStore) -> None:
    import random

    rng = random.Random(1)
    script: list[Any] = []
    for i in range(12):
        script += [tool_call(f"t{i}", "lookup", key=f"k{i}"), f"answer {i}"]
    script.append("the last answer")
    agent = await Agent.create(
        model=ScriptedModel(script), tools=[lookup], session_manager=Session(store, "racy")
    )
    for i in range(10):
        turn = asyncio.create_task(agent.invoke_async(f"q{i}"))
        await asyncio.sleep(rng.random() * 0.01)
        turn.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await turn  # any other error (a conflict) fails the test
    # A turn that runs to its end stores whatever the cancelled ones left unstored.
    await agent.invoke_async("last")
    stored = (await store.get("racy")).messages
    assert stored == agent.messages
    assert_model_valid(stored)


async def test_after_a_lost_commit_outcome_a_rewrite_never_goes_blind(store: SessionStore) -> None:
    # The outcome of a cancelled commit is unknown, so the Session knows no tail; a
    # compaction (a rewrite) before any other commit must not overwrite what another
    # writer stored meanwhile: it learns the tail first, and the check refuses.
    slow = _SlowAck(store)
    session = Session(slow, "blind")  # type: ignore[arg-type]
    agent = await Agent.create(model=ScriptedModel(["one", "summary"]), session_manager=session)
    await agent.invoke_async("first")
    slow.armed = True
    turn = asyncio.create_task(agent.invoke_async("second"))
    await slow.landed.wait()
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    record = await store.get("blind")
    elsewhere: Message = {"role": "assistant", "content": [{"text": "from elsewhere"}]}
    await store.commit("blind", [*record.messages, elsewhere], expected_tail=record.tail)
    with pytest.raises(SessionConflictError):
        await session.compact()
    assert (await store.get("blind")).messages[-1] == elsewhere
