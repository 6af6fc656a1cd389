"""The MemoryStore conformance suite (SPEC §5): every writable memory store runs it.

Subclass :class:`MemoryStoreSuite` in a ``Test*`` class and give it one fixture,
``memory_store_factory``: a callable ``factory(namespace)`` that opens your store over
one test's data for that namespace (each call a new instance over the same data).
The suite closes what it opened (``close()``, when the store has one)::

    class TestMyMemory(MemoryStoreSuite):
        @pytest.fixture
        def memory_store_factory(self, tmp_path):
            return lambda namespace: MyMemory(tmp_path / "m.db", namespace=namespace)

The suite tests what the protocol promises: ``search`` (required) over what ``add``
(or ``add_messages``) remembered, duplicates tolerated (extraction is at least
once), a ``name``, bad arguments refused by name, any loop and any thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure.memory.entry import MemoryEntry
from perdure.memory.store import MemoryStore, has_method, is_writable, store_name
from perdure.testing._support import close, run_in_threads

__all__ = ["MemoryStoreFactory", "MemoryStoreSuite"]

MemoryStoreFactory = Callable[[str], MemoryStore]

# Each backend's subclass runs the same method on its own class (an "executor" to
# hypothesis): by design, so that health check does not apply.
_PER_BACKEND = [HealthCheck.function_scoped_fixture, HealthCheck.differing_executors]


def contents(entries: list[MemoryEntry]) -> list[str]:
    """The texts of ``entries``, in order."""
    return [entry.content for entry in entries]


class MemoryStoreSuite:
    """The contract every writable :class:`~perdure.memory.MemoryStore` keeps (SPEC §5).

    Needs one fixture, ``memory_store_factory`` (see the module docstring).

    Attributes:
        durable_across_reopen: a second instance from the factory sees what the
            first remembered.
        lexical: a search finds only memories sharing a word with the query (a
            full-text store); false for a store that always returns its nearest
            memories (a vector store), whose "no match" test is skipped.
    """

    durable_across_reopen: ClassVar[bool] = True
    lexical: ClassVar[bool] = True

    @pytest.fixture
    def open_memory(self, memory_store_factory: MemoryStoreFactory) -> Iterator[MemoryStoreFactory]:
        """The factory, closing every instance it opened when the test ends."""
        opened: list[MemoryStore] = []

        def factory(namespace: str) -> MemoryStore:
            store = memory_store_factory(namespace)
            opened.append(store)
            return store

        yield factory
        for store in opened:
            close(store)

    @pytest.fixture
    def memory(self, open_memory: MemoryStoreFactory) -> MemoryStore:
        """The store under test, in the namespace ``"alice"``."""
        return open_memory("alice")

    async def add(self, store: MemoryStore, content: str, **metadata: Any) -> None:
        """Remember ``content`` through ``add``, else through ``add_messages``."""
        if has_method(store, "add"):
            await store.add(content, metadata=metadata or None)
        else:
            message: Any = {"role": "user", "content": [{"text": content}]}
            await store.add_messages([message], metadata=metadata or None)

    def test_it_is_a_writable_memory_store(self, memory: MemoryStore) -> None:
        assert has_method(memory, "search")
        assert is_writable(memory)
        assert isinstance(store_name(memory), str)
        assert store_name(memory)

    async def test_what_was_added_is_found(self, memory: MemoryStore) -> None:
        await self.add(memory, "The user prefers dark mode in the editor.")
        await self.add(memory, "The user drinks coffee every morning.")
        found = await memory.search("dark mode", limit=5)
        assert all(isinstance(entry, MemoryEntry) for entry in found)
        assert found
        assert found[0].content == "The user prefers dark mode in the editor."
        scores = [entry.score for entry in found if entry.score is not None]
        assert scores == sorted(scores, reverse=True)  # best first

    async def test_search_honours_the_limit(self, memory: MemoryStore) -> None:
        for i in range(6):
            await self.add(memory, f"fact number {i} about the garden")
        assert len(await memory.search("garden fact", limit=3)) == 3
        assert len(await memory.search("garden fact", limit=1)) == 1
        assert len(await memory.search("garden fact", limit=50)) == 6

    async def test_duplicates_are_tolerated(self, memory: MemoryStore) -> None:
        # Extraction runs at least once: the same content may arrive twice.
        for _ in range(3):
            await self.add(memory, "The user prefers dark mode.")
        found = await memory.search("dark mode", limit=10)
        assert "The user prefers dark mode." in contents(found)

    async def test_an_unrelated_query_finds_nothing(self, memory: MemoryStore) -> None:
        if not self.lexical:
            pytest.skip("the store returns its nearest memories for any query (lexical)")
        assert await memory.search("tennis", limit=3) == []
        await self.add(memory, "The user drinks coffee every morning.")
        assert await memory.search("tennis", limit=3) == []

    async def test_namespaces_isolate_users(self, open_memory: MemoryStoreFactory) -> None:
        alice, bob = open_memory("alice"), open_memory("bob")
        await self.add(alice, "Alice prefers dark mode.")
        await self.add(bob, "Bob prefers light mode.")
        assert contents(await alice.search("prefers mode", limit=10)) == [
            "Alice prefers dark mode."
        ]
        assert contents(await bob.search("prefers mode", limit=10)) == ["Bob prefers light mode."]

    async def test_add_messages_remembers_the_conversation_text(self, memory: MemoryStore) -> None:
        if not has_method(memory, "add_messages"):
            pytest.skip("the store has no add_messages")
        await memory.add_messages(
            [
                {"role": "user", "content": [{"text": "I keep bees on the roof."}]},
                {"role": "assistant", "content": [{"text": "Noted, beekeeping."}]},
            ]
        )
        assert "I keep bees on the roof." in contents(await memory.search("bees roof", limit=5))

    async def test_memories_persist_across_instances(self, open_memory: MemoryStoreFactory) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the store keeps nothing past its instance (durable_across_reopen)")
        first = open_memory("alice")
        await self.add(first, "The user prefers dark mode.")
        close(first)
        second = open_memory("alice")
        assert contents(await second.search("dark", limit=1)) == ["The user prefers dark mode."]

    async def test_bad_arguments_are_refused_by_name(self, memory: MemoryStore) -> None:
        with pytest.raises(TypeError, match="query"):
            await memory.search(b"dark", limit=1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="limit"):
            await memory.search("dark", limit=0)
        if has_method(memory, "add"):
            with pytest.raises(TypeError, match="content"):
                await memory.add(3)  # type: ignore[arg-type]

    @settings(max_examples=60, suppress_health_check=_PER_BACKEND)
    @given(query=st.text(max_size=40))
    def test_no_query_can_break_the_search(
        self, memory_store_factory: MemoryStoreFactory, query: str
    ) -> None:
        store = memory_store_factory("fuzz")  # a new instance per example, closed after
        try:

            async def run() -> None:
                await self.add(store, "The user prefers dark mode.")
                found = await store.search(query, limit=5)
                assert len(found) <= 1

            asyncio.run(run())
        finally:
            close(store)

    def test_usable_from_any_event_loop_and_thread(self, memory: MemoryStore) -> None:
        asyncio.run(self.add(memory, "made in the main thread"))

        async def worker(index: int) -> None:
            await self.add(memory, f"fact number {index}")
            await asyncio.gather(*(memory.search("fact", limit=3) for _ in range(5)))

        assert run_in_threads(worker, 4) == []
        found = asyncio.run(memory.search("fact number", limit=10))
        assert sorted(contents(found)) == [f"fact number {i}" for i in range(4)]
