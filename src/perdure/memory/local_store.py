"""LocalMemoryStore: long-term memory in one SQLite file, full-text (BM25) and hybrid search.

Layout: a ``memories`` table (one row per memory, unique per namespace and
normalised content) and an FTS5 index over it. Namespaces isolate users inside the
index itself: every indexed word carries a token derived from the namespace, so a
search reads only its own namespace's postings — another user's memories cannot
match, and their number does not slow the search down.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perdure._runtime.threads import ProcessLock
from perdure.crypto import Cipher, check_cipher, seal, unseal
from perdure.memory._sqlite import SQLiteConnection, write_transaction
from perdure.memory.embedder import Embedder
from perdure.memory.entry import MemoryEntry
from perdure.memory.rules import (
    RESERVED_METADATA_KEYS,
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
    words,
)
from perdure.memory.store import MemoryStore
from perdure.types import Message

__all__ = ["RESERVED_METADATA_KEYS", "LocalMemoryStore", "build_match_query", "query_terms"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    content TEXT NOT NULL,
    content_key TEXT NOT NULL,
    terms TEXT NOT NULL,
    metadata TEXT,
    created_at REAL NOT NULL,
    embedding BLOB,
    embedding_model TEXT,
    UNIQUE (namespace, content_key)
);
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
    terms, content='memories', content_rowid='id',
    tokenize="porter unicode61 remove_diacritics 2 tokenchars '_'"
);
CREATE TRIGGER IF NOT EXISTS memories_after_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, terms) VALUES (new.id, new.terms);
END;
CREATE TRIGGER IF NOT EXISTS memories_after_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, terms) VALUES ('delete', old.id, old.terms);
END;
"""

_INSERT = (
    "INSERT INTO memories (namespace, content, content_key, terms, metadata, created_at, "
    "embedding, embedding_model) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (namespace, content_key) DO NOTHING"
)

_CONSONANTS = "bcdfghjklmnpqrstvwxz"  # no vowels (nor y): the stemmer ignores the prefix


def _rows_after(conn: sqlite3.Connection, *, after: int, limit: int) -> list[Any]:
    """``(id, content, metadata)`` of the file's memories after id ``after``."""
    return conn.execute(
        "SELECT id, content, metadata FROM memories WHERE id > ? ORDER BY id LIMIT ?",
        (after, limit),
    ).fetchall()


def _namespace_token(namespace: str) -> str:
    """The prefix glued to every indexed word of ``namespace``: ``q`` + 12 consonants + ``_``.

    The index then holds ``<prefix>word`` terms, so each namespace has its own
    postings. Consonants only (from a hash of the namespace), because the Porter
    stemmer's rules look at vowels: with none in the prefix, ``prefix + word`` stems
    exactly like ``word``.
    """
    digest = int.from_bytes(hashlib.sha256(namespace.encode("utf-8")).digest()[:8], "big")
    letters = "".join(_CONSONANTS[(digest // 20**i) % 20] for i in range(12))
    return f"q{letters}_"


def _index_terms(prefix: str, text: str) -> str:
    return " ".join(prefix + word for word in words(text))


def build_match_query(prefix: str, terms: Sequence[str]) -> str:
    """An FTS5 expression matching any of ``terms`` (OR), each quoted as a string.

    Quoting (with ``"`` doubled) means nothing in user text — ``AND``, ``NEAR``,
    ``*``, ``:``, parentheses, quotes — is read as FTS5 syntax.
    """
    return " OR ".join('"' + (prefix + term).replace('"', '""') + '"' for term in terms)


@dataclass
class _VectorIndex:
    generation: tuple[int, int]
    ids: Any  # numpy int64 array
    matrix: Any  # numpy float32 array, one normalised row per memory


class LocalMemoryStore(MemoryStore):
    """Memories in a local SQLite file: BM25 full-text search, optionally hybrid.

    A query is tokenised into words (stop words dropped when others remain); a
    memory matches when it contains any of them (OR, with English stemming), and
    matches are ranked by BM25. User text is quoted, so it can never break the
    query. With an ``embedder``, memories are also embedded when added and a search
    fuses the BM25 ranking with a vector-similarity ranking (reciprocal rank
    fusion), so a memory can be found by meaning without sharing a word.

    Namespaces isolate users: a store sees only its own namespace's memories, for
    search, list, delete and clear. Adding content that is already stored in the
    namespace (same text, ignoring case and whitespace) does nothing, so repeated
    extraction (at least once) never duplicates a memory.

    With an embedder, a search holds the namespace's vectors in memory (4 bytes
    per dimension per memory), reloaded after any write.

    Durability: every write is committed with ``synchronous=FULL`` in WAL mode
    before the coroutine returns; deleted memories are overwritten on disk
    (``secure_delete``). I/O runs in worker threads; coroutines may be
    awaited from any event loop and thread. SQLite errors surface as
    :class:`~perdure.memory.MemoryStoreError`.

    Args:
        path: the SQLite file (created with its directory), or ``":memory:"``.
        namespace: whose memories these are (a user id, say).
        embedder: an :class:`~perdure.memory.Embedder` for hybrid search (needs
            numpy, which ``perdure[embeddings]`` brings), or None for BM25 only.
        name: the store's name in results and tool configs.
        min_similarity: vector matches below this cosine similarity are ignored.
        cipher: a :class:`~perdure.crypto.Cipher` (SPEC §9): each memory's content
            and metadata are stored encrypted, and the duplicate check uses the
            cipher's keyed fingerprint instead of a sha256.
        searchable: with a ``cipher``, whether the full-text index (and the
            embeddings) are kept. They are derived from the plaintext, so they
            are plaintext: the index holds every word of every memory, and an
            embedding can be inverted to text close to the memory. ``True`` (the
            default) keeps search fast and says so; ``False`` stores no index
            and no vectors, and a search decrypts every memory of the namespace
            and counts the query's words in each (linear in the namespace).

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        namespace: str,
        embedder: Embedder | None = None,
        name: str = "local",
        min_similarity: float = 0.25,
        cipher: Cipher | None = None,
        searchable: bool = True,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(searchable, bool):
            raise TypeError(f"searchable must be a bool, got {type(searchable).__name__}")
        if cipher is None and not searchable:
            raise ValueError("searchable=False only applies with a cipher (nothing to hide)")
        self.searchable = searchable
        if not isinstance(path, str | Path):
            raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
        if not str(path):
            raise ValueError("path must not be empty")
        check_namespace(namespace)
        check_name(name)
        if embedder is not None:
            check_embedder(embedder)
            self._np = import_numpy()
        if isinstance(min_similarity, bool) or not isinstance(min_similarity, int | float):
            raise TypeError(f"min_similarity must be a number, got {min_similarity!r}")
        self.path = path if str(path) == ":memory:" else Path(path)
        self.namespace = namespace
        self.embedder = embedder
        self.name = name
        self.min_similarity = float(min_similarity)
        self._prefix = _namespace_token(namespace)
        self._db = SQLiteConnection(path, _SCHEMA, "memory store")
        self._writes = 0  # bumped by this store's own writes (data_version misses them)
        self._vectors: _VectorIndex | None = None
        self._vectors_lock = ProcessLock()

    # ------------------------------------------------------------------ protocol

    async def initialize(self) -> None:
        """Open the file and create the schema (also done lazily by the first call)."""
        await self._db.run(lambda conn: None, "opening")

    async def schema_exists(self) -> bool:
        """Whether the file holds a memory store's tables; creates nothing (no file,
        no table), so a reader can tell "no store here" from an empty store.

        Raises:
            MemoryStoreError: the file is no SQLite database, or cannot be read.
        """
        return await asyncio.to_thread(self._db.has_table, "memories")

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        """The ``limit`` memories of this namespace most relevant to ``query``, best first.

        Scores are ``-bm25`` without an embedder and reciprocal-rank-fusion scores
        with one; higher is better. Metadata carries ``memory_id`` and
        ``created_at`` beside what was stored.

        Raises:
            TypeError, ValueError: ``query`` is not a str or ``limit`` not an int >= 1.
            MemoryStoreError: SQLite failed.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        check_limit(limit)
        terms = query_terms(query)
        if not self.searchable:
            if not terms:
                return []
            return await self._db.run(lambda conn: self._scan(conn, terms, limit), "searching")
        if self.embedder is None:
            if not terms:
                return []
            return await self._db.run(
                lambda conn: self._lexical_entries(conn, terms, limit), "searching"
            )
        if not query.strip():
            return []
        return await asyncio.to_thread(self._hybrid_search, query, terms, limit)

    async def add(self, content: str, *, metadata: dict[str, Any] | None = None) -> None:
        """Remember ``content`` in this namespace; nothing happens if it is already there.

        Durable when the coroutine returns.

        Raises:
            TypeError, ValueError: empty content or metadata that is not a JSON
                object without the reserved keys ``memory_id`` / ``created_at``.
            MemoryStoreError: SQLite failed.
        """
        await self.add_many([content], metadata=metadata)

    async def add_messages(
        self, messages: Sequence[Message], *, metadata: dict[str, Any] | None = None
    ) -> None:
        """Remember the text of each user and assistant message, with its ``role``.

        Tool calls and results are skipped. Duplicate-tolerant like :meth:`add`.
        """
        items = message_items(messages, metadata)
        if items:
            await asyncio.to_thread(self._insert, items)

    # ---------------------------------------------------------------- hygiene

    async def add_many(
        self, contents: Sequence[str], *, metadata: dict[str, Any] | None = None
    ) -> int:
        """Remember several texts in one transaction; return how many were new.

        Raises:
            TypeError, ValueError: like :meth:`add`.
            MemoryStoreError: SQLite failed.
        """
        items = content_items(
            contents,
            metadata,
            nul=False,
            unstorable="holds a lone surrogate, which UTF-8 (and so SQLite) cannot store",
        )
        if not items:
            return 0
        return await asyncio.to_thread(self._insert, items)

    async def count(self) -> int:
        """How many memories this namespace holds."""

        def work(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT count(*) FROM memories WHERE namespace = ?", (self.namespace,)
            ).fetchone()
            return int(row[0])

        return await self._db.run(work, "counting memories")

    async def delete(self, memory_ids: int | Sequence[int]) -> int:
        """Forget memories by id (``metadata["memory_id"]``); return how many went.

        Ids of other namespaces or unknown ids are ignored. Durable on return.
        """
        ids = [memory_ids] if isinstance(memory_ids, int) else list(memory_ids)
        for memory_id in ids:
            if isinstance(memory_id, bool) or not isinstance(memory_id, int):
                raise TypeError(f"memory_ids must be ints, got {memory_id!r}")

        def work(conn: sqlite3.Connection) -> int:
            def delete() -> int:
                deleted = 0
                for memory_id in ids:
                    cursor = conn.execute(
                        "DELETE FROM memories WHERE id = ? AND namespace = ?",
                        (memory_id, self.namespace),
                    )
                    deleted += cursor.rowcount
                return deleted

            deleted = write_transaction(conn, delete)
            self._writes += 1
            return deleted

        return await self._db.run(work, "deleting memories")

    async def clear(self) -> int:
        """Forget every memory of this namespace (e.g. a user's right to erasure)."""

        def work(conn: sqlite3.Connection) -> int:
            deleted = write_transaction(
                conn,
                lambda: (
                    conn.execute(
                        "DELETE FROM memories WHERE namespace = ?", (self.namespace,)
                    ).rowcount
                ),
            )
            self._writes += 1
            return int(deleted)

        return await self._db.run(work, "clearing the namespace")

    async def backfill_embeddings(self, *, batch_size: int = 256) -> int:
        """Embed this namespace's memories that lack a vector of the current embedder.

        Returns how many were embedded (0 without an embedder).
        """
        check_limit(batch_size, "batch_size")
        if self.embedder is None or not self.searchable:
            return 0
        return await asyncio.to_thread(self._backfill, batch_size)

    async def rotate_keys(self, *, force: bool = False, batch_size: int = 500) -> int:
        """Re-encrypt the file's memories under the cipher's active key; return how many.

        Every namespace of the file (they share its cipher): content and metadata
        are sealed again and the duplicate key is the new key's fingerprint. The
        cipher must still hold the keys the memories are under. Each batch is one
        transaction: killed, the file holds each memory under its old key or its
        new one, and calling again resumes. ``force`` also encrypts memories stored
        before the store had a cipher. A memory whose text another already holds
        under the new key (added twice mid-rotation) is dropped as the duplicate.

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
            rows = await self._db.run(
                functools.partial(_rows_after, after=after, limit=batch_size),
                "reading memories to re-encrypt",
            )
            if not rows:
                return done
            after = int(rows[-1][0])
            changes = [
                (*sealed, memory_id)
                for memory_id, content, metadata in rows
                if (sealed := rotated(cipher, content, metadata, force)) is not None
            ]
            if changes:
                done += await self._db.run(
                    functools.partial(self._reencrypt, changes=changes), "re-encrypting memories"
                )

    def _reencrypt(self, conn: sqlite3.Connection, *, changes: list[tuple[Any, ...]]) -> int:
        def work() -> int:
            for content, key, metadata, memory_id in changes:
                try:
                    conn.execute(
                        "UPDATE memories SET content = ?, content_key = ?, metadata = ? "
                        "WHERE id = ?",
                        (content, key, metadata, memory_id),
                    )
                except sqlite3.IntegrityError:  # its text is there under the new key already
                    conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
            return len(changes)

        changed = write_transaction(conn, work)
        self._writes += 1
        return changed

    async def optimize(self) -> None:
        """Merge the full-text index's segments (worth it after a large bulk load)."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('optimize')")

        await self._db.run(work, "optimising the index")

    def close(self) -> None:
        """Close the file. Idempotent; the store cannot be used afterwards."""
        self._db.close()

    def __repr__(self) -> str:
        return (
            f"LocalMemoryStore({str(self.path)!r}, namespace={self.namespace!r}, "
            f"embedder={self.embedder!r})"
        )

    # ------------------------------------------------------------------ internals

    def _entry(self, row: tuple[Any, ...], score: float | None) -> MemoryEntry:
        memory_id, content, metadata, created_at = row[:4]
        # Sealed text read without the key is DecryptionError, never ciphertext as content.
        content, metadata = unseal(self.cipher, content), unseal(self.cipher, metadata)
        return memory_entry(
            memory_id, content, metadata, created_at, store_name=self.name, score=score
        )

    def _lexical(
        self, conn: sqlite3.Connection, terms: list[str], limit: int
    ) -> list[tuple[int, float]]:
        expression = build_match_query(self._prefix, terms)
        rows = conn.execute(
            "SELECT rowid, bm25(memories_fts) FROM memories_fts WHERE memories_fts MATCH ? "
            "ORDER BY 2 LIMIT ?",
            (expression, limit),
        ).fetchall()
        return [(int(rowid), -float(rank)) for rowid, rank in rows]

    def _scan(self, conn: sqlite3.Connection, terms: list[str], limit: int) -> list[MemoryEntry]:
        """The search of an encrypted store without an index: decrypt and count words."""
        rows = conn.execute(
            "SELECT id, content, metadata, created_at FROM memories WHERE namespace = ? "
            "ORDER BY id",
            (self.namespace,),
        ).fetchall()
        by_id = {int(row[0]): row for row in rows}
        texts = ((memory_id, unseal(self.cipher, row[1])) for memory_id, row in by_id.items())
        return [self._entry(by_id[i], score) for i, score in lexical_scan(texts, terms, limit)]

    def _fetch(self, conn: sqlite3.Connection, ids: list[int]) -> dict[int, tuple[Any, ...]]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        # By primary key only: with "namespace = ?" in the WHERE clause SQLite would
        # walk the namespace's index instead. The namespace is checked on the rows.
        rows = conn.execute(
            f"SELECT id, content, metadata, created_at, namespace FROM memories "
            f"WHERE id IN ({marks})",
            ids,
        ).fetchall()
        return {int(row[0]): row for row in rows if row[4] == self.namespace}

    def _lexical_entries(
        self, conn: sqlite3.Connection, terms: list[str], limit: int
    ) -> list[MemoryEntry]:
        ranked = self._lexical(conn, terms, limit)
        rows = self._fetch(conn, [memory_id for memory_id, _ in ranked])
        return [
            self._entry(rows[memory_id], score)
            for memory_id, score in ranked
            if memory_id in rows  # a namespace-token collision is filtered out here
        ]

    def _embed(self, texts: list[str]) -> list[bytes]:
        assert self.embedder is not None
        matrix = embed_texts(self.embedder, self._np, texts)
        return [row.astype("<f4").tobytes() for row in matrix]

    def _insert(self, items: list[tuple[str, dict[str, Any]]]) -> int:
        """Blocking: embed (outside the connection lock), then insert in one transaction."""
        blobs: list[bytes | None] = [None] * len(items)
        model_id = None
        if self.embedder is not None and self.searchable:
            blobs = list(self._embed([content for content, _ in items]))
            model_id = self.embedder.model_id
        now = time.time()
        cipher = self.cipher
        rows = [
            (
                self.namespace,
                seal(cipher, content),
                content_key(content, cipher),
                _index_terms(self._prefix, content) if self.searchable else "",
                seal(cipher, meta_json(meta)) if meta else None,
                now,
                blob,
                model_id if blob is not None else None,
            )
            for (content, meta), blob in zip(items, blobs, strict=True)
        ]

        def work(conn: sqlite3.Connection) -> int:
            def insert() -> int:
                added = 0
                for row in rows:
                    # rowcount is 1 for a new memory, 0 for a duplicate (triggers excluded).
                    added += conn.execute(_INSERT, row).rowcount
                return added

            added = write_transaction(conn, insert)
            self._writes += 1
            return added

        return self._db.run_sync(work, "adding memories")

    def _backfill(self, batch_size: int) -> int:
        assert self.embedder is not None
        model_id = self.embedder.model_id
        done = 0
        while True:
            rows = self._db.run_sync(
                lambda conn: conn.execute(
                    "SELECT id, content FROM memories WHERE namespace = ? AND "
                    "(embedding IS NULL OR embedding_model IS NOT ?) ORDER BY id LIMIT ?",
                    (self.namespace, model_id, batch_size),
                ).fetchall(),
                "reading memories to embed",
            )
            if not rows:
                return done
            blobs = self._embed([unseal(self.cipher, content) for _, content in rows])

            def work(conn: sqlite3.Connection, rows: Any = rows, blobs: Any = blobs) -> None:
                write_transaction(
                    conn,
                    lambda: conn.executemany(
                        "UPDATE memories SET embedding = ?, embedding_model = ? WHERE id = ?",
                        [(blob, model_id, row[0]) for row, blob in zip(rows, blobs, strict=True)],
                    ),
                )
                self._writes += 1

            self._db.run_sync(work, "storing embeddings")
            done += len(rows)

    def _vector_index(self) -> _VectorIndex:
        """The namespace's vectors, reloaded when anyone wrote since the last load."""
        assert self.embedder is not None
        np = self._np
        model_id = self.embedder.model_id

        def generation(conn: sqlite3.Connection) -> tuple[int, int]:
            return (int(conn.execute("PRAGMA data_version").fetchone()[0]), self._writes)

        with self._vectors_lock:
            current = self._db.run_sync(generation, "checking for changes")
            if self._vectors is not None and self._vectors.generation == current:
                return self._vectors

            def load(conn: sqlite3.Connection) -> tuple[tuple[int, int], list[Any]]:
                rows = conn.execute(
                    "SELECT id, embedding FROM memories WHERE namespace = ? AND "
                    "embedding_model = ? AND embedding IS NOT NULL ORDER BY id",
                    (self.namespace, model_id),
                ).fetchall()
                return generation(conn), rows

            loaded_at, rows = self._db.run_sync(load, "loading vectors")
            dimension = self.embedder.dimension
            ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
            matrix = (
                np.frombuffer(b"".join(row[1] for row in rows), dtype="<f4").reshape(
                    len(rows), dimension
                )
                if rows
                else np.zeros((0, dimension), dtype=np.float32)
            )
            self._vectors = _VectorIndex(loaded_at, ids, matrix)
            return self._vectors

    def _hybrid_search(self, query: str, terms: list[str], limit: int) -> list[MemoryEntry]:
        """Blocking: fuse the BM25 and vector rankings with reciprocal rank fusion."""
        np = self._np
        depth = max(limit * 4, 20)
        lexical: list[tuple[int, float]] = []
        if terms:
            lexical = self._db.run_sync(lambda conn: self._lexical(conn, terms, depth), "searching")
        query_vector = np.frombuffer(self._embed([query])[0], dtype="<f4")
        index = self._vector_index()
        semantic: list[int] = []
        if len(index.ids):
            similarities = index.matrix @ query_vector
            count = min(depth, len(similarities))
            top = np.argpartition(-similarities, count - 1)[:count]
            top = top[np.argsort(-similarities[top])]
            semantic = [int(index.ids[i]) for i in top if similarities[i] >= self.min_similarity]
        best = fuse_rankings((memory_id for memory_id, _ in lexical), semantic)
        ids = [memory_id for memory_id, _ in best[: limit * 2]]
        rows = self._db.run_sync(lambda conn: self._fetch(conn, ids), "reading memories")
        entries = [self._entry(rows[i], score) for i, score in best if i in rows]
        return entries[:limit]

    # Last in the class: from here on, ``list`` in this class body names the method.
    async def list(self, *, limit: int = 100, offset: int = 0) -> builtins.list[MemoryEntry]:
        """This namespace's memories, oldest first, ``limit`` from ``offset``."""
        check_limit(limit)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")

        def work(conn: sqlite3.Connection) -> builtins.list[MemoryEntry]:
            rows = conn.execute(
                "SELECT id, content, metadata, created_at FROM memories WHERE namespace = ? "
                "ORDER BY id LIMIT ? OFFSET ?",
                (self.namespace, limit, offset),
            ).fetchall()
            return [self._entry(row, None) for row in rows]

        return await self._db.run(work, "listing memories")
