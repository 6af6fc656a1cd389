"""The rules every perdure memory store obeys (pure: no I/O).

:class:`~perdure.memory.LocalMemoryStore` (SQLite) and
:class:`~perdure.memory.PostgresMemoryStore` keep the same contract because they
share these: which words of a query are searched for, when two memories are the
same (so repeated extraction adds nothing), what metadata and arguments are
accepted, how an embedder's vectors are checked and normalised, how the text and
vector rankings are fused, and how a stored row becomes a :class:`MemoryEntry`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from perdure.crypto import Cipher, envelope_key_id, is_sealed_text, seal, unseal
from perdure.crypto.cipher import text_envelope
from perdure.memory.embedder import Embedder
from perdure.memory.entry import MemoryEntry
from perdure.memory.errors import MemoryStoreError
from perdure.types import Message
from perdure.types.json import encodes_as_utf8

__all__ = [
    "MAX_QUERY_TERMS",
    "RESERVED_METADATA_KEYS",
    "RRF_K",
    "STOP_WORDS",
    "check_embedder",
    "check_limit",
    "check_metadata",
    "check_name",
    "check_namespace",
    "content_key",
    "embed_texts",
    "fuse_rankings",
    "import_numpy",
    "lexical_scan",
    "memory_entry",
    "message_items",
    "meta_json",
    "needs_rotation",
    "query_terms",
    "storable",
    "words",
]

RESERVED_METADATA_KEYS = ("memory_id", "created_at")
"""Metadata keys the store fills in on what it returns; ``add`` refuses them."""

MAX_QUERY_TERMS = 32
RRF_K = 60
"""The constant of reciprocal rank fusion: a rank ``r`` (from 0) scores ``1/(RRF_K+r+1)``."""

_WORD = re.compile(r"[^\W_]+")

# Common English function words: they match nearly every memory and carry no
# meaning, so they are left out of a query that has other words.
STOP_WORDS = frozenset(
    """
    a about after again all also am an and any are as at be because been before being
    both but by can could did do does doing done for from had has have having he her
    here hers him his how i if in into is it its itself just me more most my no nor not
    now of off on once only or other our ours out over own same she should so some such
    than that the their theirs them then there these they this those through to too
    under until up very was we were what when where which while who whom why will with
    would you your yours
    """.split()  # noqa: SIM905 - a word list reads better as prose
)


def words(text: str) -> list[str]:
    """The words of ``text``: runs of letters and digits (an underscore separates)."""
    return _WORD.findall(text)


def query_terms(text: str) -> list[str]:
    """The distinct words of ``text`` a search looks for, in order (at most 32).

    Words are runs of letters and digits, case-folded. Stop words are dropped
    unless nothing else is left.
    """
    found = list(dict.fromkeys(word.casefold() for word in _WORD.findall(text)))
    meaningful = [word for word in found if word not in STOP_WORDS]
    return (meaningful or found)[:MAX_QUERY_TERMS]


def content_key(content: str, cipher: Cipher | None = None) -> str:
    """What makes two memories the same: their text, ignoring case and whitespace.

    A sha256; with a ``cipher`` (encrypted memories) the cipher's keyed
    :meth:`~perdure.crypto.Cipher.fingerprint`, so the stored key cannot confirm a
    guessed text.
    """
    normalised = " ".join(content.split()).casefold().encode("utf-8")
    if cipher is not None:
        return cipher.fingerprint(normalised)
    return hashlib.sha256(normalised).hexdigest()


def needs_rotation(cipher: Cipher, stored: str, force: bool) -> bool:
    """Whether a stored text must be sealed again under ``cipher.active``: it is under
    another key, or (with ``force``) not encrypted at all."""
    if not is_sealed_text(stored):
        return force
    return force or envelope_key_id(text_envelope(stored)) != cipher.active


def rotated(
    cipher: Cipher, content: str, metadata: str | None, force: bool
) -> tuple[str, str, str | None] | None:
    """A stored memory's content, duplicate key and metadata sealed again under
    ``cipher.active``, or None when neither text needs it (see :func:`needs_rotation`)."""
    if not needs_rotation(cipher, content, force) and (
        metadata is None or not needs_rotation(cipher, metadata, force)
    ):
        return None
    text = unseal(cipher, content)
    meta = None if metadata is None else seal(cipher, unseal(cipher, metadata))
    return seal(cipher, text), content_key(text, cipher), meta


def lexical_scan(
    rows: Iterable[tuple[int, str]], terms: Sequence[str], limit: int
) -> list[tuple[int, float]]:
    """``(id, score)`` of the best ``limit`` of ``rows`` (``(id, text)``) for ``terms``:
    how many of the query's terms each text holds, best first, oldest first among
    equals; texts holding none are left out.

    The search of an encrypted memory store that keeps no plaintext index
    (``searchable=False``): every memory of the namespace is decrypted and read.
    """
    wanted = set(terms)
    scored = []
    for memory_id, text in rows:
        found = len(wanted.intersection(word.casefold() for word in words(text)))
        if found:
            scored.append((memory_id, float(found)))
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored[:limit]


def check_limit(limit: object, argument: str = "limit") -> None:
    """``limit`` must be an int >= 1 (ValueError naming ``argument`` otherwise)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{argument} must be an int >= 1, got {limit!r}")


def check_namespace(namespace: object) -> str:
    """Return ``namespace`` if it can name a user's memories.

    Raises:
        TypeError: not a str.
        ValueError: empty, holding NUL, or not encodable as UTF-8.
    """
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    if not namespace or "\x00" in namespace or not encodes_as_utf8(namespace):
        raise ValueError(
            f"namespace must be a non-empty str without NUL or lone surrogates, got {namespace!r}"
        )
    return namespace


def check_name(name: object) -> str:
    """Return ``name`` (a store's name in results) if it is a non-empty str."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    return name


def check_embedder(embedder: object) -> None:
    """``embedder`` must implement :class:`~perdure.memory.Embedder`.

    Raises:
        TypeError: no ``embed`` method, no str ``model_id`` or no int ``dimension``
            >= 1 (the message names the embedder).
    """
    if not callable(getattr(embedder, "embed", None)):
        raise TypeError(f"embedder must implement Embedder (embed), got {embedder!r}")
    if not isinstance(getattr(embedder, "model_id", None), str):
        raise TypeError("embedder must have a str model_id")
    dimension = getattr(embedder, "dimension", None)
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise TypeError("embedder must have an int dimension >= 1")


def check_metadata(metadata: object) -> dict[str, Any]:
    """A copy of ``metadata`` (``None``: empty) if a memory may carry it.

    Raises:
        TypeError: not a dict.
        ValueError: it sets a reserved key or is not JSON-serialisable.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    reserved = [key for key in RESERVED_METADATA_KEYS if key in metadata]
    if reserved:
        raise ValueError(f"metadata must not set the reserved keys {reserved}")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serializable: {exc}") from None
    return dict(metadata)


def meta_json(meta: dict[str, Any]) -> str:
    """``meta`` as JSON text that UTF-8 can carry (a lone surrogate is ``\\u``-escaped)."""
    text = json.dumps(meta, ensure_ascii=False)
    return text if encodes_as_utf8(text) else json.dumps(meta)


def storable(text: str, *, nul: bool = False) -> str:
    """``text`` with any lone surrogate (from surrogateescape decoding) made U+FFFD,
    and with ``nul``, any NUL too (PostgreSQL's text cannot hold it).

    Memories from a conversation are a search index over its text; the session keeps
    the exact text.
    """
    if encodes_as_utf8(text) and not (nul and "\x00" in text):
        return text
    return "".join(
        "\ufffd" if 0xD800 <= ord(c) <= 0xDFFF or (nul and c == "\x00") else c for c in text
    )


def content_items(
    contents: Sequence[str], metadata: dict[str, Any] | None, *, nul: bool, unstorable: str
) -> list[tuple[str, dict[str, Any]]]:
    """What ``add_many`` remembers: each text with the metadata, checked.

    ``nul``: a NUL is refused too; ``unstorable`` ends the message of a text refused
    ("holds a lone surrogate, which …").

    Raises:
        TypeError: ``contents`` is not a list of str, or bad ``metadata``.
        ValueError: an empty or unstorable text, or bad ``metadata``.
    """
    if isinstance(contents, str) or not isinstance(contents, Sequence):
        raise TypeError(f"contents must be a list of str, got {type(contents).__name__}")
    checked = check_metadata(metadata)
    items = []
    for content in contents:
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, got {type(content).__name__}")
        if not content.strip():
            raise ValueError("content must not be empty")
        if (nul and "\x00" in content) or not encodes_as_utf8(content):
            raise ValueError(f"content {content[:40]!r} {unstorable}")
        items.append((content, checked))
    return items


def message_items(
    messages: Sequence[Message], metadata: dict[str, Any] | None, *, nul: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """What ``add_messages`` remembers: the text of each message, with its ``role``.

    Tool calls and results are skipped; a message's text blocks are joined by
    newlines (see :func:`storable` for ``nul``).

    Raises:
        TypeError, ValueError: ``messages`` is not a list, or bad ``metadata``.
    """
    if isinstance(messages, str | bytes | dict) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of messages, got {type(messages).__name__}")
    base = check_metadata(metadata)
    items: list[tuple[str, dict[str, Any]]] = []
    for message in messages:
        texts = [
            storable(block["text"].strip(), nul=nul)
            for block in message.get("content") or []
            if isinstance(block.get("text"), str) and block["text"].strip()
        ]
        if texts:
            items.append(("\n".join(texts), {**base, "role": message.get("role")}))
    return items


def import_numpy() -> Any:
    """numpy, which hybrid search needs (``perdure[embeddings]`` brings it)."""
    try:
        return importlib.import_module("numpy")
    except ImportError as exc:  # pragma: no cover - numpy comes with the embeddings extra
        raise ImportError(
            "hybrid search with an embedder needs numpy: pip install 'perdure[embeddings]'"
        ) from exc


def embed_texts(embedder: Embedder, np: Any, texts: list[str]) -> Any:
    """``texts`` embedded: a float32 matrix, one unit-length row per text.

    Raises:
        ValueError: the embedder returned another number of vectors, or a vector of
            another dimension than it declares.
    """
    vectors = embedder.embed(texts)
    if len(vectors) != len(texts):
        raise ValueError(
            f"embedder {embedder!r} returned {len(vectors)} vectors for {len(texts)} texts"
        )
    rows = []
    for vector in vectors:
        array = np.asarray(vector, dtype=np.float32)
        if array.shape != (embedder.dimension,):
            raise ValueError(
                f"embedder {embedder!r} returned a vector of shape {array.shape}, "
                f"expected ({embedder.dimension},)"
            )
        norm = float(np.linalg.norm(array))
        if norm > 0 and not math.isclose(norm, 1.0, rel_tol=1e-3):
            array = array / norm
        rows.append(array)
    if not rows:
        return np.zeros((0, embedder.dimension), dtype=np.float32)
    return np.stack(rows).astype(np.float32)


def fuse_rankings(*rankings: Iterable[int]) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of rankings of memory ids, best first: ``(id, score)``.

    A memory scores ``1 / (RRF_K + rank + 1)`` in each ranking it is in (ranks from
    0); ties go to the older memory (the smaller id).
    """
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, memory_id in enumerate(ranking):
            fused[memory_id] = fused.get(memory_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


def memory_entry(
    memory_id: int,
    content: str,
    metadata: str | None,
    created_at: float,
    *,
    store_name: str,
    score: float | None,
) -> MemoryEntry:
    """A stored memory as search returns it: its metadata with ``memory_id`` and
    ``created_at`` filled in.

    Raises:
        MemoryStoreError: the stored metadata is not a JSON object
            (``details["fault"] == "damage"``).
    """
    meta: Any = {}
    if metadata:
        try:
            if not isinstance(metadata, str):
                raise TypeError(f"expected text, got {type(metadata).__name__}")
            meta = json.loads(metadata)
        except (TypeError, ValueError, RecursionError) as exc:
            raise MemoryStoreError(
                f"the metadata of memory {memory_id} is damaged: {type(exc).__name__}",
                details={"fault": "damage"},
            ) from None
        if not isinstance(meta, dict):
            raise MemoryStoreError(
                f"the metadata of memory {memory_id} is damaged: not an object",
                details={"fault": "damage"},
            )
    meta["memory_id"] = memory_id
    meta["created_at"] = created_at
    return MemoryEntry(content=content, store_name=store_name, metadata=meta, score=score)
