"""The CheckpointStore conformance suite (SPEC §7): every checkpoint store runs it.

Subclass :class:`CheckpointStoreSuite` in a ``Test*`` class and give it one fixture,
``checkpoint_store_factory``: a callable taking ``max_checkpoints=None`` and
``max_checkpoint_age=None`` that opens your store over one test's data (each call a
new instance over the same data)::

    class TestMyCheckpoints(CheckpointStoreSuite):
        @pytest.fixture
        def checkpoint_store_factory(self, tmp_path):
            return lambda **retention: MyCheckpoints(tmp_path / "cp", **retention)

Retention by age is tested without waiting: a checkpoint's age is the time in its id
(a ULID), so the suite puts checkpoints under ids made hours ago.

The suite covers what holds wherever checkpoints are placed (their own store, beside
a session, in a ``Storage``); what a placement adds (dying with the session, damage
reports of its format) is the backend's own to test.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    CheckpointTrigger,
    ListsCheckpointSessions,
    new_checkpoint_id,
    now_iso,
)
from perdure.errors import CheckpointNotFoundError
from perdure.session.ulid import encode_ulid, ulid_timestamp_ms
from perdure.testing._support import run_in_threads
from perdure.types import Message

__all__ = [
    "AGENT_STATE",
    "HISTORY",
    "PNG",
    "CheckpointStoreFactory",
    "CheckpointStoreSuite",
    "fresh_session",
    "ids",
    "json_copy",
    "make_record",
    "put_aged",
    "put_new",
]

CheckpointStoreFactory = Callable[..., CheckpointStore]

PNG = b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary"
HISTORY: list[Message] = [
    {
        "role": "user",
        "content": [
            {"text": "what is in this picture? ünïcode ✓"},
            {"image": {"format": "png", "source": {"bytes": PNG}}},
        ],
    },
    {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t1", "name": "look", "input": {"zoom": 2}}}],
    },
    {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"text": "a cat"}]}}
        ],
    },
    {"role": "assistant", "content": [{"text": "A cat."}]},
]
AGENT_STATE: dict[str, Any] = {
    "state": {"budget": 40, "tags": ["a", "b"], "raw": b"\x00\x01\x02"},
    "internal_state": {"interrupt_state": {}},
}


def make_record(
    session_id: str,
    checkpoint_id: str,
    *,
    trigger: CheckpointTrigger = "manual",
    label: str | None = None,
    messages: list[Message] | None = None,
) -> CheckpointRecord:
    """A record of ``HISTORY`` (or ``messages``) and ``AGENT_STATE``, copied."""
    history = HISTORY if messages is None else messages
    meta = CheckpointMeta(checkpoint_id, session_id, trigger, label, len(history), now_iso())
    return CheckpointRecord(meta, json_copy(history), json_copy(AGENT_STATE))


def json_copy(value: Any) -> Any:
    """A deep copy (bytes kept) so that a record never shares objects with HISTORY."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


async def put_new(
    store: CheckpointStore, session_id: str, trigger: CheckpointTrigger = "manual", **kw: Any
) -> CheckpointRecord:
    """Put a record under a new id of ``session_id``; return it."""
    record = make_record(
        session_id, await new_checkpoint_id(store, session_id), trigger=trigger, **kw
    )
    await store.put(record)
    return record


_aged_randomness = iter(range(1, 2**62))


async def put_aged(
    store: CheckpointStore, session_id: str, *, hours: float, **kw: Any
) -> CheckpointRecord:
    """Put a record of ``session_id`` under an id made ``hours`` ago (its age); return it."""
    made_ms = time.time_ns() // 1_000_000 - round(hours * 3_600_000)
    record = make_record(session_id, encode_ulid(made_ms, next(_aged_randomness)), **kw)
    await store.put(record)
    return record


def ids(metas: list[CheckpointMeta]) -> list[str]:
    """The checkpoint ids of ``metas``, in order."""
    return [meta.checkpoint_id for meta in metas]


def fresh_session() -> str:
    """A session id no other test uses (ids are monotonic per session id, process-wide)."""
    return f"s-{uuid.uuid4().hex[:12]}"


MALFORMED_IDS = [
    "not-a-ulid",
    "",
    "01hzzzzzzzzzzzzzzzzzzzzzzz",  # lower case
    "01HZZZZZZZZZZZZZZZZZZZZZZ",  # 25 characters
    "01HZZZZZZZZZZZZZZZZZZZZZZU",  # U is not Crockford base32
    "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",  # more than 128 bits
    "../../../../etc/passwd0000",
    None,
    42,
]


class CheckpointStoreSuite:
    """The contract every :class:`~perdure.session.CheckpointStore` keeps (SPEC §7).

    Needs one fixture, ``checkpoint_store_factory`` (see the module docstring).

    Attributes:
        durable_across_reopen: a second instance from the factory sees the data of
            the first.
    """

    durable_across_reopen: ClassVar[bool] = True

    @pytest.fixture
    def store(self, checkpoint_store_factory: CheckpointStoreFactory) -> CheckpointStore:
        """The store under test: the first instance from the factory."""
        return checkpoint_store_factory()

    def test_every_store_is_a_checkpoint_store(self, store: CheckpointStore) -> None:
        assert isinstance(store, CheckpointStore)

    async def test_put_get_round_trip(self, store: CheckpointStore) -> None:
        record = make_record("s", await new_checkpoint_id(store, "s"), label="before ✓")
        await store.put(record)
        got = await store.get("s", record.meta.checkpoint_id)
        assert got.meta == record.meta
        assert got.messages == HISTORY
        assert got.messages[0]["content"][1]["image"]["source"]["bytes"] == PNG
        assert got.agent_state == AGENT_STATE
        assert got.agent_state["state"]["raw"] == b"\x00\x01\x02"

    async def test_put_stores_a_copy_and_get_returns_one(self, store: CheckpointStore) -> None:
        record = await put_new(store, "s")
        record.messages.append({"role": "user", "content": [{"text": "later"}]})
        record.agent_state["state"]["budget"] = 0
        first = await store.get("s", record.meta.checkpoint_id)
        first.messages.clear()
        second = await store.get("s", record.meta.checkpoint_id)
        assert second.messages == HISTORY
        assert second.agent_state == AGENT_STATE

    async def test_put_with_an_existing_id_replaces_it(self, store: CheckpointStore) -> None:
        record = await put_new(store, "s", label="one")
        replacement = make_record("s", record.meta.checkpoint_id, label="two", messages=HISTORY[:1])
        await store.put(replacement)
        assert ids(await store.list("s")) == [record.meta.checkpoint_id]
        got = await store.get("s", record.meta.checkpoint_id)
        assert (got.meta.label, got.messages) == ("two", HISTORY[:1])

    async def test_list_is_oldest_first_with_the_meta(self, store: CheckpointStore) -> None:
        assert await store.list("s") == []
        made = [await new_checkpoint_id(store, "s") for _ in range(3)]
        triggers: list[CheckpointTrigger] = ["manual", "pre_compaction", "pre_restore"]
        records = {
            cid: make_record("s", cid, trigger=trigger, label=label, messages=HISTORY[:n])
            for cid, trigger, label, n in zip(
                made,
                triggers,
                ["a", None, "c"],
                [4, 2, 0],
                strict=True,
            )
        }
        for cid in reversed(made):  # stored newest first: list must still sort
            await store.put(records[cid])
        listed = await store.list("s")
        assert listed == [records[cid].meta for cid in made]
        assert [m.trigger for m in listed] == ["manual", "pre_compaction", "pre_restore"]
        assert [m.message_count for m in listed] == [4, 2, 0]

    async def test_new_ids_strictly_increase_and_list_keeps_their_order(
        self,
        store: CheckpointStore,
    ) -> None:
        session = fresh_session()
        made = [(await put_new(store, session)).meta.checkpoint_id for _ in range(30)]
        assert made == sorted(made)
        assert len(set(made)) == len(made)
        assert ids(await store.list(session)) == made

    async def test_new_ids_increase_within_one_millisecond(self, store: CheckpointStore) -> None:
        # A stored id from the future pins every later id to its millisecond: they must
        # still sort after it and after each other (ids are monotonic per session).
        session = fresh_session()
        future_ms = ulid_timestamp_ms(await new_checkpoint_id(store, session)) + 10**7
        future = encode_ulid(future_ms, 5)
        await store.put(make_record(session, future))
        made = [(await put_new(store, session)).meta.checkpoint_id for _ in range(20)]
        made += [await new_checkpoint_id(store, session) for _ in range(200)]
        assert {ulid_timestamp_ms(cid) for cid in made} == {future_ms}
        assert [future, *made] == sorted({future, *made})
        assert ids(await store.list(session)) == [future, *made[:20]]

    async def test_get_of_an_absent_id_raises_checkpoint_not_found(
        self, store: CheckpointStore
    ) -> None:
        absent = encode_ulid(1_700_000_000_000, 42)
        for session in ("never-used", "s"):
            with pytest.raises(CheckpointNotFoundError) as caught:
                await store.get(session, absent)
            assert caught.value.code == "checkpoint_not_found"
            await put_new(store, "s")
        deleted = await put_new(store, "s")
        await store.delete("s", deleted.meta.checkpoint_id)
        with pytest.raises(CheckpointNotFoundError):
            await store.get("s", deleted.meta.checkpoint_id)

    @pytest.mark.parametrize("bad", MALFORMED_IDS)
    async def test_a_malformed_id_raises_value_error(
        self, store: CheckpointStore, bad: Any
    ) -> None:
        kept = await put_new(store, "s")
        with pytest.raises(ValueError, match="checkpoint_id"):
            await store.get("s", bad)
        with pytest.raises(ValueError, match="checkpoint_id"):
            await store.delete("s", bad)
        if isinstance(bad, str):
            with pytest.raises(ValueError):
                await store.put(make_record("s", bad))
        assert ids(await store.list("s")) == [kept.meta.checkpoint_id]

    async def test_delete_is_idempotent(self, store: CheckpointStore) -> None:
        first = await put_new(store, "s")
        second = await put_new(store, "s")
        await store.delete("s", first.meta.checkpoint_id)
        await store.delete("s", first.meta.checkpoint_id)
        await store.delete("never-used", first.meta.checkpoint_id)
        assert ids(await store.list("s")) == [second.meta.checkpoint_id]
        await store.delete("s", second.meta.checkpoint_id)
        assert await store.list("s") == []

    async def test_retention_evicts_the_oldest_whatever_the_trigger(
        self, checkpoint_store_factory: CheckpointStoreFactory
    ) -> None:
        store = checkpoint_store_factory(max_checkpoints=3)
        session = fresh_session()
        triggers: list[CheckpointTrigger] = [
            "manual",
            "import",
            "pre_restore",
            "pre_compaction",
            "pre_compaction",
            "manual",
        ]
        made: list[str] = []
        other = await put_new(store, "other")
        for trigger in triggers:
            made.append((await put_new(store, session, trigger)).meta.checkpoint_id)
            listed = await store.list(session)
            assert ids(listed) == made[-3:]
        assert [m.trigger for m in await store.list(session)] == triggers[-3:]
        with pytest.raises(CheckpointNotFoundError):
            await store.get(session, made[0])
        # Retention is per session: the other session keeps its checkpoint.
        assert ids(await store.list("other")) == [other.meta.checkpoint_id]

    async def test_retention_of_one_keeps_the_newest(
        self, checkpoint_store_factory: CheckpointStoreFactory
    ) -> None:
        store = checkpoint_store_factory(max_checkpoints=1)
        for _ in range(3):
            newest = await put_new(store, "s", "pre_compaction")
        assert ids(await store.list("s")) == [newest.meta.checkpoint_id]

    async def test_age_retention_evicts_older_checkpoints_on_put(
        self, checkpoint_store_factory: CheckpointStoreFactory
    ) -> None:
        store = checkpoint_store_factory(max_checkpoint_age=3600)
        session = fresh_session()
        # Put under an id made two hours ago (a copy, say): past the age, evicted at once.
        stale = await put_aged(store, session, hours=2)
        assert ids(await store.list(session)) == []
        with pytest.raises(CheckpointNotFoundError):
            await store.get(session, stale.meta.checkpoint_id)
        recent = await put_aged(store, session, hours=0.5)
        fresh = await put_new(store, session)
        assert ids(await store.list(session)) == [
            recent.meta.checkpoint_id,
            fresh.meta.checkpoint_id,
        ]

    async def test_age_retention_on_put_evicts_what_was_kept_before(
        self, checkpoint_store_factory: CheckpointStoreFactory
    ) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the store keeps nothing past its instance (durable_across_reopen)")
        unlimited = checkpoint_store_factory()
        session, other = fresh_session(), fresh_session()
        old = [await put_aged(unlimited, session, hours=h) for h in (3, 2, 1.5)]
        kept = await put_aged(unlimited, session, hours=0.25)
        elsewhere = await put_aged(unlimited, other, hours=3)
        assert len(await unlimited.list(session)) == 4  # no limit: all kept
        limited = checkpoint_store_factory(max_checkpoint_age=3600)
        assert ids(await limited.list(session)) == [
            *ids([r.meta for r in old]),
            kept.meta.checkpoint_id,
        ]
        new = await put_new(limited, session)
        assert ids(await limited.list(session)) == [kept.meta.checkpoint_id, new.meta.checkpoint_id]
        for record in old:
            with pytest.raises(CheckpointNotFoundError):
                await limited.get(session, record.meta.checkpoint_id)
        # On write the rule runs for the session written: another keeps its own.
        assert ids(await limited.list(other)) == [elsewhere.meta.checkpoint_id]

    async def test_age_and_count_retention_together(
        self, checkpoint_store_factory: CheckpointStoreFactory
    ) -> None:
        store = checkpoint_store_factory(max_checkpoints=2, max_checkpoint_age=3600)
        session = fresh_session()
        made = [await put_aged(store, session, hours=h) for h in (0.9, 0.6, 0.3)]
        assert ids(await store.list(session)) == ids([r.meta for r in made[1:]])
        newest = await put_new(store, session, "pre_compaction")
        assert ids(await store.list(session)) == [
            made[2].meta.checkpoint_id,
            newest.meta.checkpoint_id,
        ]

    @pytest.mark.parametrize("bad", [0, -1, True, "60", math.nan, math.inf, [60]])
    def test_a_bad_max_checkpoint_age_is_a_value_error(
        self, checkpoint_store_factory: CheckpointStoreFactory, bad: Any
    ) -> None:
        with pytest.raises(ValueError, match="max_checkpoint_age"):
            checkpoint_store_factory(max_checkpoint_age=bad)

    async def test_a_store_of_its_own_names_its_sessions(self, store: CheckpointStore) -> None:
        if not isinstance(store, ListsCheckpointSessions):
            pytest.skip("the store names no sessions (checkpoints beside a session store)")
        assert await store.checkpoint_sessions() == []
        await put_new(store, "b")
        gone = await put_new(store, "ab")
        await put_new(store, "a")
        await put_new(store, "a")
        assert await store.checkpoint_sessions() == ["a", "ab", "b"]
        await store.delete("ab", gone.meta.checkpoint_id)
        assert await store.checkpoint_sessions() == ["a", "b"]

    async def test_sessions_are_isolated(self, store: CheckpointStore) -> None:
        # "a" is a prefix of "ab": a store keyed by prefixes must not mix them up.
        in_a = await put_new(store, "a")
        in_ab = await put_new(store, "ab")
        assert ids(await store.list("a")) == [in_a.meta.checkpoint_id]
        assert ids(await store.list("ab")) == [in_ab.meta.checkpoint_id]
        with pytest.raises(CheckpointNotFoundError):
            await store.get("ab", in_a.meta.checkpoint_id)
        await store.delete("ab", in_a.meta.checkpoint_id)
        assert (await store.get("a", in_a.meta.checkpoint_id)).meta == in_a.meta
        assert await store.list("b") == []

    @pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b"])
    async def test_a_bad_session_id_raises_value_error(
        self, store: CheckpointStore, bad: str
    ) -> None:
        valid = encode_ulid(1_700_000_000_000, 1)
        with pytest.raises(ValueError):
            await store.list(bad)
        with pytest.raises(ValueError):
            await store.get(bad, valid)
        with pytest.raises(ValueError):
            await store.delete(bad, valid)
        with pytest.raises(ValueError):
            await store.put(make_record(bad, valid))

    async def test_usable_from_any_loop_and_any_thread(self, store: CheckpointStore) -> None:
        session = fresh_session()

        def in_own_loop(count: int) -> list[str]:
            async def work() -> list[str]:
                return [(await put_new(store, session)).meta.checkpoint_id for _ in range(count)]

            return asyncio.run(work())

        # Made on another loop in a worker thread, read on this loop.
        first = await asyncio.to_thread(in_own_loop, 2)
        assert ids(await store.list(session)) == first

        # Several threads, each with its own loop, at once.
        results: list[list[str]] = []

        async def worker(_: int) -> None:
            results.append([(await put_new(store, session)).meta.checkpoint_id for _ in range(3)])

        assert run_in_threads(worker, 4) == []
        everything = sorted([*first, *(cid for made in results for cid in made)])
        assert ids(await store.list(session)) == everything

        # A record put on this loop is read on another.
        record = await put_new(store, session)
        got = await asyncio.to_thread(
            lambda: asyncio.run(store.get(session, record.meta.checkpoint_id))
        )
        assert got.meta == record.meta

    async def test_checkpoints_survive_reopening_the_store(
        self, checkpoint_store_factory: CheckpointStoreFactory
    ) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the store keeps nothing past its instance (durable_across_reopen)")
        record = await put_new(checkpoint_store_factory(), "s")
        reopened = checkpoint_store_factory()
        assert ids(await reopened.list("s")) == [record.meta.checkpoint_id]
        assert (await reopened.get("s", record.meta.checkpoint_id)).messages == HISTORY
