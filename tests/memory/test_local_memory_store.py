"""LocalMemoryStore: the MemoryStore suite, then BM25, namespaces, duplicates, errors, threads."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from perdure.memory import LocalMemoryStore, MemoryStore, MemoryStoreError, has_method
from perdure.memory._sqlite import SQLiteConnection
from perdure.memory.local_store import build_match_query, query_terms
from perdure.testing.memory import MemoryStoreFactory, MemoryStoreSuite


class TestLocalMemoryStoreContract(MemoryStoreSuite):
    """The MemoryStore contract, from perdure.testing, as any store runs it."""

    @pytest.fixture
    def memory_store_factory(self, tmp_path: Path) -> MemoryStoreFactory:
        return lambda namespace: LocalMemoryStore(tmp_path / "memory.sqlite", namespace=namespace)


@pytest.fixture
def store(tmp_path: Path) -> LocalMemoryStore:
    return LocalMemoryStore(tmp_path / "memory.sqlite", namespace="alice")


def contents(entries: list[Any]) -> list[str]:
    return [entry.content for entry in entries]


def test_it_is_a_full_memory_store(store: LocalMemoryStore) -> None:
    assert MemoryStore in type(store).__mro__
    for method in ("search", "add", "add_messages", "initialize"):
        assert has_method(store, method)
    assert not has_method(store, "get_tools")
    assert store.name == "local"


async def test_any_term_may_match_ranked_by_bm25(store: LocalMemoryStore) -> None:
    await store.add("The user prefers dark mode in the editor.")
    await store.add("The user drinks coffee every morning.")
    await store.add("The user's sister likes board games.")
    await store.add("Dark chocolate is the user's favourite snack, mode or not.")
    found = await store.search("dark mode?", limit=10)
    # Both memories with both words; the shorter one first (BM25 length normalisation).
    assert contents(found[:2]) == [
        "The user prefers dark mode in the editor.",
        "Dark chocolate is the user's favourite snack, mode or not.",
    ]
    assert contents(await store.search("coffee or games", limit=10)) == [
        "The user drinks coffee every morning.",
        "The user's sister likes board games.",
    ]  # OR: either word is enough
    scores = [entry.score for entry in found]
    assert all(isinstance(s, float) for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert found[0].store_name == "local"
    assert await store.search("tennis", limit=3) == []


async def test_words_are_stemmed_and_case_and_accents_folded(store: LocalMemoryStore) -> None:
    await store.add("The user PREFERS the café near the office.")
    assert contents(await store.search("what is my preference", limit=1)) == [
        "The user PREFERS the café near the office."
    ]
    assert len(await store.search("CAFE", limit=1)) == 1


async def test_stop_words_are_ignored_unless_nothing_else_is_left(store: LocalMemoryStore) -> None:
    await store.add("It is what it is.")
    await store.add("The user likes tennis.")
    assert contents(await store.search("what is the tennis", limit=5)) == ["The user likes tennis."]
    assert contents(await store.search("what is", limit=5)) == ["It is what it is."]
    assert query_terms("What IS the Tennis, tennis?") == ["tennis"]


@pytest.mark.parametrize(
    "query",
    [
        'dark" OR mode',
        "dark AND NOT mode",
        "NEAR(dark mode, 2)",
        "terms : dark",
        "dark*",
        "^dark",
        "(dark",
        '"dark',
        "-dark +mode",
        "{terms}: dark",
        "dark\x00mode",
        "🙂 dark",
    ],
)
async def test_fts_syntax_in_user_text_is_just_text(store: LocalMemoryStore, query: str) -> None:
    await store.add("The user prefers dark mode.")
    found = await store.search(query, limit=3)
    assert contents(found) == ["The user prefers dark mode."]


def test_match_query_quotes_every_term() -> None:
    assert build_match_query("p_", ["a", 'b"c']) == '"p_a" OR "p_b""c"'


async def test_namespaces_isolate_users(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    alice = LocalMemoryStore(path, namespace="user-1")
    bob = LocalMemoryStore(path, namespace="user 1")  # same words once tokenised
    carol = LocalMemoryStore(path, namespace="user_1")
    await alice.add("Alice prefers dark mode.")
    await bob.add("Bob prefers light mode.")
    await bob.add("Alice prefers dark mode.")  # the same text, another user
    assert contents(await alice.search("mode prefers dark light", limit=10)) == [
        "Alice prefers dark mode."
    ]
    assert sorted(contents(await bob.search("mode", limit=10))) == [
        "Alice prefers dark mode.",
        "Bob prefers light mode.",
    ]
    assert await carol.search("mode", limit=10) == []
    assert (await alice.count(), await bob.count(), await carol.count()) == (1, 2, 0)
    bob_ids = [e.metadata["memory_id"] for e in await bob.list()]  # type: ignore[index]
    assert await alice.delete(bob_ids) == 0  # other namespaces' ids are ignored
    assert await carol.clear() == 0
    assert await bob.count() == 2
    assert await alice.clear() == 1
    assert await bob.count() == 2
    assert await alice.count() == 0


async def test_duplicates_are_tolerated(store: LocalMemoryStore) -> None:
    await store.add("The user prefers dark mode.")
    await store.add("The user prefers dark mode.")
    await store.add("  the USER prefers   dark mode.\n")
    assert await store.add_many(["The user prefers dark mode.", "New fact.", "New fact."]) == 1
    assert contents(await store.list()) == ["The user prefers dark mode.", "New fact."]
    assert len(await store.search("dark", limit=10)) == 1


async def test_list_delete_and_metadata(store: LocalMemoryStore) -> None:
    await store.add("first", metadata={"source": "test", "tags": ["a"]})
    await store.add_many(["second", "third"])
    listed = await store.list()
    assert contents(listed) == ["first", "second", "third"]
    assert listed[0].metadata is not None
    assert listed[0].metadata["source"] == "test"
    assert listed[0].metadata["tags"] == ["a"]
    ids = [e.metadata["memory_id"] for e in listed]  # type: ignore[index]
    assert all(isinstance(e.metadata["created_at"], float) for e in listed)  # type: ignore[index]
    assert contents(await store.list(limit=1, offset=1)) == ["second"]
    assert await store.delete(ids[1]) == 1
    assert await store.delete([ids[1], 10_000]) == 0
    assert contents(await store.list()) == ["first", "third"]
    assert await store.search("second", limit=5) == []  # gone from the index too
    found = await store.search("third", limit=5)
    assert found[0].metadata == {
        "memory_id": ids[2],
        "created_at": listed[2].metadata["created_at"],
    }  # type: ignore[index]


async def test_add_messages_keeps_user_and_assistant_text(store: LocalMemoryStore) -> None:
    await store.add_messages(
        [
            {"role": "user", "content": [{"text": "I prefer dark mode."}]},
            {
                "role": "assistant",
                "content": [
                    {"text": "Noted."},
                    {"toolUse": {"toolUseId": "t1", "name": "x", "input": {}}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"toolResult": {"toolUseId": "t1", "status": "success", "content": []}}
                ],
            },
        ],
        metadata={"session": "s1"},
    )
    listed = await store.list()
    assert contents(listed) == ["I prefer dark mode.", "Noted."]
    assert [e.metadata["role"] for e in listed] == ["user", "assistant"]  # type: ignore[index]
    assert listed[0].metadata["session"] == "s1"  # type: ignore[index]


async def test_in_memory_database(tmp_path: Path) -> None:
    store = LocalMemoryStore(":memory:", namespace="alice")
    await store.add("ephemeral fact")
    assert contents(await store.search("fact", limit=1)) == ["ephemeral fact"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"namespace": ""}, ValueError, "namespace"),
        ({"namespace": 3}, TypeError, "namespace"),
        ({"namespace": "a", "name": ""}, ValueError, "name"),
        ({"namespace": "a", "embedder": object()}, TypeError, "embedder"),
        ({"namespace": "a", "min_similarity": "high"}, TypeError, "min_similarity"),
    ],
)
def test_constructor_checks_arguments(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        LocalMemoryStore(tmp_path / "x.sqlite", **kwargs)
    with pytest.raises(TypeError, match="namespace"):
        LocalMemoryStore(tmp_path / "x.sqlite")  # type: ignore[call-arg]


async def test_methods_check_arguments(store: LocalMemoryStore) -> None:
    with pytest.raises(TypeError, match="query"):
        await store.search(b"dark", limit=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        await store.search("dark", limit=0)
    with pytest.raises(ValueError, match="content"):
        await store.add("   ")
    with pytest.raises(TypeError, match="content"):
        await store.add(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved"):
        await store.add("x", metadata={"memory_id": 1})
    with pytest.raises(ValueError, match="JSON"):
        await store.add("x", metadata={"when": object()})
    with pytest.raises(TypeError, match="contents"):
        await store.add_many("one string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="memory_ids"):
        await store.delete(["1"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="offset"):
        await store.list(offset=-1)
    assert await store.search("   ", limit=3) == []
    assert await store.search("?!", limit=3) == []


async def test_sqlite_errors_are_translated(tmp_path: Path) -> None:
    path = tmp_path / "broken.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    store = LocalMemoryStore(path, namespace="alice")
    with pytest.raises(MemoryStoreError) as caught:
        await store.add("fact")
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    assert caught.value.code == "memory_store_error"
    with pytest.raises(MemoryStoreError):
        await store.search("fact", limit=1)
    good = LocalMemoryStore(tmp_path / "good.sqlite", namespace="alice")
    good.close()
    good.close()  # idempotent
    with pytest.raises(MemoryStoreError, match="closed"):
        await good.search("fact", limit=1)


async def test_io_runs_off_the_event_loop(
    store: LocalMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    original = SQLiteConnection.run_sync

    def recording(self: SQLiteConnection, work: Any, doing: str) -> Any:
        threads.append(threading.get_ident())
        return original(self, work, doing)

    monkeypatch.setattr(SQLiteConnection, "run_sync", recording)
    await store.add("The user prefers dark mode.")
    await store.search("dark", limit=1)
    await store.list()
    assert threads
    assert threading.get_ident() not in threads


def test_usable_from_any_event_loop_and_thread(tmp_path: Path) -> None:
    store = LocalMemoryStore(tmp_path / "threads.sqlite", namespace="alice")
    asyncio.run(store.add("made in the main thread"))
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        async def run() -> None:
            await store.add(f"fact number {index}")
            await asyncio.gather(*(store.search("fact", limit=3) for _ in range(5)))

        try:
            asyncio.run(run())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert asyncio.run(store.count()) == 5


async def test_lone_surrogates_are_refused_in_content_and_kept_elsewhere(
    store: LocalMemoryStore,
) -> None:
    # Text decoded with surrogateescape (a file name): SQLite stores UTF-8 only.
    with pytest.raises(ValueError, match=r"content .* lone surrogate"):
        await store.add("file \udc80 name")
    await store.add("the report file", metadata={"path": "/tmp/\udc80.txt"})
    [entry] = await store.list()
    assert entry.metadata is not None
    assert entry.metadata["path"] == "/tmp/\udc80.txt"
    # Text taken from a conversation is an index of it: the surrogate becomes U+FFFD.
    await store.add_messages([{"role": "user", "content": [{"text": "see quarterly \udcff"}]}])
    assert "see quarterly \ufffd" in contents(await store.search("quarterly", limit=5))
    assert await store.count() == 2


async def test_schema_exists_tells_no_store_from_an_empty_one_and_creates_nothing(
    tmp_path: Path,
) -> None:
    missing = LocalMemoryStore(tmp_path / "sub" / "memory.sqlite", namespace="a")
    assert await missing.schema_exists() is False
    assert not (tmp_path / "sub").exists()
    (tmp_path / "empty.sqlite").touch()
    assert await LocalMemoryStore(tmp_path / "empty.sqlite", namespace="a").schema_exists() is False
    assert (tmp_path / "empty.sqlite").read_bytes() == b""
    made = LocalMemoryStore(tmp_path / "memory.sqlite", namespace="a")
    await made.initialize()  # an empty store: tables, no memory
    assert await LocalMemoryStore(tmp_path / "memory.sqlite", namespace="b").schema_exists()
    made.close()
    (tmp_path / "junk.sqlite").write_bytes(b"junk" * 1000)
    with pytest.raises(MemoryStoreError):
        await LocalMemoryStore(tmp_path / "junk.sqlite", namespace="a").schema_exists()
