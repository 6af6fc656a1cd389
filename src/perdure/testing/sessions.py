"""The SessionStore conformance suite (SPEC §7): every store, ours and yours, runs it.

Subclass :class:`SessionStoreSuite` in a ``Test*`` class and give it one fixture,
``store_factory``: a callable that opens your store over one test's data (each call a
new instance over the same data, as a restarted process would see it; keyword
options such as ``durability=`` are passed on when the flags below say the store
takes them)::

    class TestMyStore(SessionStoreSuite):
        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda **options: MyStore(tmp_path / "data", **options)

Set the capability flags your store has (class attributes); a test of a capability
the store lacks is skipped with the reason, never passed silently.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure.checkpoints.store import CheckpointStore
from perdure.errors import (
    SessionConflictError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.maintenance import verify_store
from perdure.session.session import read_history_page
from perdure.session.store import SessionMeta, SessionStore, SupportsHistoryPage
from perdure.testing._support import close
from perdure.testing.messages import conversation, text, tool_round, tool_use
from perdure.types import Message

__all__ = ["SessionStoreSuite"]

StoreFactory = Callable[..., SessionStore]

UNSTORABLE = [
    ({"x": float("nan")}, "messages[1].content[0].toolUse.input.x", "nan"),
    ({"x": [float("-inf")]}, "messages[1].content[0].toolUse.input.x[0]", "inf"),
    ({"x": {1: "a"}}, "messages[1].content[0].toolUse.input.x", "key 1"),
]


def nested(depth: int) -> Any:
    """A value nested ``depth`` dicts deep."""
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


# Each backend's subclass runs the same method on its own class (an "executor" to
# hypothesis): by design, as fsspec's suites do, so that health check does not apply.
_PER_BACKEND = [HealthCheck.function_scoped_fixture, HealthCheck.differing_executors]


class SessionStoreSuite:
    """The contract every :class:`~perdure.session.SessionStore` keeps (SPEC §7).

    Needs one fixture, ``store_factory`` (see the module docstring). Flags:

    Attributes:
        durable_across_reopen: a second instance from ``store_factory`` sees the data
            of the first (false for a store that lives in one object's memory, whose
            tests then use the one instance where they need "another writer").
        durability_options: the values the store's ``durability=`` option takes, to
            test each; empty when it has no such option.
        supports_history_page: the store implements ``history_page`` (a page read
            without reading the whole history); checked against the generic pager.
        supports_checkpoints: the store has a ``checkpoints`` :class:`CheckpointStore`
            (run :class:`~perdure.testing.CheckpointStoreSuite` on it too).
        supports_ttl: the store takes ``ttl=`` (seconds of inactivity, SPEC §9).
        checkpoints_outlive_ttl: the store's own checkpoints stay when its session
            expires (true but in Redis, which drops every key of a session together).

    Override :meth:`stored_message_count` to let the TTL test check that ``perdure
    gc`` (or the store itself) removed an expired session's messages from the disk
    or the database.
    """

    durable_across_reopen: ClassVar[bool] = True
    durability_options: ClassVar[tuple[str, ...]] = ()
    supports_history_page: ClassVar[bool] = False
    supports_checkpoints: ClassVar[bool] = False
    supports_ttl: ClassVar[bool] = False
    checkpoints_outlive_ttl: ClassVar[bool] = True

    def stored_message_count(self, store: SessionStore, needle: str) -> int | None:
        """How many stored messages (rows, records, list elements) contain ``needle``,
        read from the disk or the database behind the store's back; ``None`` (the
        default): the store cannot tell, and that check is skipped."""
        del store, needle
        return None

    @pytest.fixture
    def store(self, store_factory: StoreFactory) -> SessionStore:
        """The store under test: the first instance from ``store_factory``."""
        return store_factory()

    def same_data(self, store: SessionStore, store_factory: StoreFactory) -> SessionStore:
        """Another instance over the store's data (or the store itself, see the flags)."""
        return store_factory() if self.durable_across_reopen else store

    async def test_create_get_and_not_found(self, store: SessionStore) -> None:
        meta = await store.create("s1")
        assert isinstance(meta, SessionMeta)
        assert (meta.session_id, meta.message_count) == ("s1", 0)
        record = await store.get("s1")
        assert record.messages == []
        assert record.agent_state == {}
        assert record.tail
        with pytest.raises(SessionConflictError):
            await store.create("s1")
        assert (await store.create("s1", exist_ok=True)).session_id == "s1"
        with pytest.raises(SessionNotFoundError) as info:
            await store.get("missing")
        assert info.value.code == "session_not_found"
        with pytest.raises(SessionNotFoundError):
            await store.commit("missing", conversation(1))

    async def test_create_keeps_a_given_creation_time(
        self, store: SessionStore, store_factory: StoreFactory
    ) -> None:
        # A session moved from another store or framework keeps its own creation time,
        # given as an aware datetime (any offset) or as ISO text (SessionMeta's form).
        paris = datetime(2021, 3, 4, 6, 7, 8, 123456, tzinfo=timezone(timedelta(hours=1)))
        made = await store.create("moved", created_at=paris)
        assert made.created_at == "2021-03-04T05:07:08.123456Z"
        await store.create("copied", created_at="2020-01-02T03:04:05+00:00")
        await store.create("now")
        async with store.writer_lock("moved"):
            await store.commit("moved", conversation(2))
        reopened = self.same_data(store, store_factory)
        listed = {meta.session_id: meta.created_at for meta in await reopened.list()}
        assert listed["moved"] == "2021-03-04T05:07:08.123456Z"
        assert listed["copied"] == "2020-01-02T03:04:05.000000Z"
        assert listed["now"] > listed["moved"]  # stamped now, as without the argument
        record = await reopened.get("moved")
        assert record.meta.created_at == "2021-03-04T05:07:08.123456Z"
        assert record.meta.updated_at > record.meta.created_at
        assert record.messages == conversation(2)
        # An existing session keeps its own time.
        again = await store.create("moved", exist_ok=True, created_at="1999-01-01T00:00:00Z")
        assert again.created_at == "2021-03-04T05:07:08.123456Z"
        if reopened is not store:
            close(reopened)

    @pytest.mark.parametrize(
        ("bad", "error"),
        [
            (datetime(2021, 3, 4, 5, 6, 7), ValueError),  # naive: names no instant
            ("2021-03-04T05:06:07", ValueError),
            ("yesterday", ValueError),
            ("", ValueError),
            (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), ValueError),
            (1614834367, TypeError),
            (date(2021, 3, 4), TypeError),
        ],
    )
    async def test_create_refuses_a_bad_creation_time(
        self, store: SessionStore, bad: Any, error: type[Exception]
    ) -> None:
        with pytest.raises(error, match="created_at"):
            await store.create("s", created_at=bad)
        assert await store.list() == []  # nothing was created

    @pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "nul\x00", "\ud800", "a\udc80"])
    async def test_bad_session_ids_are_value_errors(self, store: SessionStore, bad: str) -> None:
        with pytest.raises(ValueError, match="session_id"):
            await store.create(bad)
        with pytest.raises(ValueError, match="session_id"):
            await store.get(bad)

    @pytest.mark.parametrize(
        ("bad", "problem"),
        [
            ("x" * 201, "201 UTF-8 bytes"),
            ("é" * 101, "202 UTF-8 bytes"),
            ("x" * 300, "300 UTF-8 bytes"),
            (".deleted-x-" + "0" * 32, "reserved"),
            (".trash", "reserved"),
            (".hidden", "reserved"),
        ],
    )
    async def test_too_long_and_reserved_ids_are_refused_up_front(
        self, store: SessionStore, bad: str, problem: str
    ) -> None:
        with pytest.raises(ValueError, match=problem):
            await store.create(bad)
        with pytest.raises(ValueError, match=problem):
            await store.commit(bad, conversation(1))
        assert await store.list() == []

    async def test_the_longest_id_works_end_to_end(self, store: SessionStore) -> None:
        longest = "é" * 100  # 200 UTF-8 bytes: the limit
        await store.create(longest)
        async with store.writer_lock(longest):
            await store.commit(longest, conversation(2))
        assert (await store.get(longest)).messages == conversation(2)
        assert [m.session_id for m in await store.list()] == [longest]

    async def test_commit_appends_only_what_is_new(self, store: SessionStore) -> None:
        await store.create("s")
        history = conversation(3)
        first = await store.commit("s", history)
        assert first.message_count == 3
        history += conversation(5)[3:]
        second = await store.commit("s", history, expected_tail=first.tail)
        assert second.message_count == 5
        assert second.tail != first.tail
        assert (await store.get("s")).messages == conversation(5)
        # committing the same history again writes nothing and keeps the tail
        again = await store.commit("s", history, expected_tail=second.tail)
        assert again == second

    async def test_messages_are_copied_not_aliased(self, store: SessionStore) -> None:
        await store.create("s")
        history = conversation(2)
        await store.commit("s", history)
        history[0]["content"][0]["text"] = "changed after commit"
        record = await store.get("s")
        assert record.messages[0]["content"][0]["text"] == "m0"
        record.messages[1]["content"][0]["text"] = "changed after read"
        assert (await store.get("s")).messages[1]["content"][0]["text"] == "m1"

    async def test_stale_tail_is_a_conflict_and_writes_nothing(self, store: SessionStore) -> None:
        await store.create("s")
        base = await store.commit("s", conversation(2))
        moved = await store.commit("s", conversation(3), expected_tail=base.tail)
        with pytest.raises(SessionConflictError) as info:
            await store.commit("s", conversation(4), expected_tail=base.tail)
        assert info.value.code == "session_conflict"
        record = await store.get("s")
        assert record.messages == conversation(3)
        assert record.tail == moved.tail

    async def test_shorter_history_needs_rewritten(self, store: SessionStore) -> None:
        await store.create("s")
        await store.commit("s", conversation(4))
        with pytest.raises(SessionConflictError):
            await store.commit("s", conversation(2))
        result = await store.commit("s", [text("user", "summary")], rewritten=True)
        assert result.message_count == 1
        assert (await store.get("s")).messages == [text("user", "summary")]
        # and appends continue after a rewrite
        await store.commit(
            "s", [text("user", "summary"), text("assistant", "next")], expected_tail=result.tail
        )
        assert [m["content"][0]["text"] for m in (await store.get("s")).messages] == [
            "summary",
            "next",
        ]

    async def test_rewriting_the_same_history_twice_changes_the_tail(
        self, store: SessionStore
    ) -> None:
        await store.create("s")
        await store.commit("s", conversation(2))
        one = await store.commit("s", conversation(1), rewritten=True)
        two = await store.commit("s", conversation(1), rewritten=True, expected_tail=one.tail)
        assert one.tail != two.tail

    async def test_agent_state_is_stored_and_replaced(self, store: SessionStore) -> None:
        await store.create("s")
        await store.commit("s", conversation(1), agent_state={"state": {"step": 1}})
        await store.commit("s", conversation(2), agent_state={"state": {"step": 2}})
        record = await store.get("s")
        assert record.agent_state == {"state": {"step": 2}}
        # a commit without state keeps the last one; a rewrite keeps it too
        await store.commit("s", conversation(3))
        await store.commit("s", conversation(1), rewritten=True)
        assert (await store.get("s")).agent_state == {"state": {"step": 2}}

    async def test_state_only_commit_moves_the_tail(self, store: SessionStore) -> None:
        await store.create("s")
        first = await store.commit("s", conversation(1))
        second = await store.commit(
            "s", conversation(1), agent_state={"x": 1}, expected_tail=first.tail
        )
        assert second.tail != first.tail
        assert second.message_count == 1

    async def test_redaction_reads_return_the_replacement(self, store: SessionStore) -> None:
        await store.create("s")
        await store.commit("s", conversation(3))
        await store.commit("s", conversation(3), redactions={1: text("assistant", "[redacted]")})
        record = await store.get("s")
        assert record.messages[1] == text("assistant", "[redacted]")
        assert record.messages[0] == text("user", "m0")
        page = await read_history_page(store, "s", offset=0, limit=10)
        assert page.messages[1] == text("assistant", "[redacted]")
        with pytest.raises(ValueError, match="redaction"):
            await store.commit("s", conversation(3), redactions={7: text("user", "x")})

    async def test_bytes_round_trip(self, store: SessionStore) -> None:
        small = b"\x00\x01\xff"
        big = bytes(range(256)) * 40  # above attachment thresholds
        message: Message = {
            "role": "user",
            "content": [
                {"text": "look"},
                {"image": {"format": "png", "source": {"bytes": small}}},
                {"image": {"format": "png", "source": {"bytes": big}}},
            ],
        }
        await store.create("s")
        await store.commit("s", [message, text("assistant", "seen")], agent_state={"blob": "ok"})
        record = await store.get("s")
        assert record.messages[0] == message
        page = await read_history_page(store, "s", offset=0, limit=1)
        assert page.messages[0] == message

    async def test_lone_surrogates_round_trip(self, store: SessionStore) -> None:
        # A str decoded with surrogateescape (a file name, a tool's broken output) holds
        # lone surrogates, which UTF-8 cannot carry; storing it must not fail the turn.
        odd = text("user", "file \udc80\udcff name, half a pair \ud800, é")
        state = {"path": "\udcfe", "ok": "ü"}
        await store.create("s")
        await store.commit("s", [odd, text("assistant", "seen")], agent_state=state)
        record = await store.get("s")
        assert record.messages[0] == odd
        assert record.agent_state == state
        page = await read_history_page(store, "s", offset=0, limit=1)
        assert page.messages == [odd]
        result = await store.commit("s", [odd, text("assistant", "seen"), odd])
        assert (await store.get("s")).messages[2] == odd
        assert result.message_count == 3

    async def test_list_is_metadata_sorted_with_cursor(self, store: SessionStore) -> None:
        for sid in ["c", "a", "b", "d"]:
            await store.create(sid)
        await store.commit("b", conversation(3))
        metas = await store.list()
        assert [m.session_id for m in metas] == ["a", "b", "c", "d"]
        assert all(isinstance(m, SessionMeta) for m in metas)
        assert {m.session_id: m.message_count for m in metas}["b"] == 3
        assert [m.session_id for m in await store.list(limit=2)] == ["a", "b"]
        assert [m.session_id for m in await store.list(after="b")] == ["c", "d"]
        assert [m.session_id for m in await store.list(after="b", limit=1)] == ["c"]
        b = next(m for m in metas if m.session_id == "b")
        assert b.updated_at >= b.created_at

    async def test_delete_is_idempotent(self, store: SessionStore) -> None:
        await store.create("s")
        await store.commit("s", conversation(2))
        await store.delete("s")
        await store.delete("s")
        with pytest.raises(SessionNotFoundError):
            await store.get("s")
        assert await store.list() == []
        await store.create("s")  # the id can be used again
        assert (await store.get("s")).messages == []

    async def test_writer_lock_excludes_other_writers(
        self, store: SessionStore, store_factory: StoreFactory
    ) -> None:
        await store.create("s")
        other = self.same_data(store, store_factory)
        async with store.writer_lock("s"):
            with pytest.raises(SessionLockedError) as info:
                async with other.writer_lock("s"):
                    pass
            assert info.value.code == "session_locked"
            # the holder commits freely
            await store.commit("s", conversation(1))
            if other is not store:
                with pytest.raises(SessionLockedError):
                    await other.commit("s", conversation(2))
        async with other.writer_lock("s"):  # released
            pass
        assert (await store.get("s")).messages == conversation(1)

    @pytest.mark.parametrize("durability", ["commit", "invocation", "none"])
    async def test_a_writer_sees_what_others_committed_between_its_turns(
        self, store_factory: StoreFactory, durability: str
    ) -> None:
        # A store may remember a session's end while it holds the writer lock; once the
        # lock was let go, another writer's commits must be seen, never written over.
        if not self.durable_across_reopen:
            pytest.skip("needs two instances over shared data (durable_across_reopen)")
        if self.durability_options:
            if durability not in self.durability_options:
                pytest.skip(f"the store takes no durability={durability!r}")
            options: dict[str, Any] = {"durability": durability}
        elif durability != "commit":
            pytest.skip("the store has no durability option: one run is enough")
        else:
            options = {}
        first = store_factory(**options)
        second = store_factory(**options)
        await first.create("s")
        async with first.writer_lock("s"):
            tail = (await first.commit("s", conversation(2))).tail
            tail = (await first.commit("s", conversation(3), expected_tail=tail)).tail
        async with second.writer_lock("s"):
            seen = await second.get("s")
            theirs = (await second.commit("s", conversation(5), expected_tail=seen.tail)).tail
        async with first.writer_lock("s"):
            with pytest.raises(SessionConflictError):
                await first.commit("s", conversation(6), expected_tail=tail)
            record = await first.get("s")
            assert (record.messages, record.tail) == (conversation(5), theirs)
            await first.commit("s", conversation(6), expected_tail=record.tail)
        assert (await second.get("s")).messages == conversation(6)
        for opened in (first, second):
            close(opened)

    async def test_history_pages_never_split_tool_pairs(self, store: SessionStore) -> None:
        history = [m for i in range(6) for m in tool_round(i)]
        await store.create("s")
        await store.commit("s", history)
        page = await read_history_page(store, "s", offset=2, limit=1)  # lands on a toolResult
        assert page.offset == 1
        assert "toolUse" in page.messages[0]["content"][0]
        assert "toolResult" in page.messages[1]["content"][0]
        page = await read_history_page(store, "s", offset=0, limit=2)  # ends on a toolUse
        assert page.next_offset == 3
        empty = await read_history_page(store, "s", offset=0, limit=0)
        assert (empty.messages, empty.total) == ([], 24)
        tail = await read_history_page(store, "s", offset=24 - 4, limit=50)
        assert tail.messages == history[-4:]
        assert tail.next_offset == 24

    @settings(max_examples=15, deadline=None, suppress_health_check=_PER_BACKEND)
    @given(rounds=st.integers(0, 6), extra=st.integers(0, 3), limit=st.integers(1, 7))
    def test_walking_pages_covers_every_message_once(
        self, store_factory: StoreFactory, rounds: int, extra: int, limit: int
    ) -> None:
        async def run() -> None:
            store = store_factory()
            sid = f"walk-{rounds}-{extra}-{limit}"
            history = [m for i in range(rounds) for m in tool_round(i)] + conversation(extra)
            await store.create(sid, exist_ok=True)
            await store.commit(sid, history, rewritten=True)
            seen: list[Message] = []
            cursor = 0
            while cursor < len(history):
                page = await read_history_page(store, sid, offset=cursor, limit=limit)
                assert page.offset <= cursor
                seen.extend(page.messages[cursor - page.offset :])
                assert page.next_offset > cursor
                cursor = page.next_offset
            assert seen == history

        asyncio.run(run())

    async def test_page_arguments_are_checked(self, store: SessionStore) -> None:
        await store.create("s")
        with pytest.raises(ValueError, match="offset"):
            await read_history_page(store, "s", offset=-1, limit=5)
        with pytest.raises(TypeError, match="limit"):
            await read_history_page(store, "s", offset=0, limit="5")  # type: ignore[arg-type]

    def test_coroutines_work_from_any_loop_and_thread(self, store: SessionStore) -> None:
        errors: list[BaseException] = []

        async def writer() -> None:
            await store.create("s")
            history: list[Message] = []
            for i in range(20):
                history.append(text("user", f"m{i}"))
                await store.commit("s", history)

        def reader() -> None:
            try:
                for _ in range(20):
                    asyncio.run(store.list())
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        asyncio.run(writer())
        thread.join()
        assert errors == []
        results: list[Any] = []
        worker = threading.Thread(target=lambda: results.append(asyncio.run(store.get("s"))))
        worker.start()
        worker.join()
        assert len(results[0].messages) == 20

    async def test_marker_shaped_content_round_trips_unchanged(
        self, store: SessionStore, store_factory: StoreFactory
    ) -> None:
        # Content is data (SPEC §7.1): a tool input or state value shaped like perdure's
        # own markers is neither read as bytes nor as an attachment that is "missing".
        shaped = {
            "ref": {"__attachment__": "ab" * 32, "size": 3},
            "bytes_like": {"__bytes_encoded__": True, "data": "aGk="},
            "escape_like": {"__perdure_dict__": [["a", 1]]},
            "real_small": b"\x00real",
            "real_big": bytes(range(256)) * 8,  # an attachment in the file store
            "deeper": [{"__attachment__": "cd" * 32, "size": 3, "note": "x"}],
        }
        state = {"v": {"__bytes_encoded__": True, "data": "aGk="}, "a": shaped["ref"]}
        history = [text("user", "q"), tool_use(shaped)]
        await store.create("s")
        await store.commit("s", history, agent_state=state)
        history.append(text("user", "next"))
        await store.commit("s", history)  # a commit that reads the stored end
        for reader in (store, self.same_data(store, store_factory)):
            record = await reader.get("s")
            assert record.messages == history
            assert record.agent_state == state
            page = await read_history_page(reader, "s", offset=1, limit=1)
            assert page.messages[0] == history[1]
        assert (await verify_store(store)).clean

    @pytest.mark.parametrize(("bad", "path", "why"), [*UNSTORABLE, (nested(500), "", "deeper")])
    async def test_unstorable_values_are_refused_and_nothing_is_written(
        self, store: SessionStore, bad: Any, path: str, why: str
    ) -> None:
        await store.create("s")
        with pytest.raises(ValueError, match=re.escape(path) + ".*" + why):
            await store.commit("s", [text("user", "q"), tool_use(bad)])
        record = await store.get("s")
        assert (record.messages, record.meta.message_count) == ([], 0)
        await store.commit("s", [text("user", "q"), tool_use({"x": 1.5})])  # still usable
        assert (await store.get("s")).messages[1] == tool_use({"x": 1.5})

    @pytest.mark.parametrize("locked", [False, True])
    async def test_a_commit_without_tail_extends_or_conflicts(
        self, store: SessionStore, store_factory: StoreFactory, locked: bool
    ) -> None:
        # SPEC §7: without expected_tail, a commit that extends the stored history
        # succeeds and one that diverges from it raises SessionConflictError.
        await store.create("s")
        base = conversation(2)
        await store.commit("s", base)
        other = self.same_data(store, store_factory)
        mine = [*base, text("user", "from one writer")]
        theirs = [*base, text("user", "from the other")]
        if locked:  # one process holding the lock: the appends the store makes inline
            async with store.writer_lock("s"):
                await store.commit("s", mine)
                with pytest.raises(SessionConflictError) as info:
                    await store.commit("s", theirs)
                with pytest.raises(SessionConflictError):
                    await store.commit("s", theirs, agent_state={"x": 1})
        else:
            await store.commit("s", mine)
            with pytest.raises(SessionConflictError) as info:
                await other.commit("s", theirs)
            with pytest.raises(SessionConflictError):
                await other.commit("s", [*theirs, text("assistant", "more")])
        assert info.value.code == "session_conflict"
        record = await store.get("s")
        assert record.messages == mine
        assert record.agent_state == {}
        # Extending the stored history needs no tail, from either writer.
        mine.append(text("assistant", "answer"))
        await other.commit("s", mine)
        mine.append(tool_use({"b": b"\x01"}))
        await store.commit("s", mine)
        mine.append(text("user", "last"))
        await store.commit("s", mine)
        assert (await other.get("s")).messages == mine
        # A tuple is stored as a list: the writer holding the tuple still extends.
        mine.append(tool_use({"xy": (1, 2)}))
        await store.commit("s", mine)
        mine.append(text("user", "after the tuple"))
        await other.commit("s", mine)

    async def test_a_commit_without_tail_accepts_the_redacted_last_message(
        self,
        store: SessionStore,
    ) -> None:
        await store.create("s")
        history = conversation(3)
        await store.commit("s", history)
        replacement = text("assistant", "[redacted]")
        await store.commit("s", history, redactions={2: replacement})
        # The writer that redacted keeps the original; a reader sees the replacement.
        await store.commit("s", [*history, text("user", "a")])
        seen = (await store.get("s")).messages
        assert seen[2] == replacement
        await store.commit("s", [*seen[:2], replacement, text("user", "a"), text("assistant", "b")])
        assert len((await store.get("s")).messages) == 5

    # ------------------------------------------------------------ capabilities

    async def test_committed_data_survives_reopening(self, store_factory: StoreFactory) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the store keeps nothing past its instance (durable_across_reopen)")
        first = store_factory()
        await first.create("s")
        history = [*tool_round(0), text("user", "é \udc80")]
        await first.commit("s", history, agent_state={"k": b"\x00v"})
        close(first)
        second = store_factory()
        record = await second.get("s")
        assert (record.messages, record.agent_state) == (history, {"k": b"\x00v"})
        assert [m.session_id for m in await second.list()] == ["s"]
        close(second)

    async def test_history_page_agrees_with_the_generic_pager(self, store: SessionStore) -> None:
        if not self.supports_history_page:
            pytest.skip("the store has no history_page (supports_history_page)")
        assert isinstance(store, SupportsHistoryPage)
        history = [m for i in range(5) for m in tool_round(i)] + conversation(3)
        await store.create("s")
        await store.commit("s", history)
        whole = (await store.get("s")).messages
        for offset in range(len(history) + 1):
            for limit in (1, 2, 3, 5, 50):
                page = await store.history_page("s", offset, limit)
                assert page.total == len(history)
                assert page.messages == whole[page.offset : page.next_offset]
                assert page.offset <= offset < page.next_offset or offset == len(history)
        with pytest.raises(SessionNotFoundError):
            await store.history_page("missing", 0, 5)

    async def test_checkpoints_are_a_checkpoint_store(self, store: SessionStore) -> None:
        if not self.supports_checkpoints:
            pytest.skip("the store keeps no checkpoints (supports_checkpoints)")
        assert isinstance(getattr(store, "checkpoints", None), CheckpointStore)
        await store.create("s")
        assert await store.checkpoints.list("s") == []  # type: ignore[attr-defined]

    async def test_ttl_expires_idle_sessions_and_keeps_used_ones(
        self, store_factory: StoreFactory
    ) -> None:
        """SPEC §9: with ``ttl=1``, a session unused for 2 s is gone (``expired``), one
        used every 0.5 s for 3 s lives; an unknown id is ``unknown``; gc removes what
        expired, the tombstone stays, and a Session on the id starts afresh."""
        if not self.supports_ttl:
            pytest.skip("the store takes no ttl (supports_ttl)")
        from perdure.checkpoints.store import new_checkpoint_id
        from perdure.maintenance import gc_store
        from perdure.session.store import SupportsExpiry
        from perdure.testing.checkpoints import make_record

        store = store_factory(ttl=1)
        for bad in (0, -1, "60", True, float("nan")):
            with pytest.raises(ValueError, match="ttl"):
                store_factory(ttl=bad)
        idle_words = [text("user", "idle-needle-0"), text("assistant", "idle-needle-1")]
        await store.create("idle")
        await store.commit("idle", idle_words, agent_state={"k": 1})
        checkpoints = getattr(store, "checkpoints", None) if self.supports_checkpoints else None
        kept = None
        if checkpoints is not None:
            made = await new_checkpoint_id(checkpoints, "idle")
            kept = make_record("idle", made, messages=conversation(1))
            await checkpoints.put(kept)
        busy = conversation(2)
        await store.create("busy")
        await store.commit("busy", busy)
        listed = await store.list()
        assert [m.session_id for m in listed] == ["busy", "idle"]
        assert all(m.expires_at is not None for m in listed)
        with pytest.raises(SessionNotFoundError) as info:
            await store.get("never")
        assert (info.value.code, info.value.details["reason"]) == ("session_not_found", "unknown")

        for step in range(1, 7):  # 3 s: "busy" used every 0.5 s, by a get or a commit
            await asyncio.sleep(0.5)
            if step % 2:
                assert (await store.get("busy")).messages == busy
            else:
                busy = [*busy, text("user", f"b{step}")]
                await store.commit("busy", busy)
            if step == 4:  # 2 s without a use: "idle" is gone
                for attempt in (
                    store.get("idle"),
                    store.commit("idle", [*idle_words, text("user", "late")]),
                    read_history_page(store, "idle", offset=0, limit=5),
                ):
                    with pytest.raises(SessionNotFoundError) as info:
                        await attempt
                    assert info.value.code == "session_not_found"
                    assert info.value.details["reason"] == "expired"
                assert [m.session_id for m in await store.list()] == ["busy"]

        record = await store.get("busy")
        assert record.messages == busy
        if isinstance(store, SupportsExpiry):
            report = await gc_store(store, dry_run=False)
            assert [e.session_id for e in report.expired] == ["idle"]
            assert [e.message_count for e in report.expired] == [2]
        if self.stored_message_count(store, "idle-needle") is not None:
            assert self.stored_message_count(store, "idle-needle") == 0
        with pytest.raises(SessionNotFoundError) as info:
            await store.get("idle")
        assert info.value.details["reason"] == "expired"  # the tombstone
        assert (await store.get("busy")).messages == busy  # gc left the live one
        if checkpoints is not None and kept is not None:
            listed_ids = [m.checkpoint_id for m in await checkpoints.list("idle")]
            if self.checkpoints_outlive_ttl:
                assert listed_ids == [kept.meta.checkpoint_id]
            else:
                assert listed_ids == []

        # An expired id starts afresh (SPEC §7), its checkpoints still there.
        meta = await store.create("idle")
        assert meta.message_count == 0
        assert (await store.get("idle")).messages == []
        if checkpoints is not None and kept is not None and self.checkpoints_outlive_ttl:
            restored = await checkpoints.get("idle", kept.meta.checkpoint_id)
            assert restored.messages == conversation(1)
        await store.delete("idle")
        with pytest.raises(SessionNotFoundError) as info:
            await store.get("idle")
        assert info.value.details["reason"] == "unknown"  # deleted, not expired
        close(store)
