"""PostgresMemoryStore: long-term memory in PostgreSQL, full-text and hybrid search.

The same contract as :class:`~perdure.memory.LocalMemoryStore` (the rules are
shared: :mod:`perdure.memory.rules`), on PostgreSQL (``perdure[postgres]``; the
pool, the schema's creation and version and the translation of psycopg's errors are
:mod:`perdure._runtime.postgres`'s). The tables, in the store's schema (version 1)::

    perdure_memories(id bigint identity PRIMARY KEY,
                     namespace text COLLATE "C",          -- whose memory
                     content, content_key,                -- UNIQUE (namespace, content_key)
                     metadata,                            -- JSON text
                     created_at double precision,         -- server time, epoch seconds
                     terms tsvector GENERATED ALWAYS AS   -- GIN index
                         (to_tsvector('english', content)) STORED,
                     embedding real[], embedding_model)   -- optional, beside the text
    perdure_memory_generations(namespace PRIMARY KEY,     -- bumped by every write in
                               generation)                -- the namespace's statement

- **Full-text search**: a query is cut into words as ``LocalMemoryStore`` cuts it
  (stop words dropped when others remain), and a memory matches when it holds any
  of them (OR of the words, each stemmed by PostgreSQL's ``english`` configuration,
  which also drops its own stop words). Matches are ranked by ``ts_rank_cd``
  (cover density, divided by ``1 + log(length)``). User text never reaches the
  query parser as syntax: only words of letters and digits are searched for.
- **Namespaces isolate users**: every statement names the namespace in its
  ``WHERE`` clause (search, list, count, delete, clear, backfill); ids of another
  namespace are ignored.
- **Hybrid search** with an ``embedder``: vectors are stored beside the text (a
  ``real[]``, unit length) when a memory is added, and a search fuses the text
  ranking with the vector ranking by reciprocal rank fusion, as ``LocalMemoryStore``
  does. The vector ranking runs in the server with pgvector when the database has
  the ``vector`` extension (or may create it); pgvector is not packaged for
  PostgreSQL 15 on the machines perdure is tested on, so there the store ranks in
  Python: it keeps the namespace's vectors in memory (4 bytes per dimension per
  memory) and, when the namespace's generation moved (any write in the
  namespace, by anyone, bumps it in the same statement), reads again only what
  changed: the ids, and the vectors it does not hold yet.
- **Duplicates**: adding text the namespace already holds (same text, ignoring
  case and whitespace) does nothing, so extraction (at least once) never duplicates
  a memory — and every write may be sent again: when the server goes away, writes
  and reads are retried until ``reconnect_timeout``, then
  :class:`~perdure.errors.StoreUnavailableError` (``details["outcome"] ==
  "unknown"`` for a write).
- **Durable** on return (``synchronous_commit`` turned on should the server have it
  off). Errors: :class:`~perdure.errors.MemoryStoreLockedError` for a lock held
  elsewhere, :class:`~perdure.errors.MemoryStoreError` for damage
  (``details["fault"] == "damage"``: a table altered behind perdure's back, a
  stored vector or metadata that is not what perdure wrote) and any other failure
  — never a psycopg exception. Text PostgreSQL cannot hold (NUL) is refused by
  ``add`` and replaced by U+FFFD in ``add_messages``.
- **Any loop, any thread**: psycopg runs in worker threads on a per-process,
  thread-safe pool. The constructor does no I/O.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from perdure._runtime.checks import check_seconds
from perdure._runtime.postgres import (
    DURABLE_COMMITS,
    PostgresDatabase,
    PostgresErrors,
    SchemaMigration,
    SchemaPart,
    quote_ident,
)
from perdure._runtime.threads import ProcessLock
from perdure.crypto import Cipher, check_cipher, seal, unseal
from perdure.errors import (
    MemoryStoreError,
    MemoryStoreLockedError,
    SchemaVersionError,
    StoreUnavailableError,
)
from perdure.memory.embedder import Embedder
from perdure.memory.entry import MemoryEntry
from perdure.memory.rules import (
    check_embedder,
    check_limit,
    check_name,
    check_namespace,
    content_items,
    content_key,
    embed_texts,
    fuse_rankings,
    import_numpy,
    lexical_scan,
    memory_entry,
    message_items,
    meta_json,
    query_terms,
    rotated,
)
from perdure.memory.store import MemoryStore
from perdure.types import Message

__all__ = ["MEMORY_VERSION", "TEXT_SEARCH_CONFIG", "PostgresMemoryStore"]

MEMORY_VERSION = 1
"""The version of the memory tables this perdure writes (``perdure_schema_version``)."""

TEXT_SEARCH_CONFIG = "english"
"""PostgreSQL's text search configuration the index and the queries use."""

_log = logging.getLogger(__name__)

_ERRORS = PostgresErrors(
    unavailable=StoreUnavailableError,
    locked=MemoryStoreLockedError,
    damage=MemoryStoreError,
    failure=MemoryStoreError,
    version=SchemaVersionError,
)
"""This layer's error for each fault of a driver error."""


def _statements(q: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {q}.perdure_memories (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            namespace text COLLATE "C" NOT NULL,
            content text NOT NULL,
            content_key text NOT NULL,
            metadata text,
            created_at double precision NOT NULL,
            terms tsvector GENERATED ALWAYS AS
                (to_tsvector('{TEXT_SEARCH_CONFIG}'::regconfig, content)) STORED,
            embedding real[],
            embedding_model text,
            UNIQUE (namespace, content_key)
        )""",
        f"CREATE INDEX IF NOT EXISTS perdure_memories_terms ON {q}.perdure_memories "
        "USING gin (terms)",
        f"CREATE INDEX IF NOT EXISTS perdure_memories_namespace ON {q}.perdure_memories "
        "(namespace, id)",
        f"""CREATE TABLE IF NOT EXISTS {q}.perdure_memory_generations (
            namespace text COLLATE "C" PRIMARY KEY,
            generation bigint NOT NULL
        )""",
    ]


MEMORY = SchemaPart(
    component="memory",
    version=MEMORY_VERSION,
    tables={
        "perdure_memories": (
            "id", "namespace", "content", "content_key", "metadata", "created_at", "terms",
            "embedding", "embedding_model",
        ),
        "perdure_memory_generations": ("namespace", "generation"),
    },
    statements=_statements,
    cli_option="--memory",
)  # fmt: skip
"""The memory store's tables."""


@dataclass
class _Vectors:
    """A namespace's vectors as the Python ranking holds them."""

    generation: int
    ids: Any  # numpy int64 array
    matrix: Any  # numpy float32 array, one unit row per memory


class _Statements:
    """The store's SQL, for one schema (names quoted once)."""

    def __init__(self, q: str) -> None:
        m = f"{q}.perdure_memories"
        g = f"{q}.perdure_memory_generations"
        self.table = m
        # Row i's vector: the i-th run of dim numbers of one flat real[] parameter,
        # converted once (in a MATERIALIZED CTE), not once per row.
        flat = "flat AS MATERIALIZED (SELECT %(vectors)b::real[] AS a), "
        vector = "flat.a[(u.i::int - 1) * %(dim)s::int + 1 : u.i::int * %(dim)s::int]"
        bump = (
            f"INSERT INTO {g} (namespace, generation) SELECT %(ns)s, 1 "
            "WHERE EXISTS (SELECT 1 FROM changed) "
            f"ON CONFLICT (namespace) DO UPDATE SET generation = {g}.generation + 1"
        )

        def add(vectors: bool) -> str:
            embedding = f"{vector}, %(model)s" if vectors else "NULL, NULL"
            return (
                f"WITH {flat if vectors else ''}changed AS (INSERT INTO {m} (namespace, content, "
                "content_key, metadata, created_at, embedding, embedding_model) "
                "SELECT %(ns)s, u.content, u.key, u.meta, "
                f"extract(epoch FROM clock_timestamp()), {embedding} "
                "FROM unnest(%(contents)s::text[], %(keys)s::text[], %(metas)s::text[]) "
                f"WITH ORDINALITY AS u(content, key, meta, i){', flat' if vectors else ''} "
                "ON CONFLICT (namespace, content_key) DO NOTHING RETURNING 1), "
                f"bumped AS ({bump}) SELECT count(*) FROM changed"
            )

        self.add_plain = add(False)
        self.add_embedded = add(True)
        self.search = (
            f"SELECT id, content, metadata, created_at, ts_rank_cd(terms, query, 1) AS rank "
            f"FROM {m}, to_tsquery('{TEXT_SEARCH_CONFIG}', %(query)s) AS query "
            "WHERE namespace = %(ns)s AND terms @@ query "
            "ORDER BY rank DESC, id LIMIT %(limit)s"
        )
        self.fetch = (
            f"SELECT id, content, metadata, created_at FROM {m} "
            "WHERE namespace = %(ns)s AND id = ANY(%(ids)s)"
        )
        self.count = f"SELECT count(*) FROM {m} WHERE namespace = %(ns)s"
        self.namespaces = f"SELECT DISTINCT namespace FROM {m} ORDER BY namespace"
        self.list = (
            f"SELECT id, content, metadata, created_at FROM {m} WHERE namespace = %(ns)s "
            "ORDER BY id LIMIT %(limit)s OFFSET %(offset)s"
        )
        self.delete = (
            f"WITH changed AS (DELETE FROM {m} WHERE namespace = %(ns)s AND id = ANY(%(ids)s) "
            f"RETURNING 1), bumped AS ({bump}) SELECT count(*) FROM changed"
        )
        self.clear = (
            f"WITH changed AS (DELETE FROM {m} WHERE namespace = %(ns)s RETURNING 1), "
            f"bumped AS ({bump}) SELECT count(*) FROM changed"
        )
        self.unembedded = (
            f"SELECT id, content FROM {m} WHERE namespace = %(ns)s AND "
            "(embedding IS NULL OR embedding_model IS DISTINCT FROM %(model)s) "
            "ORDER BY id LIMIT %(limit)s"
        )
        self.embed = (
            f"WITH {flat}v AS (SELECT u.id, {vector} AS e "
            "FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, i), flat), "
            f"changed AS (UPDATE {m} SET embedding = v.e, embedding_model = %(model)s FROM v "
            f"WHERE {m}.id = v.id AND {m}.namespace = %(ns)s RETURNING 1), "
            f"bumped AS ({bump}) SELECT count(*) FROM changed"
        )
        self.generation = f"SELECT generation FROM {g} WHERE namespace = %(ns)s"
        self.after = (
            f"SELECT id, content, metadata FROM {m} WHERE namespace = %(ns)s AND id > %(after)s "
            "ORDER BY id LIMIT %(limit)s"
        )
        # A memory whose text another holds under the new key already (added twice
        # mid-rotation) goes; the others are sealed again.
        self.drop_duplicate = (
            f"DELETE FROM {m} WHERE id = %(id)s AND EXISTS (SELECT 1 FROM {m} o "
            "WHERE o.namespace = %(ns)s AND o.content_key = %(key)s AND o.id <> %(id)s)"
        )
        self.reseal = (
            f"UPDATE {m} SET content = %(content)s, content_key = %(key)s, "
            "metadata = %(meta)s WHERE id = %(id)s AND namespace = %(ns)s"
        )
        # array_send: the vectors in PostgreSQL's binary array format, which numpy
        # reads without a Python float per number (see _decode_vectors).
        self.vector_ids = (
            f"SELECT id FROM {m} WHERE namespace = %(ns)s "
            "AND embedding_model = %(model)s AND embedding IS NOT NULL ORDER BY id"
        )
        self.vectors = (
            f"SELECT id, array_send(embedding) FROM {m} WHERE namespace = %(ns)s "
            "AND embedding_model = %(model)s AND embedding IS NOT NULL AND id = ANY(%(ids)s) "
            "ORDER BY id"
        )


class PostgresMemoryStore(MemoryStore):
    """Memories in PostgreSQL: full-text search ranked by ``ts_rank_cd``, optionally
    hybrid (see the module docstring).

    Args:
        dsn: a libpq connection string or URL (``postgresql://user@host/db``).
        namespace: whose memories these are (a user id, say).
        schema: the schema holding the tables (made on first use).
        embedder: an :class:`~perdure.memory.Embedder` for hybrid search (needs
            numpy, which ``perdure[embeddings]`` brings), or None for text only.
        name: the store's name in results and tool configs.
        min_similarity: vector matches below this cosine similarity are ignored.
        max_connections: the most connections one process opens.
        connect_timeout: seconds to wait for a connection.
        reconnect_timeout: seconds a call waits for a server that went away before
            raising ``StoreUnavailableError``.
        cipher: a :class:`~perdure.crypto.Cipher` (SPEC §9): each memory's content
            and metadata are stored encrypted and the duplicate check is keyed. The
            server's text index is generated from the stored content, so it then
            indexes ciphertext only: nothing of the text is in clear, and a search
            decrypts every memory of the namespace and counts the query's words
            (linear in the namespace; no embeddings are stored, being derived from
            the plaintext). :class:`~perdure.memory.LocalMemoryStore` can keep a
            plaintext index instead (``searchable=True``).

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
    """

    def __init__(
        self,
        dsn: str,
        *,
        namespace: str,
        schema: str = "perdure",
        embedder: Embedder | None = None,
        name: str = "postgres",
        min_similarity: float = 0.25,
        max_connections: int = 4,
        connect_timeout: float = 10.0,
        reconnect_timeout: float = 15.0,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        check_namespace(namespace)
        check_name(name)
        if embedder is not None:
            check_embedder(embedder)
            self._np = import_numpy()
        if isinstance(min_similarity, bool) or not isinstance(min_similarity, int | float):
            raise TypeError(f"min_similarity must be a number, got {min_similarity!r}")
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        check_seconds("connect_timeout", connect_timeout)
        check_seconds("reconnect_timeout", reconnect_timeout)
        self.db = PostgresDatabase(
            dsn,
            schema=schema,
            part=MEMORY,
            errors=_ERRORS,
            what="PostgreSQL memory store",
            max_connections=max_connections,
            connect_timeout=float(connect_timeout),
            reconnect_timeout=float(reconnect_timeout),
            configure=DURABLE_COMMITS,
        )
        self.schema = self.db.schema
        self.namespace = namespace
        self.embedder = embedder
        self.name = name
        self.min_similarity = float(min_similarity)
        self._sql = _Statements(self.db.q)
        self._vectors: _Vectors | None = None
        self._vectors_lock = ProcessLock()
        self._pgvector: str | None = None
        self._pgvector_looked = False

    def __repr__(self) -> str:
        return (
            f"PostgresMemoryStore({self.db.server!r}, schema={self.schema!r}, "
            f"namespace={self.namespace!r}, embedder={self.embedder!r})"
        )

    def close(self) -> None:
        """Close this process's connections (the next call opens new ones)."""
        self.db.close()

    # ------------------------------------------------------------------ protocol

    async def initialize(self) -> None:
        """Connect and make the schema (also done lazily by the first call)."""
        await self.db.run(lambda conn: None, doing="opening")

    async def schema_exists(self) -> bool:
        """Whether the memory tables exist in the schema; creates nothing, so a reader
        can tell "no store here" from an empty store.

        Raises:
            MemoryStoreError, StoreUnavailableError: the server failed or stayed away.
        """
        return await asyncio.to_thread(self.db.schema_exists)

    async def migrate_schema(self, *, dry_run: bool = False) -> SchemaMigration:
        """Make the memory tables, or upgrade them to this perdure's version (``perdure
        migrate-schema --memory``), for every namespace of the schema; see
        :meth:`PostgresDatabase.migrate <perdure._runtime.postgres.PostgresDatabase.migrate>`.

        Raises:
            SchemaVersionError: the tables are newer than this perdure, or too old to
                upgrade.
        """
        return await asyncio.to_thread(self.db.migrate, dry_run=dry_run)

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        """The ``limit`` memories of this namespace most relevant to ``query``, best first.

        Scores are ``ts_rank_cd`` without an embedder and reciprocal-rank-fusion
        scores with one; higher is better. Metadata carries ``memory_id`` and
        ``created_at`` beside what was stored.

        Raises:
            TypeError, ValueError: ``query`` is not a str or ``limit`` not an int >= 1.
            MemoryStoreError: the server refused, or stored data is damaged.
            StoreUnavailableError: the server stayed away.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        check_limit(limit)
        terms = query_terms(query)
        if self.cipher is not None:
            if not terms:
                return []
            return await self.db.run(lambda conn: self._scan(conn, terms, limit), doing="searching")
        if self.embedder is None:
            if not terms:
                return []
            rows = await self.db.run(
                lambda conn: self._lexical(conn, terms, limit), doing="searching"
            )
            return [self._entry(row[:4], float(row[4])) for row in rows]
        if not query.strip():
            return []
        return await asyncio.to_thread(self._hybrid_search, query, terms, limit)

    async def add(self, content: str, *, metadata: dict[str, Any] | None = None) -> None:
        """Remember ``content`` in this namespace; nothing happens if it is already there.

        Durable when the coroutine returns.

        Raises:
            TypeError, ValueError: empty content, content holding NUL or a lone
                surrogate, or metadata that is not a JSON object without the
                reserved keys ``memory_id`` / ``created_at``.
            MemoryStoreError, StoreUnavailableError: the server failed.
        """
        await self.add_many([content], metadata=metadata)

    async def add_messages(
        self, messages: Sequence[Message], *, metadata: dict[str, Any] | None = None
    ) -> None:
        """Remember the text of each user and assistant message, with its ``role``.

        Tool calls and results are skipped; NUL and lone surrogates become U+FFFD.
        Duplicate-tolerant like :meth:`add`.
        """
        items = message_items(messages, metadata, nul=True)
        if items:
            await asyncio.to_thread(self._insert, items)

    # ---------------------------------------------------------------- hygiene

    async def add_many(
        self, contents: Sequence[str], *, metadata: dict[str, Any] | None = None
    ) -> int:
        """Remember several texts in one statement; return how many were new.

        Raises:
            TypeError, ValueError: like :meth:`add`.
            MemoryStoreError, StoreUnavailableError: the server failed.
        """
        items = content_items(
            contents,
            metadata,
            nul=True,
            unstorable="holds NUL or a lone surrogate, which PostgreSQL text cannot store",
        )
        if not items:
            return 0
        return await asyncio.to_thread(self._insert, items)

    async def count(self) -> int:
        """How many memories this namespace holds."""
        row = await self.db.run(
            lambda conn: conn.execute(self._sql.count, {"ns": self.namespace}).fetchone(),
            doing="counting memories",
        )
        return int(row[0]) if row is not None else 0

    async def namespaces(self) -> list[str]:
        """Every namespace with memories in this store's schema (``perdure rotate-keys
        --memory`` rotates each)."""
        rows = await self.db.run(
            lambda conn: conn.execute(self._sql.namespaces).fetchall(), doing="listing namespaces"
        )
        return [str(row[0]) for row in rows]

    async def delete(self, memory_ids: int | Sequence[int]) -> int:
        """Forget memories by id (``metadata["memory_id"]``); return how many went.

        Ids of other namespaces or unknown ids are ignored. Durable on return.
        """
        ids = [memory_ids] if isinstance(memory_ids, int) else list(memory_ids)
        for memory_id in ids:
            if isinstance(memory_id, bool) or not isinstance(memory_id, int):
                raise TypeError(f"memory_ids must be ints, got {memory_id!r}")
        return await self._write(
            self._sql.delete, {"ns": self.namespace, "ids": ids}, doing="deleting memories"
        )

    async def clear(self) -> int:
        """Forget every memory of this namespace (e.g. a user's right to erasure)."""
        return await self._write(
            self._sql.clear, {"ns": self.namespace}, doing="clearing the namespace"
        )

    async def rotate_keys(self, *, force: bool = False, batch_size: int = 500) -> int:
        """Re-encrypt this namespace's memories under the cipher's active key; return
        how many.

        As :meth:`LocalMemoryStore.rotate_keys <perdure.memory.LocalMemoryStore.rotate_keys>`,
        for this store's namespace: each batch is one transaction, so a killed
        rotation resumes when called again.

        Raises:
            ValueError: the store has no cipher.
            DecryptionError: a memory is under a key the cipher does not hold.
        """
        cipher = self.cipher
        if cipher is None:
            raise ValueError("rotate_keys needs a store opened with cipher=")
        check_limit(batch_size, "batch_size")
        done, after = 0, 0
        while True:
            params = {"ns": self.namespace, "after": after, "limit": batch_size}
            rows = await self.db.run(
                functools.partial(_fetch_all, sql=self._sql.after, params=params),
                doing="reading memories to re-encrypt",
            )
            if not rows:
                return done
            after = int(rows[-1][0])
            changes: list[dict[str, Any]] = []
            for memory_id, content, metadata in rows:
                sealed = rotated(cipher, content, metadata, force)
                if sealed is not None:
                    text, key, meta = sealed
                    change = {"content": text, "key": key, "meta": meta}
                    changes.append({"id": int(memory_id), "ns": self.namespace, **change})
            if changes:
                await asyncio.to_thread(
                    self.db.call,
                    functools.partial(self._reseal, changes=changes),
                    doing="re-encrypting memories",
                )
                done += len(changes)

    def _reseal(self, conn: psycopg.Connection[Any], *, changes: list[dict[str, Any]]) -> None:
        with conn.transaction():
            for change in changes:
                conn.execute(self._sql.drop_duplicate, change)
                conn.execute(self._sql.reseal, change)

    async def backfill_embeddings(self, *, batch_size: int = 256) -> int:
        """Embed this namespace's memories that lack a vector of the current embedder.

        Returns how many were embedded (0 without an embedder).
        """
        check_limit(batch_size, "batch_size")
        if self.embedder is None or self.cipher is not None:
            return 0
        return await asyncio.to_thread(self._backfill, batch_size)

    # ------------------------------------------------------------------ internals

    def _entry(self, row: Sequence[Any], score: float | None) -> MemoryEntry:
        memory_id, content, metadata, created_at = row
        # Sealed text read without the key is DecryptionError, never ciphertext as content.
        return memory_entry(
            int(memory_id),
            unseal(self.cipher, content),
            unseal(self.cipher, metadata),
            float(created_at),
            store_name=self.name,
            score=score,
        )

    async def _write(self, sql: str, params: dict[str, Any], *, doing: str) -> int:
        """A write that may be sent twice (it leaves what sending it once leaves)."""
        try:
            row = await self.db.run(lambda conn: conn.execute(sql, params).fetchone(), doing=doing)
        except StoreUnavailableError as exc:
            exc.details["outcome"] = "unknown"
            raise
        return int(row[0]) if row is not None else 0

    def _write_sync(self, sql: str, params: dict[str, Any], *, doing: str) -> int:
        try:
            row = self.db.call(lambda conn: conn.execute(sql, params).fetchone(), doing=doing)
        except StoreUnavailableError as exc:
            exc.details["outcome"] = "unknown"
            raise
        return int(row[0]) if row is not None else 0

    def _lexical(
        self, conn: psycopg.Connection[Any], terms: list[str], limit: int
    ) -> list[tuple[Any, ...]]:
        # Each term is letters and digits only (query_terms): quoted, none of it is
        # read as tsquery syntax, and "|" makes it an OR.
        expression = " | ".join(f"'{term}'" for term in terms)
        return conn.execute(
            self._sql.search, {"query": expression, "ns": self.namespace, "limit": limit}
        ).fetchall()

    def _scan(
        self, conn: psycopg.Connection[Any], terms: list[str], limit: int
    ) -> list[MemoryEntry]:
        """The search of an encrypted store: decrypt every memory and count words."""
        rows = conn.execute(
            self._sql.list, {"ns": self.namespace, "limit": None, "offset": 0}
        ).fetchall()
        by_id = {int(row[0]): row for row in rows}
        texts = ((memory_id, unseal(self.cipher, row[1])) for memory_id, row in by_id.items())
        return [self._entry(by_id[i], score) for i, score in lexical_scan(texts, terms, limit)]

    def _insert(self, items: list[tuple[str, dict[str, Any]]]) -> int:
        """Blocking: embed (before taking a connection), then insert in one statement."""
        contents = [content for content, _ in items]
        cipher = self.cipher
        params: dict[str, Any] = {
            "ns": self.namespace,
            "contents": [seal(cipher, content) for content in contents],
            "keys": [content_key(content, cipher) for content in contents],
            "metas": [seal(cipher, meta_json(meta)) if meta else None for _, meta in items],
        }
        sql = self._sql.add_plain
        if self.embedder is not None and cipher is None:
            matrix = embed_texts(self.embedder, self._np, contents)
            params.update(
                vectors=matrix.reshape(-1).tolist(),
                dim=self.embedder.dimension,
                model=self.embedder.model_id,
            )
            sql = self._sql.add_embedded
        return self._write_sync(sql, params, doing="adding memories")

    def _backfill(self, batch_size: int) -> int:
        assert self.embedder is not None
        model_id = self.embedder.model_id
        done = 0
        while True:
            rows = self.db.call(
                lambda conn: conn.execute(
                    self._sql.unembedded,
                    {"ns": self.namespace, "model": model_id, "limit": batch_size},
                ).fetchall(),
                doing="reading memories to embed",
            )
            if not rows:
                return done
            matrix = embed_texts(self.embedder, self._np, [content for _, content in rows])
            self._write_sync(
                self._sql.embed,
                {
                    "ns": self.namespace,
                    "ids": [int(memory_id) for memory_id, _ in rows],
                    "vectors": matrix.reshape(-1).tolist(),
                    "dim": self.embedder.dimension,
                    "model": model_id,
                },
                doing="storing embeddings",
            )
            done += len(rows)

    def _hybrid_search(self, query: str, terms: list[str], limit: int) -> list[MemoryEntry]:
        """Blocking: fuse the text and vector rankings with reciprocal rank fusion."""
        assert self.embedder is not None
        depth = max(limit * 4, 20)
        lexical: list[int] = []
        if terms:
            rows = self.db.call(lambda conn: self._lexical(conn, terms, depth), doing="searching")
            lexical = [int(row[0]) for row in rows]
        query_vector = embed_texts(self.embedder, self._np, [query])[0]
        pgvector = self._pgvector_schema()
        if pgvector is not None:
            semantic = self._semantic_in_server(pgvector, query_vector, depth)
        else:
            semantic = self._semantic_in_python(query_vector, depth)
        best = fuse_rankings(lexical, semantic)[: limit * 2]
        ids = [memory_id for memory_id, _ in best]
        rows = self.db.call(
            lambda conn: conn.execute(
                self._sql.fetch, {"ns": self.namespace, "ids": ids}
            ).fetchall(),
            doing="reading memories",
        )
        by_id = {int(row[0]): row for row in rows}
        entries = [self._entry(by_id[i], score) for i, score in best if i in by_id]
        return entries[:limit]

    def _semantic_in_python(self, query_vector: Any, depth: int) -> list[int]:
        np = self._np
        index = self._vector_index()
        if not len(index.ids):
            return []
        similarities = index.matrix @ query_vector
        count = min(depth, len(similarities))
        top = np.argpartition(-similarities, count - 1)[:count]
        top = top[np.argsort(-similarities[top], kind="stable")]
        return [int(index.ids[i]) for i in top if similarities[i] >= self.min_similarity]

    def _vector_index(self) -> _Vectors:
        """The namespace's vectors, brought up to date when its generation moved.

        Only what changed is read again: the ids of the namespace's vectors, then
        the vectors of the ids not held yet (added, or given a vector by a
        backfill); ids no longer there (deleted) are dropped. Memories are never
        given another vector of the same model, so a vector held stays right.
        """
        assert self.embedder is not None
        np = self._np
        params: dict[str, Any] = {"ns": self.namespace, "model": self.embedder.model_id}
        with self._vectors_lock:
            row = self.db.call(
                lambda conn: conn.execute(self._sql.generation, params).fetchone(),
                doing="checking for changes",
            )
            current = 0 if row is None else int(row[0])
            held = self._vectors
            if held is not None and held.generation == current:
                return held
            held_ids = set() if held is None else set(held.ids.tolist())

            def load(conn: psycopg.Connection[Any]) -> tuple[int, list[int], list[Any]]:
                # One snapshot: the vectors are exactly those of the generation read.
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    found = conn.execute(self._sql.generation, params).fetchone()
                    ids = [int(i) for (i,) in conn.execute(self._sql.vector_ids, params)]
                    new = [i for i in ids if i not in held_ids]
                    # Binary: the bytea arrives as it is stored, not as hex text.
                    rows = (
                        conn.execute(
                            self._sql.vectors, {**params, "ids": new}, binary=True
                        ).fetchall()
                        if new
                        else []
                    )
                return (0 if found is None else int(found[0])), ids, rows

            generation, ids, rows = self.db.call(load, doing="loading vectors")
            new_ids, new_matrix = self._decode_vectors(rows)
            if held is not None and len(held.ids):
                keep = np.isin(held.ids, np.asarray(ids, dtype=np.int64))
                new_ids = np.concatenate([held.ids[keep], new_ids])
                new_matrix = np.concatenate([held.matrix[keep], new_matrix])
                order = np.argsort(new_ids, kind="stable")
                new_ids, new_matrix = new_ids[order], new_matrix[order]
            self._vectors = _Vectors(generation, new_ids, new_matrix)
            return self._vectors

    def _decode_vectors(self, rows: list[tuple[Any, ...]]) -> tuple[Any, Any]:
        """``(ids, matrix)`` from ``array_send`` of each row's ``real[]``.

        The format: five big-endian int32 (dimensions 1, no NULLs, element type 700
        (real), length, lower bound 1), then per element its length (4) and its
        big-endian float32.

        Raises:
            MemoryStoreError: a stored vector is not one perdure wrote for this
                embedder (``details["fault"] == "damage"``).
        """
        assert self.embedder is not None
        np = self._np
        dimension = self.embedder.dimension
        width = 20 + 8 * dimension
        ids = np.fromiter((int(row[0]) for row in rows), dtype=np.int64, count=len(rows))
        if not rows:
            return ids, np.zeros((0, dimension), dtype=np.float32)
        for memory_id, blob in rows:
            if len(blob) != width:
                raise self._bad_vector(int(memory_id), f"{len(blob)} bytes, not {width}")
        data = b"".join(bytes(blob) for _, blob in rows)
        words = np.frombuffer(data, dtype=">i4").reshape(len(rows), 5 + 2 * dimension)
        header_ok = (words[:, :5] == np.array([1, 0, 700, dimension, 1])).all(axis=1)
        lengths_ok = (words[:, 5::2] == 4).all(axis=1)
        bad = np.flatnonzero(~(header_ok & lengths_ok))
        if len(bad):
            raise self._bad_vector(int(ids[bad[0]]), "not a real[] without NULLs")
        matrix = np.frombuffer(data, dtype=">f4").reshape(len(rows), 5 + 2 * dimension)
        return ids, np.ascontiguousarray(matrix[:, 6::2], dtype=np.float32)

    def _bad_vector(self, memory_id: int, why: str) -> MemoryStoreError:
        assert self.embedder is not None
        return MemoryStoreError(
            f"PostgreSQL memory store {self.db.where}: the vector of memory {memory_id} "
            f"is damaged: {why} ({self.embedder.model_id} has {self.embedder.dimension} "
            "dimensions)",
            details={"fault": "damage", "memory_id": memory_id},
        )

    # ------------------------------------------------------------------ pgvector

    def _pgvector_schema(self) -> str | None:
        """The schema of the ``vector`` extension, once it is there (None: rank in Python).

        Looked up once per store: installed, it is used; available but not
        installed, the store tries to install it (a role without the right keeps
        the Python ranking).
        """
        if self._pgvector_looked:
            return self._pgvector

        def look(conn: psycopg.Connection[Any]) -> str | None:
            find = (
                "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                "ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
            )
            row = conn.execute(find).fetchone()
            if row is not None:
                return str(row[0])
            available = conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
            ).fetchone()
            if available is None:
                return None
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except psycopg.errors.InsufficientPrivilege as exc:
                _log.info(
                    "pgvector is available but cannot be installed (%s): ranking in Python", exc
                )
                return None
            row = conn.execute(find).fetchone()
            return None if row is None else str(row[0])

        schema = self.db.call(look, doing="looking for pgvector")
        self._pgvector, self._pgvector_looked = schema, True
        return schema

    def _semantic_in_server(self, schema: str, query_vector: Any, depth: int) -> list[int]:
        """The vector ranking by pgvector's inner product, in the server."""
        assert self.embedder is not None
        vs = quote_ident(schema)
        distance = f"embedding::{vs}.vector OPERATOR({vs}.<#>) %(query)s::real[]::{vs}.vector"
        sql = (
            f"SELECT id, -({distance}) AS similarity FROM {self._sql.table} "
            "WHERE namespace = %(ns)s AND embedding_model = %(model)s "
            f"AND embedding IS NOT NULL ORDER BY {distance}, id LIMIT %(depth)s"
        )
        params = {
            "ns": self.namespace,
            "model": self.embedder.model_id,
            "query": query_vector.tolist(),
            "depth": depth,
        }
        rows = self.db.call(
            lambda conn: conn.execute(sql, params).fetchall(), doing="ranking vectors"
        )
        return [
            int(memory_id) for memory_id, similarity in rows if similarity >= self.min_similarity
        ]

    # Last in the class: from here on, ``list`` in this class body names the method.
    async def list(self, *, limit: int = 100, offset: int = 0) -> builtins.list[MemoryEntry]:
        """This namespace's memories, oldest first, ``limit`` from ``offset``."""
        check_limit(limit)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        rows = await self.db.run(
            lambda conn: conn.execute(
                self._sql.list, {"ns": self.namespace, "limit": limit, "offset": offset}
            ).fetchall(),
            doing="listing memories",
        )
        return [self._entry(row, None) for row in rows]


def _fetch_all(
    conn: psycopg.Connection[Any], *, sql: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()
