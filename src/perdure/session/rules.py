"""The rules every session store follows, written once: pure, no I/O (SPEC §7).

Stores only move bytes or rows; what a commit may do, what it appends, whether it
conflicts, how a row is hashed and encoded, and which checkpoints retention evicts
are decided here, the same way for every store:

- **Commit planning**: :func:`commit_request` checks a commit's arguments (a bool
  is no redaction index, an index must name a message of the committed history);
  :func:`plan_commit` decides, from the stored count and tail, whether the commit
  conflicts and which messages are new; :func:`check_extends` is the rule for a
  commit without ``expected_tail``; :func:`writes_anything` whether it changes the
  session at all.
- **Chain hashing**: ``hash = sha256(prev_hash + body)`` truncated to 32 hex digits,
  the first record or row chaining to :data:`ZERO_HASH`. The file journal hashes a
  record's JSON bytes, SQLite a row's JSON text: the same function of the same
  bytes (:func:`chain_hash`), so a changed body, hash or a missing row is detected by
  hashing what was read, without re-serialising anything.
- **Encoding**: a message is stored as compact JSON text (``bytes`` values and
  marker-shaped dicts encoded by :func:`~perdure.types.encode_bytes_values`) and
  comes back through :func:`decode_message`, which checks its shape.
- **Encryption at rest** (SPEC §9): with a ``cipher`` every encode above seals the
  text (:func:`seal`: ``~pd1~`` and the base64 of an envelope, a fresh nonce each
  time) and every decode opens it first (:func:`unseal`). Hashes are taken over
  what is stored — the sealed text — so the chain covers the ciphertext and
  ``perdure verify`` needs no key. Text written before encryption was turned on
  still reads (it is no envelope); sealed text read without a cipher raises
  :class:`~perdure.errors.DecryptionError`.
- **Argument checks** for ``create``, ``list``, ``get`` and ``commit``, so every
  store rejects the same misuse with the same ``TypeError``/``ValueError``;
  :func:`creation_time` is the ``created_at`` a new session is stored with.
- **Retention**: :func:`check_max_checkpoints`, :func:`check_max_checkpoint_age`,
  :func:`checkpoint_age_cutoff` and :func:`evicted_checkpoints`.
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast, overload

from perdure.crypto import Cipher
from perdure.crypto import check_cipher as check_cipher  # the stores take them from the rules
from perdure.crypto import seal as seal
from perdure.crypto import unseal as unseal
from perdure.crypto import unseal_all as unseal_all
from perdure.errors import DecryptionError, SessionConflictError, SessionLockedError
from perdure.session.ids import validate_session_id
from perdure.session.ulid import encode_ulid, is_ulid
from perdure.types import (
    Message,
    decode_bytes_values,
    encode_bytes_values,
    is_text_only,
    validate_message,
    validate_storable,
)
from perdure.types.json import compact_json, encodes_as_utf8, may_hold_encoded

ZERO_HASH = "0" * 32
"""The hash the first record (journal) or row (SQLite) of a history chains to."""

HASH_LEN = 32

MAX_MESSAGES = 2**32 - 1
"""Most messages one session may hold (SQLite row keys keep 32 bits for the index)."""


class DecodeError(ValueError):
    """Stored text that is not what the store wrote (bad JSON, wrong shape)."""


def utc_now() -> str:
    """The current time as ISO-8601 UTC with microseconds and a ``Z`` suffix.

    As ``datetime.now(UTC).isoformat(timespec="microseconds")`` with ``Z`` for
    ``+00:00``, at a third of the cost (every append stamps its session): the
    date and time to the second are formatted once a second.
    """
    global _second
    microseconds = time.time_ns() // 1000
    seconds, fraction = divmod(microseconds, 1_000_000)
    cached = _second
    if cached[0] != seconds:
        cached = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{cached[1]}.{fraction:06d}Z"


_second: tuple[int, str] = (-1, "")  # (a whole second, formatted); one tuple, so threads agree


def creation_time(created_at: _dt.datetime | str | None) -> str:
    """The ``created_at`` a new session is stored with: ``created_at``, else now.

    ``created_at`` is a timezone-aware :class:`~datetime.datetime` or ISO-8601 text
    with an offset or ``Z`` (what :attr:`SessionMeta.created_at` holds, so one
    store's metadata can be handed to another); it is stored as :func:`utc_now`
    writes times: UTC with microseconds and ``Z``. ``None`` is now.

    Raises:
        TypeError: ``created_at`` is not a datetime, a string or ``None``.
        ValueError: a naive datetime or text without an offset (its time zone is
            unknown), or text that is no ISO-8601 time; the message names
            ``created_at``.
    """
    if created_at is None:
        return utc_now()
    if isinstance(created_at, str):
        try:
            moment = _dt.datetime.fromisoformat(created_at)
        except ValueError:
            raise ValueError(
                f"created_at must be an ISO-8601 time with an offset, got {created_at!r}"
            ) from None
    elif isinstance(created_at, _dt.datetime):
        moment = created_at
    else:
        raise TypeError(
            f"created_at must be a datetime, an ISO-8601 string or None, "
            f"got {type(created_at).__name__}"
        )
    if moment.utcoffset() is None:
        raise ValueError(
            f"created_at must be timezone-aware (a naive time names no instant), got {created_at!r}"
        )
    try:
        utc = moment.astimezone(_dt.UTC)
    except OverflowError:
        raise ValueError(f"created_at is out of range once in UTC: {created_at!r}") from None
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


# The random part of tail tokens. Not the system's source: a commit made on the event
# loop draws one, and os.urandom lets go of the GIL, which a busy writer thread may
# then hold for a while (6 us a token here, against 0.5). Not random's shared instance
# either: a program that seeds it (tests often do) would make every process draw the
# same tokens. Seeded from the system, and again in a child made by fork().
_tail_random = random.Random(os.urandom(32))
if hasattr(os, "register_at_fork"):  # no fork() where it is missing
    os.register_at_fork(after_in_child=lambda: _tail_random.seed(os.urandom(32)))


def new_tail(writes: int) -> str:
    """A fresh tail token: ``"<writes>-<16 random hex digits>"``.

    The write counter makes tokens readable in error messages; the random part makes
    a token unique across a session's deletion and re-creation, so a stale writer of
    a deleted session never matches the new one. It is not a secret: anyone who
    reads a session reads its tail.
    """
    return f"{writes}-{_tail_random.getrandbits(64):016x}"


def chain_hash(prev_hash: str, body: str | bytes) -> str:
    """The hash of a record or row stored as ``body``, chained to ``prev_hash``.

    ``sha256(prev_hash + body)`` over the ASCII hash and the UTF-8 body, truncated
    to :data:`HASH_LEN` hex digits. The file journal passes a record's JSON bytes
    (from its ``{``), SQLite a row's JSON text: the same bytes hash the same.
    """
    if isinstance(body, str):
        return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()[:HASH_LEN]
    return hashlib.sha256(prev_hash.encode("ascii") + body).hexdigest()[:HASH_LEN]


def text_hash(text: str) -> str:
    """The hash of a stored text that is not part of the message chain (agent state)."""
    return blob_hash(text.encode("utf-8"))


def blob_hash(data: bytes) -> str:
    """The hash of a stored blob (a checkpoint body), as long as a row hash."""
    return hashlib.sha256(data).hexdigest()[:HASH_LEN]


def encode_json(value: Any, where: str, *, has_bytes: bool = True) -> str:
    """Compact JSON text for ``value`` with ``bytes`` encoded.

    Non-ASCII text is kept as UTF-8 (smaller on disk) unless the value holds a lone
    surrogate, which UTF-8 cannot carry; then that text is ``\\u``-escaped.
    ``has_bytes=False`` promises that ``value`` holds no ``bytes`` (skips the walk).

    Raises:
        ValueError: ``value`` cannot be stored as JSON (an object JSON does not know,
            NaN or infinity, a cycle, or nesting too deep); the message starts with
            ``where``.
    """
    try:
        encoded = encode_bytes_values(value) if has_bytes else value
        text = compact_json(encoded)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{where} cannot be stored as JSON: {exc}") from None
    if not encodes_as_utf8(text):
        text = compact_json(encoded, ascii_only=True)
    return text


def encode_message(message: Any, where: str, cipher: Cipher | None = None) -> str:
    """Check that ``message`` is a message and return its stored text (sealed with
    ``cipher``).

    Raises:
        TypeError: ``message`` or its content has the wrong type.
        ValueError: a malformed message, or one that cannot be stored (the message
            names the path of the bad value).
    """
    validate_message(message, where)
    if is_text_only(message):  # nothing to check or encode past the text blocks
        return seal(cipher, encode_json(message, where, has_bytes=False))
    validate_storable(message, where)
    return seal(cipher, encode_json(message, where))


def encode_state(agent_state: Any, cipher: Cipher | None = None) -> str:
    """The stored text of an agent state (a mapping), sealed with ``cipher``.

    Raises:
        TypeError: ``agent_state`` is not a mapping.
        ValueError: it cannot be stored as JSON.
    """
    if not isinstance(agent_state, Mapping):
        raise TypeError(f"agent_state must be a mapping, got {type(agent_state).__name__}")
    return seal(cipher, encode_json(dict(agent_state), "agent_state"))


_DECODER = json.JSONDecoder()


def _load(text: str) -> Any:
    # raw_decode skips json.loads' whitespace scans (stored text has none): this is
    # the hot loop of every resume.
    try:
        value, end = _DECODER.raw_decode(text)
        if end != len(text):
            raise ValueError(f"extra data at character {end}")
        # A marker can only be present if its key is in the text: skip the walk otherwise.
        return decode_bytes_values(value) if may_hold_encoded(text) else value
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None


def decode_message(text: str, cipher: Cipher | None = None) -> Message:
    """The message stored as ``text`` (opened with ``cipher`` when sealed).

    Raises:
        DecodeError: ``text`` is not JSON or not a message (the message says why).
        DecryptionError: sealed text that ``cipher`` cannot open (or no cipher).
    """
    value = _load(unseal(cipher, text))
    if looks_like_message(value):  # validated when written; the row's hash vouches for it
        return cast(Message, value)
    try:
        return validate_message(value, "stored message")
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"not a message: {exc}") from None


def decode_messages(texts: Sequence[str] | Sequence[bytes]) -> list[Message] | None:
    """The messages stored as ``texts`` (JSON, as ``str`` or UTF-8 ``bytes``, all of
    one kind), parsed in one pass.

    One parse of ``[text,text,…]`` instead of one per text: the hot loop of a long
    resume. Returns ``None`` when any text is not one well-formed message (not JSON,
    two values, not a message's shape): :func:`decode_message` of each then says
    which and why. A text that holds the same message with other whitespace between
    its tokens is that message here and refused there; a store only ever writes the
    compact form, which its hashes vouch for.
    """
    if not texts:
        return []
    joined: str | bytes
    try:
        # The brackets go on the first and last texts, not around the joined text:
        # ``"[" + joined + "]"`` copies megabytes twice more on a long resume.
        parts: list[Any] = list(texts)
        if isinstance(parts[0], bytes):
            parts[0] = b"[" + parts[0]
            parts[-1] = parts[-1] + b"]"
            joined = b",".join(parts)
        else:
            parts[0] = "[" + parts[0]
            parts[-1] = parts[-1] + "]"
            joined = ",".join(parts)
        values = _parse_many(joined, len(texts))
        if len(values) != len(texts):
            return None
        if may_hold_encoded(joined):
            values = [
                decode_bytes_values(value) if may_hold_encoded(text) else value
                for value, text in zip(values, cast(Sequence[str | bytes], texts), strict=True)
            ]
    except (TypeError, ValueError, RecursionError):  # TypeError: str and bytes mixed
        return None
    # looks_like_message inlined: a call per message is a tenth of this loop's cost.
    for value in values:
        if type(value) is not dict or value.get("role") not in _ROLES:
            return None
        content = value.get("content")
        if type(content) is not list:
            return None
        for block in content:
            if type(block) is not dict:
                return None
    return cast(list[Message], values)


_ROLES = ("user", "assistant")


_PAUSE_GC_FROM = 1000  # texts: below, a parse allocates too little to wake the collector


def _parse_many(joined: str | bytes, count: int) -> Any:
    """``json.loads(joined)``, the cyclic garbage collector paused for a long history.

    Each message is a few new containers, so a parse of thousands wakes the
    collector again and again, and its older generations walk every object the
    process holds (a long history read before, the agent's own): most of the time
    of a long resume in a busy process, for objects that are all alive. Only a
    collector this call paused is resumed.
    """
    if count < _PAUSE_GC_FROM or not gc.isenabled():
        return json.loads(joined)
    gc.disable()
    try:
        return json.loads(joined)
    finally:
        gc.enable()


Damage = Callable[[int, str, str], Exception]
"""``damage(index, kind, detail)``: the store's corruption error for message ``index``."""


def verify_rows(
    rows: Iterable[tuple[Any, ...]],
    first: int,
    prev: str,
    end: int,
    head: str | None,
    damage: Damage,
    *,
    base: int = 0,
    cipher: Cipher | None = None,
) -> list[Message]:
    """Check that ``rows`` are messages ``first..end-1`` chained from ``prev``; decode them.

    A row is ``(key, body, hash, redacted, redacted_hash)``, message ``key - base``;
    texts as the driver gives them (``str``, or UTF-8 ``bytes``), checked here.

    The row stores' (SQLite, PostgreSQL) one read check: each row at its index, each
    column of its type, each hash the body chained to the row before (a redaction
    chained to its row's hash), and — when ``head`` is given (the rows reach the
    session's end) — the last hash the session's recorded head. Then all the texts
    parse in one pass (:func:`decode_messages`); the first that is no message is
    named. ``damage`` makes the error for each finding (``bad_sequence``,
    ``bad_payload``, ``bad_hash``, ``broken_chain``).

    Sound rows take one tight pass (:func:`_verified_texts`); any doubt sends them
    through the checks below, one finding at a time, which name the row. Hashes
    are checked over the stored (sealed) text; the texts are opened with
    ``cipher`` after that, before they parse.

    Raises:
        DecryptionError: a sealed text ``cipher`` cannot open (or no cipher).
    """
    if not isinstance(rows, list | tuple):
        rows = list(rows)
    texts = _verified_texts(rows, first, prev, end, head, base)
    if texts is not None:
        messages = decode_messages(unseal_all(cipher, texts))
        if messages is not None:
            return messages
    return _verify_rows_slowly(rows, first, prev, end, head, damage, base, cipher)


class RowChunks:
    """:func:`verify_rows` over rows that arrive in chunks, checked as they come.

    A server store streams a long session's rows and hands each chunk to
    :meth:`add` while the server sends the next, so the client's hashing and
    parsing overlap the server's reading and sending instead of following them.
    :meth:`add` never raises: a chunk that is not the next rows in order, sound
    (:func:`_verified_texts`) and parsing as messages puts the reader in doubt, and
    from then on it only keeps rows. :meth:`finish` then returns the messages, or —
    in doubt, or when the rows end elsewhere than ``end`` or off ``head`` — passes
    every row kept, in key order, to :func:`verify_rows`, which finds and names the
    damage exactly as for rows read at once (or raises the
    :class:`~perdure.errors.DecryptionError`).
    """

    __slots__ = ("_base", "_cipher", "_first", "_key", "_messages", "_prev", "_rows", "_start")

    def __init__(self, first: int, prev: str, *, base: int = 0, cipher: Cipher | None = None):
        self._first, self._start, self._base, self._cipher = first, prev, base, cipher
        self._rows: list[tuple[Any, ...]] = []
        self._messages: list[Message] | None = []
        self._key = first + base  # the key the next row must have
        self._prev = prev

    def add(self, chunk: Sequence[tuple[Any, ...]]) -> None:
        """Keep ``chunk`` (rows as :func:`verify_rows` takes them) and check it."""
        self._rows.extend(chunk)
        if self._messages is None or not chunk:
            return
        at = self._key - self._base
        texts = _verified_texts(chunk, at, self._prev, at + len(chunk), None, self._base)
        if texts is not None:
            try:
                messages = decode_messages(unseal_all(self._cipher, texts))
            except DecryptionError:  # verify_rows raises it, after the hashes
                messages = None
            if messages is not None:
                self._messages.extend(messages)
                self._prev = chunk[-1][2]
                self._key += len(chunk)
                return
        self._messages = None

    def finish(self, end: int, head: str | None, damage: Damage) -> list[Message]:
        """The messages ``first..end-1``, every row added; ``head`` as for
        :func:`verify_rows`, which raises ``damage`` for what does not hold."""
        messages = self._messages
        if (
            messages is not None
            and self._key == end + self._base
            and (head is None or self._prev == head)
        ):
            return messages
        rows = sorted(self._rows, key=_row_key)
        return verify_rows(
            rows, self._first, self._start, end, head, damage, base=self._base, cipher=self._cipher
        )


def _row_key(row: tuple[Any, ...]) -> Any:
    return row[0]


def _verified_texts(
    rows: Sequence[tuple[Any, ...]], first: int, prev: str, end: int, head: str | None, base: int
) -> list[Any] | None:
    """The texts of ``rows`` (redacted ones replaced) when every check of
    :func:`verify_rows` holds; ``None`` at the first doubt (no error: the slow pass
    then finds and names it). The hot loop of a long resume: no call per row but
    the hash's own."""
    if len(rows) != end - first:
        return None
    sha256 = hashlib.sha256
    texts: list[Any] = []
    append = texts.append
    key_wanted = first + base
    try:
        for key, body, stored, redacted, redacted_hash in rows:
            if key != key_wanted:
                return None
            if type(body) is str:
                digest = sha256((prev + body).encode("utf-8")).hexdigest()[:HASH_LEN]
            elif type(body) is bytes:
                digest = sha256(prev.encode("ascii") + body).hexdigest()[:HASH_LEN]
            else:
                return None
            if type(stored) is not str or digest != stored:
                return None
            if redacted is None:
                append(body)
            elif type(redacted) is type(body) and redacted_hash == chain_hash(stored, redacted):
                append(redacted)
            else:
                return None
            prev = stored
            key_wanted += 1
    except (TypeError, ValueError):  # a malformed row (UnicodeError is a ValueError)
        return None
    if head is not None and prev != head:
        return None
    return texts


def _verify_rows_slowly(
    rows: Iterable[tuple[Any, ...]],
    first: int,
    prev: str,
    end: int,
    head: str | None,
    damage: Damage,
    base: int,
    cipher: Cipher | None = None,
) -> list[Message]:
    """:func:`verify_rows`, one check at a time: raises ``damage`` for the first finding."""
    texts: list[Any] = []
    index = first
    for key, body, stored, redacted, redacted_hash in rows:
        at = key - base
        if at != index:
            raise damage(index, "bad_sequence", "the row is missing")
        if at >= end:
            raise damage(at, "bad_sequence", f"the session holds only {end} messages")
        if not (
            isinstance(body, str | bytes)
            and isinstance(stored, str)
            and (redacted is None or type(redacted) is type(body))
            and isinstance(redacted_hash, str | None)
        ):
            raise damage(at, "bad_payload", "a column has the wrong type")
        if chain_hash(prev, body) != stored:
            if isinstance(body, bytes) and not _is_utf8(body):  # say what a str read would
                raise damage(at, "bad_payload", "the stored text is not valid UTF-8")
            raise damage(
                at,
                "bad_hash",
                f"stored hash {stored!r} does not match the body chained to the previous row",
            )
        if redacted is None:
            texts.append(body)
        else:
            if redacted_hash != chain_hash(stored, redacted):
                raise damage(at, "bad_hash", "the redacted body does not match its hash")
            texts.append(redacted)
        prev = stored
        index += 1
    if index != end:
        raise damage(index, "bad_sequence", f"the row is missing (expected {end} rows)")
    if head is not None and prev != head:
        raise damage(
            end - 1, "broken_chain", "the last row's hash is not the session's recorded head"
        )
    # The hashes hold: a sealed text is the writer's, so a failure to open it is
    # a key problem (DecryptionError), not damage.
    texts = [unseal(cipher, text) for text in texts]
    messages = decode_messages(texts)
    if messages is None:  # one of them is no message: find it, for the report
        for at, text in enumerate(texts, start=first):
            try:
                decode_message(text.decode("utf-8") if isinstance(text, bytes) else text)
            except (DecodeError, UnicodeDecodeError) as exc:
                raise damage(at, "bad_payload", str(exc)) from None
        raise damage(first, "bad_payload", "the rows do not decode")
    return messages


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def looks_like_message(raw: Any) -> bool:
    """A cheap shape check for a message read back from bytes a hash vouches for.

    Messages are fully validated when written; a read only needs to see that the
    stored value is still one (role, a list of content blocks).
    """
    if type(raw) is not dict or raw.get("role") not in ("user", "assistant"):
        return False
    content = raw.get("content")
    if type(content) is not list:
        return False
    # A loop: all() over a generator costs more than the one block most messages hold.
    for block in content:  # noqa: SIM110
        if type(block) is not dict:
            return False
    return True


def decode_state(text: str, cipher: Cipher | None = None) -> dict[str, Any]:
    """The agent state stored as ``text`` (opened with ``cipher`` when sealed).

    Raises:
        DecodeError: ``text`` is not a JSON object.
        DecryptionError: sealed text that ``cipher`` cannot open (or no cipher).
    """
    value = _load(unseal(cipher, text))
    if not isinstance(value, dict):
        raise DecodeError(f"agent state is not a JSON object but {type(value).__name__}")
    return value


# ---------------------------------------------------------------- argument checks


def check_list_args(limit: Any, after: Any) -> None:
    """Raise ``ValueError``/``TypeError`` naming a bad ``limit`` or ``after``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    if after is not None:
        validate_session_id(after, "after")


def check_get_args(session_id: Any, offset: Any) -> None:
    """Raise ``TypeError``/``ValueError`` naming a bad argument of ``get``."""
    validate_session_id(session_id)
    check_offset(offset)


def check_offset(offset: Any, name: str = "offset") -> None:
    """Raise ``TypeError``/``ValueError`` naming a bad ``offset`` (an int >= 0)."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"{name} must be an int, got {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"{name} must be >= 0, got {offset}")


class CommitRequest(NamedTuple):
    """A commit's arguments, checked by :func:`commit_request` (one is made per commit).

    ``redactions`` holds ``(index, replacement)`` pairs sorted by index, every index
    naming a message of ``messages``; replacements are not encoded yet (each store
    encodes them in its own stored form).
    """

    session_id: str
    messages: Sequence[Message]
    agent_state: Mapping[str, Any] | None
    rewritten: bool
    expected_tail: str | None
    redactions: Sequence[tuple[int, Message]]


_NO_REDACTIONS: tuple[tuple[int, Message], ...] = ()


def commit_request(
    session_id: Any,
    messages: Any,
    agent_state: Any,
    rewritten: Any,
    expected_tail: Any,
    redactions: Any,
) -> CommitRequest:
    """Check the arguments of ``commit`` and return them as a :class:`CommitRequest`.

    Message contents are checked while they are encoded, since only the messages
    past the stored count are written (an agent validated them already).

    Raises:
        TypeError: an argument of the wrong type (the message names it).
        ValueError: a malformed session id, too many messages, or a redaction index
            that names no message of ``messages`` (a bool is no index).
    """
    validate_session_id(session_id)
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence of messages, got {type(messages).__name__}")
    if len(messages) > MAX_MESSAGES:
        raise ValueError(f"messages holds {len(messages)} messages; at most {MAX_MESSAGES} fit")
    if agent_state is not None and not isinstance(agent_state, Mapping):
        raise TypeError(f"agent_state must be a mapping or None, got {type(agent_state).__name__}")
    if not isinstance(rewritten, bool):
        raise TypeError(f"rewritten must be a bool, got {type(rewritten).__name__}")
    if expected_tail is not None and not isinstance(expected_tail, str):
        raise TypeError(f"expected_tail must be a str or None, got {type(expected_tail).__name__}")
    if redactions is None or (isinstance(redactions, Mapping) and not redactions):
        checked = _NO_REDACTIONS
    elif isinstance(redactions, Mapping):
        checked = check_redactions(redactions, len(messages), session_id)
    else:
        raise TypeError(f"redactions must be a mapping or None, got {type(redactions).__name__}")
    return CommitRequest(session_id, messages, agent_state, rewritten, expected_tail, checked)


def check_redactions(
    redactions: Mapping[Any, Message], count: int, session_id: str
) -> tuple[tuple[int, Message], ...]:
    """The ``(index, replacement)`` pairs of ``redactions``, sorted, for ``count`` messages.

    Raises:
        ValueError: a key that is not an int (a bool is refused: ``True`` is no
            message index) or names no message of the ``count`` committed.
    """
    for index in redactions:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(
                f"redaction index {index!r} names no message of session {session_id!r} "
                f"(it holds {count} after this commit)"
            )
    return tuple(sorted(redactions.items()))


class CommitPlan(NamedTuple):
    """What a commit writes, as :func:`plan_commit` decided it.

    Attributes:
        start: index of the first message to write (``0`` for a rewrite); the
            messages from there on are new.
        compare_last: the commit must extend the stored history; the store passes
            its last stored message to :func:`check_extends` before writing.
    """

    start: int
    compare_last: bool


def plan_commit(request: CommitRequest, stored: int, stored_tail: str) -> CommitPlan:
    """Decide a commit against the stored history: conflict, or what is new (SPEC §7).

    ``stored`` is the number of messages stored, ``stored_tail`` the token the
    store reports as the session's tail.

    Raises:
        SessionConflictError: ``expected_tail`` is not ``stored_tail``, or the
            history is shorter than the stored one without ``rewritten``.
    """
    session_id = request.session_id
    expected_tail = request.expected_tail
    if expected_tail is not None and expected_tail != stored_tail:
        raise SessionConflictError(
            f"session {session_id!r} changed since this writer last saw it "
            "(another writer committed); reopen the session to continue",
            details={"expected_tail": expected_tail, "stored_tail": stored_tail},
        )
    if request.rewritten:
        return CommitPlan(0, False)
    if len(request.messages) < stored:
        raise SessionConflictError(
            f"session {session_id!r} holds {stored} messages but the commit has "
            f"{len(request.messages)}; a shorter history needs rewritten=True"
        )
    return CommitPlan(stored, expected_tail is None and stored > 0)


def writes_anything(request: CommitRequest, plan: CommitPlan) -> bool:
    """Whether the commit changes the session (else it returns the stored tail)."""
    return bool(
        request.rewritten
        or plan.start < len(request.messages)
        or request.redactions
        or request.agent_state is not None
    )


def check_extends(
    session_id: str,
    messages: Sequence[Message],
    stored: int,
    last: Sequence[Any],
    *,
    encode: Callable[[Message], Any] | None = None,
) -> None:
    """The rule for a commit without ``expected_tail`` (SPEC §7), the same in every store.

    Such a commit must extend the stored history, not diverge from it. Comparing
    the whole stored history on every commit would cost a read of it all, so the
    check is one message: ``messages[stored - 1]`` must equal the last stored
    message, as written or as redacted (``last`` holds those, decoded — or in the
    stored form, and then ``encode`` gives that form of a message). That catches
    two writers who both started from the same history and each committed a
    different next message: the second one's message at that index is not the
    stored one. (A writer that changed an earlier message and kept the last one
    equal is not caught; pass ``expected_tail`` for a complete check.)

    Raises:
        SessionConflictError: ``messages`` diverges from the stored history.
    """
    if stored == 0 or len(messages) < stored:
        return  # nothing stored to diverge from; a shorter history is refused apart
    candidate = messages[stored - 1]
    if encode is None:
        # In the stored form on both sides: a tuple the caller holds was stored, and
        # reads back, as a list, and (1, 2) != [1, 2].
        last = [encode_bytes_values(message) for message in last]
        encode = encode_bytes_values
    if encode(candidate) not in last:
        raise SessionConflictError(
            f"session {session_id!r} holds a different message at index {stored - 1} "
            "than this commit: another writer committed since this history was read; "
            "reopen the session (or pass expected_tail) to continue",
            details={"index": stored - 1},
        )


def encode_redactions(
    redactions: Iterable[tuple[int, Message]], cipher: Cipher | None = None
) -> dict[int, str]:
    """Stored texts of checked redactions (:attr:`CommitRequest.redactions`), by index
    (sealed with ``cipher``).

    Raises:
        ValueError: a replacement that cannot be stored.
        TypeError: a replacement that is not a message.
    """
    return {
        index: encode_message(replacement, f"redactions[{index}]", cipher)
        for index, replacement in redactions
    }


# ---------------------------------------------------------------- retention


def check_max_checkpoints(max_checkpoints: Any) -> int | None:
    """``max_checkpoints`` checked: ``None`` (keep all) or an int >= 1.

    Raises:
        ValueError: anything else (a bool is refused).
    """
    if max_checkpoints is not None and (
        isinstance(max_checkpoints, bool)
        or not isinstance(max_checkpoints, int)
        or max_checkpoints < 1
    ):
        raise ValueError(f"max_checkpoints must be None or an int >= 1, got {max_checkpoints!r}")
    return max_checkpoints


def check_max_checkpoint_age(max_checkpoint_age: Any) -> float | None:
    """``max_checkpoint_age`` checked: ``None`` (no age limit) or seconds > 0.

    Raises:
        ValueError: anything else — a bool, a string, zero, a negative number, NaN or
            infinity (the message names the argument).
    """
    if max_checkpoint_age is None:
        return None
    if (
        isinstance(max_checkpoint_age, bool)
        or not isinstance(max_checkpoint_age, int | float)
        or not math.isfinite(max_checkpoint_age)
        or not max_checkpoint_age > 0
    ):
        raise ValueError(
            "max_checkpoint_age must be None or a number of seconds > 0, "
            f"got {max_checkpoint_age!r}"
        )
    return float(max_checkpoint_age)


def checkpoint_age_cutoff(
    max_checkpoint_age: float | None, now_ms: int | None = None
) -> str | None:
    """The checkpoint id below which a checkpoint is older than ``max_checkpoint_age``.

    A checkpoint's age is measured from the millisecond its id was made (ids are
    ULIDs, and :attr:`CheckpointMeta.created_at` is stamped at the same moment), so
    the rule needs no body nor meta: a checkpoint is too old when its id sorts
    before ``encode_ulid(now_ms - age_ms, 0)``, the smallest id of the cutoff
    millisecond. Stores that cannot call :func:`evicted_checkpoints` where they
    evict (a Redis script) compare ids with this string instead.

    Args:
        max_checkpoint_age: seconds (``None``: no limit, and the result is ``None``).
        now_ms: the current Unix time in milliseconds (default: the clock).
    """
    if max_checkpoint_age is None:
        return None
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    return encode_ulid(max(0, now_ms - round(max_checkpoint_age * 1000)), 0)


def evicted_checkpoints(
    ids: Sequence[str],
    max_checkpoints: int | None,
    max_checkpoint_age: float | None = None,
    *,
    now_ms: int | None = None,
) -> list[str]:
    """The checkpoint ids retention evicts, oldest first — the one rule of every store.

    ``ids`` are one session's checkpoint ids; ids are ULIDs, so sorted order is age
    order whatever the trigger. First every checkpoint older than
    ``max_checkpoint_age`` seconds goes (see :func:`checkpoint_age_cutoff`); then,
    of those left, the oldest past ``max_checkpoints``. An id that is no ULID has
    no known age: only the count evicts it. ``None`` lifts a limit; both ``None``
    keeps everything.
    """
    ordered = sorted(ids)
    cutoff = checkpoint_age_cutoff(max_checkpoint_age, now_ms)
    if cutoff is None:
        aged: list[str] = []
        kept = ordered
    else:
        aged = [cid for cid in ordered if cid < cutoff and is_ulid(cid)]
        gone = set(aged)
        kept = [cid for cid in ordered if cid not in gone]
    if max_checkpoints is None or len(kept) <= max_checkpoints:
        return aged
    return sorted([*aged, *kept[: len(kept) - max_checkpoints]])


class PastOffset(Sequence[Message]):
    """A whole history as a store's commit sees it: ``offset`` messages that only the
    store holds, then ``messages``.

    A store reads only the part past what it holds (a commit with ``expected_tail``
    needs nothing before its stored count, and a plain append the last stored one at
    most), so the part before ``offset`` need not be in memory. Reading it raises
    ``IndexError`` saying why (``hidden``) — never an empty or shorter history.
    """

    def __init__(
        self, offset: int, messages: Sequence[Message], hidden: str = "are only in the store"
    ) -> None:
        self._offset = offset
        self._messages = messages
        self._hidden = hidden

    def __len__(self) -> int:
        return self._offset + len(self._messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1 or start < self._offset:
                raise IndexError(f"messages before index {self._offset} {self._hidden}")
            return self._messages[start - self._offset : stop - self._offset]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"message {index} is past the end ({len(self)} messages)")
        if index < self._offset:
            raise IndexError(
                f"message {index} is before index {self._offset}: those {self._hidden}"
            )
        return self._messages[index - self._offset]

    def __iter__(self) -> Iterator[Message]:
        if self._offset:
            raise IndexError(f"messages before index {self._offset} {self._hidden}")
        return iter(self._messages)


def lease_held(session_id: str, where: str) -> SessionLockedError:
    """A server store's refusal of a writer while another holds the session's lease."""
    return SessionLockedError(
        f"session {session_id!r} is locked by another writer: another process or "
        f"machine holds its writer lease ({where})",
        details={"session_id": session_id, "reason": "leased"},
    )


def lease_lost(session_id: str, where: str) -> SessionLockedError:
    """A server store's refusal of a commit whose writer no longer holds the lease."""
    return SessionLockedError(
        f"session {session_id!r} is locked ({where}): this writer's lease expired (it "
        "was not renewed in time) or was taken over by another writer; nothing was written",
        details={"session_id": session_id, "reason": "lease_lost"},
    )
