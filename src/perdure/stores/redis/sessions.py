"""RedisSessionStore: live sessions in Redis, with native TTL (SPEC §6, §7, §9).

Per session, keys that share the ``{session_id}`` hash tag (so they live on one slot
of a cluster), under the store's ``prefix``:

- ``…{id}:h`` a hash, the head: message count, chain head, write counter, tail
  token, agent state and its hash, created and updated times;
- ``…{id}:m`` a list, one element per message: its 32-digit chain hash
  (:func:`~perdure.session.rules.chain_hash` over the message's JSON, message 0
  chained to 32 zeros, as the SQLite and PostgreSQL stores hash their rows) followed
  by the JSON text;
- ``…{id}:r`` a hash of redactions: index → ``chain_hash(row_hash, replacement)``
  followed by the replacement (the original stays in the list);
- ``…{id}:l`` the writer lease (a random token, ``SET NX PX``);
- ``…{id}:t`` the tombstone of a session with ``ttl`` (see below);
- ``…{id}:cm``/``…{id}:cb`` its checkpoints (:mod:`.checkpoints`).

Guarantees:

- **Atomic commits.** A commit is one Lua script: it checks the tail the store
  planned against, the writer's lease (its own token, or no live lease of another
  writer) and the list's length, then appends the new elements (or rewrites the
  list), stores the redactions and updates the head; or it changes nothing and says
  why (``session_conflict`` by the rules of
  :func:`~perdure.session.rules.plan_commit`, ``session_locked``,
  ``session_not_found``). The store plans against the head its own last commit
  left, so a commit is one round trip; a stale guess (another writer committed)
  costs a read of the head and a second plan, never a wrong write.
- **Faults.** When the connection is lost during a commit, the store reads the tail
  once the server answers (every commit writes a new random tail): applied, it
  returns normally; provably not (still the planned tail), it sends the commit
  again; otherwise it raises ``session_conflict`` (``details["outcome"]``
  ``"unknown"``). A server that does not answer raises
  :class:`~perdure.errors.StoreUnavailableError` with ``details["outcome"]``
  ``"unknown"`` (the commit may have been applied before the connection broke).
  Never a duplicate, never a lost acknowledged message.
- **One writer across machines**: :meth:`RedisSessionStore.writer_lock` takes the
  lease with ``SET NX PX`` (another writer gets ``session_locked`` at once), renews
  it every ``lease / 3`` seconds while the block runs, and deletes it (if still its
  own) on exit. A crashed holder's lease expires ``lease`` seconds after its last
  renewal. Commits name the token: once another writer took the lease over, they are
  refused (``session_locked``, reason ``lease_lost``); commits outside a lease are
  refused while another writer holds one (reason ``leased``).
- **A lease left by a lost connection stays this store's.** When the lease cannot be
  given back on exit (or its taking was applied but its answer lost), the store
  remembers its token, in this process: its next ``writer_lock`` on the session
  takes that lease over in the same script that takes a free one, and its next
  ``delete`` or commit outside a lease releases it first — so the store is never
  locked out by itself. Only a token this store made and no block of it holds any
  more is taken over: another store instance, process or machine (a child made by
  ``fork()`` too) is refused while that lease lives, as from any live holder, and
  gets in once it expires. Should this store's own leftover lease still refuse it
  (the server answered the call but not the release before it), the error says so
  (``details["reason"] == "own_lease"``).
- **Integrity**: every read verifies the chain over the elements it returns (a page
  from the hash of the element before it), the last one against the head, the
  state against its hash, and each message's JSON and shape: an element changed,
  removed or added behind the store's back raises
  :class:`~perdure.errors.SessionCorruptedError`. A read is one snapshot: one script,
  or (``get`` without ``ttl``) plain reads in one ``MULTI``/``EXEC``, which spares
  copying every element into Lua and out.
- **TTL** (``ttl=`` seconds of inactivity): the session's keys (head, messages,
  redactions) carry Redis's own expiry, renewed together by every commit and every
  ``get``; Redis drops them together. A tombstone key, renewed with them, lives
  ``max(10 × ttl, 7 days)``: while it lives an expired session reads as
  ``session_not_found`` with ``details["reason"] == "expired"`` (an id never seen, or
  whose tombstone expired too, has ``"unknown"``). ``create`` starts an expired id
  afresh. ``list`` shows only live sessions. The session's checkpoints expire with
  it (SPEC §9: give a ``Session`` a ``checkpoints=`` store to keep them past the
  ttl); the lease does not. The rules are :mod:`perdure.session.expiry`'s.
- **A lost head is damage**: a session whose message list or redactions are there
  without its head hash (evicted under a ``maxmemory-policy`` that may evict any
  key, deleted by hand) raises :class:`~perdure.errors.SessionCorruptedError`
  (``details["missing_key"]``, ``details["found_key"]``) from every read, commit
  and ``create`` — never ``session_not_found``, never a fresh session over it —
  and ``list`` shows it with ``damaged`` set, so ``perdure verify`` reports it. No
  path but ``delete`` deletes a key it finds, except what an expiry leaves for a
  moment (see :mod:`._scripts`: told by the tombstone and the key's own deadline).
- **Any loop, any thread**: one client (and pool) per event loop, closed with its
  loop (see :mod:`._client`).

``list`` walks the keyspace with ``SCAN`` (cost: the whole keyspace of the server,
not only the store's) for heads, message lists and redactions (an id with messages
and no head is a lost head, checked once more by a script), then reads the heads it
found in one pipeline.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import hashlib
import secrets
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, NamedTuple

from perdure._runtime.checks import check_seconds
from perdure._runtime.threads import PerProcess
from perdure.crypto import Cipher
from perdure.errors import (
    DecryptionError,
    PerdureError,
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from perdure.session._locks import LockTable
from perdure.session.expiry import check_ttl, iso_time, not_found, tomb_seconds
from perdure.session.ids import validate_session_id
from perdure.session.paging import check_page_args, page_of, page_read_range
from perdure.session.rules import (
    HASH_LEN,
    ZERO_HASH,
    CommitRequest,
    DecodeError,
    chain_hash,
    check_cipher,
    check_extends,
    check_get_args,
    check_list_args,
    check_max_checkpoint_age,
    check_max_checkpoints,
    creation_time,
    decode_message,
    decode_messages,
    decode_state,
    encode_message,
    encode_redactions,
    encode_state,
    lease_held,
    lease_lost,
    new_tail,
    plan_commit,
    text_hash,
    unseal_all,
    utc_now,
    verify_rows,
    writes_anything,
)
from perdure.session.store import CommitResult, HistoryPage, SessionMeta, SessionRecord, StoreBase
from perdure.stores.redis._client import Connection, PerLoop
from perdure.stores.redis._keys import UNAVAILABLE, Keys, check_prefix, keys_of, translate, where
from perdure.stores.redis.checkpoints import RedisCheckpointStore
from perdure.types import Message

__all__ = ["RedisSessionStore"]

_COMMIT_ATTEMPTS = 6  # plans against a moved session, or resends after a lost reply
_HEADS_KEPT = 4096  # heads remembered per store (the guess a commit plans with)
_READ_ATTEMPTS = 3  # sendings of a read (or a checked script) over lost connections
_SCAN_COUNT = 1000
_LEFT_PER_SESSION = 8  # tokens of unreleased leases remembered per session
_LEFT_SESSIONS = 4096  # sessions with unreleased leases remembered per store


class _Head(NamedTuple):
    """A session's head hash, decoded and checked."""

    total: int
    head: str
    writes: int
    tail: str
    state: str | None
    state_hash: str | None
    created_at: str
    updated_at: str

    def meta(self, session_id: str) -> SessionMeta:
        return SessionMeta(session_id, self.created_at, self.updated_at, self.total)


class _Seen(NamedTuple):
    """What a commit plans against: the head, the last message's texts, the lease."""

    head: _Head
    last: tuple[str, ...]  # the last message as stored, and its redaction if any
    length: int  # the list's length


class _Unreleased:
    """The tokens of a store's own leases it could not release, per session id.

    Each may still be the session's lease in Redis, held by no block of the store:
    its next ``writer_lock`` may take it over, its next call releases it. Kept per
    process (a child made by ``fork()`` starts with none: it is another writer).
    """

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.tokens: dict[str, builtins.list[str]] = {}

    def of(self, session_id: str) -> builtins.list[str]:
        with self.guard:
            return builtins.list(self.tokens.get(session_id, ()))

    def add(self, session_id: str, token: str) -> None:
        with self.guard:
            if len(self.tokens) >= _LEFT_SESSIONS and session_id not in self.tokens:
                # The oldest goes: its lease expires by itself within ``lease``.
                del self.tokens[next(iter(self.tokens))]
            kept = self.tokens.setdefault(session_id, [])
            kept.append(token)
            del kept[:-_LEFT_PER_SESSION]

    def discard(self, session_id: str, tokens: Sequence[str]) -> None:
        """Forget ``tokens``: the server answered, the lease is none of them now."""
        if not tokens:
            return
        with self.guard:
            kept = [t for t in self.tokens.get(session_id, ()) if t not in tokens]
            if kept:
                self.tokens[session_id] = kept
            else:
                self.tokens.pop(session_id, None)


class RedisSessionStore(StoreBase):
    """Sessions in Redis (see the module docstring).

    Args:
        url: a ``redis://`` or ``rediss://`` URL (``redis://host:6379/0``).
        prefix: put before every key of the store (no braces).
        ttl: seconds of inactivity after which a session expires (``None``: never).
        max_checkpoints: keep at most this many checkpoints per session in
            :attr:`checkpoints` (the oldest are evicted, whatever their trigger).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        lease: seconds a writer's lease lasts without renewal.
        socket_timeout: seconds to wait for an answer of the server.
        connect_timeout: seconds to wait for a connection.
        cipher: a :class:`~perdure.crypto.Cipher`: message bodies, the state and
            checkpoints are stored encrypted; element hashes cover the ciphertext
            (SPEC §9).

    Constructing does no I/O.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "perdure:",
        ttl: float | None = None,
        max_checkpoints: int | None = None,
        lease: float = 30.0,
        socket_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r}")
        for name, value in (
            ("lease", lease),
            ("socket_timeout", socket_timeout),
            ("connect_timeout", connect_timeout),
        ):
            check_seconds(name, value)
        checked_ttl = check_ttl(ttl)
        self.url = url
        self.prefix = check_prefix(prefix)
        self.ttl = checked_ttl
        self.lease = float(lease)
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self.max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
        self.server = where(url)
        self._clients = PerLoop(
            url, socket_timeout=float(socket_timeout), connect_timeout=float(connect_timeout)
        )
        self._ttl_ms = 0 if self.ttl is None else max(1, round(self.ttl * 1000))
        self._tomb_ms = 0 if self.ttl is None else round(tomb_seconds(self.ttl) * 1000)
        self._locks = LockTable()
        self._tokens: dict[str, str] = {}
        self._tokens_guard = threading.Lock()
        self._unreleased = PerProcess(_Unreleased)
        self._heads: dict[str, _Seen] = {}  # the head each session's last commit left
        self._heads_guard = threading.Lock()
        self.checkpoints = RedisCheckpointStore(
            self._clients,
            self.prefix,
            self.server,
            self.max_checkpoints,
            self.max_checkpoint_age,
            cipher,
        )
        """Checkpoints in the same Redis, deleted with their session."""

    def __repr__(self) -> str:
        return f"RedisSessionStore({self.server!r}, prefix={self.prefix!r})"

    # ------------------------------------------------------------------ protocol

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: datetime | str | None = None,
    ) -> SessionMeta:
        """Register a new, empty session (an expired id starts afresh), created at
        ``created_at`` (default: now).

        Never deletes what it finds but the rest of an expired session, which Redis
        was dropping (see :mod:`._scripts`); checkpoints kept under the id stay.

        Raises:
            SessionConflictError: it exists already and ``exist_ok`` is false.
            SessionCorruptedError: the id's messages are there but its head hash is
                not (``details["missing_key"]``, ``details["found_key"]``).
            TypeError, ValueError: ``created_at`` is no timezone-aware time (see
                :meth:`SessionStore.create`).
        """
        validate_session_id(session_id)
        created = creation_time(created_at)
        keys = self._keys(session_id)
        tail = new_tail(0)
        args = [created, tail, ZERO_HASH, self._ttl_ms, self._tomb_ms]
        doing = f"creating session {session_id!r}"
        # Safe to send again: a reply naming this call's tail says it made the session.
        self._forget(session_id)
        reply = await self._call(
            lambda c: c.create([*keys.session, keys.cp_meta, keys.cp_body], args), doing
        )
        if reply[0] == 1:
            return SessionMeta(session_id, created, created, 0)
        if reply[0] == 2:
            raise self._bad_meta(session_id)
        if reply[0] == 3:
            raise self._orphaned(session_id, reply[1])
        stored_created, updated, count, stored_tail = (_text(v) for v in reply[1:5])
        if stored_tail == tail:
            return SessionMeta(session_id, created, created, 0)
        if not exist_ok:
            raise SessionConflictError(
                f"session {session_id!r} already exists in the Redis store at {self.server}"
            )
        try:
            total = int(count)
        except ValueError:
            raise self._bad_meta(session_id) from None
        return SessionMeta(session_id, stored_created, updated, total)

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        """Read and verify a session: metadata, messages from ``offset``, state, tail.

        One script (one snapshot); with ``ttl`` it renews the session.

        Raises:
            SessionNotFoundError: no such session (``details["reason"]``:
                ``"unknown"`` or ``"expired"``).
            SessionCorruptedError: an element read is damaged (the error names it).
        """
        check_get_args(session_id, offset)
        keys = self._keys(session_id)
        found = None if self.ttl is not None else await self._read_whole(session_id, keys, offset)
        if found is None:  # renews the TTL, or the offset lies past the end
            found = await self._read(
                session_id, keys, [offset, -1, 1, self._ttl_ms, self._tomb_ms], "reading"
            )
        head, start, rows, redacted = found
        first = min(offset, head.total)
        try:
            messages = self._verify(session_id, head, rows, start, redacted, first, head.total)
        except DecryptionError:
            self._state(session_id, head)  # its hash too, before the key stops us
            raise
        return SessionRecord(
            meta=head.meta(session_id),
            messages=messages,
            offset=first,
            agent_state=self._state(session_id, head),
            tail=head.tail,
        )

    async def history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        """One pair-aligned page, reading and verifying only the elements it needs.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: an element read is damaged.
        """
        validate_session_id(session_id)
        check_page_args(offset, limit)
        keys = self._keys(session_id)
        head, start, rows, redacted = await self._read(
            session_id, keys, [offset, limit, 2, 0, 0], "paging"
        )
        lo, hi = page_read_range(head.total, offset, limit)
        rows = rows[: max(0, hi - start)]
        window = self._verify(session_id, head, rows, start, redacted, lo, hi)
        return page_of(head.total, offset, limit, lo, window)

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> builtins.list[SessionMeta]:
        """Metadata of live sessions sorted by id, ids greater than ``after``.

        Walks the server's keyspace (``SCAN``); reads no content. A session whose
        head cannot be read is listed with ``damaged`` set, and so is one whose
        messages are there without its head (a lost head: ``get`` raises
        :class:`~perdure.errors.SessionCorruptedError`).

        Raises:
            ValueError: a bad ``limit`` or ``after``.
        """
        check_list_args(limit, after)
        # Heads, and the message lists and redactions that tell a lost head (one walk).
        pattern = _glob_escape(self.prefix) + "{*}:[hmr]"
        start = len(self.prefix) + 1
        doing = "listing sessions"
        conn = await self._conn(doing)
        try:
            ids: set[str] = set()
            loose: set[str] = set()
            async for key in conn.client.scan_iter(match=pattern, count=_SCAN_COUNT):
                text = _text(key)
                if text.endswith("}:h"):
                    ids.add(text[start:-3])
                elif text.endswith(("}:m", "}:r")):
                    loose.add(text[start:-3])
            orphans: dict[str, SessionMeta] = {}
            for session_id in sorted(loose - ids):
                if after is not None and session_id <= after:
                    continue
                meta = await self._probe(conn, session_id)
                if meta is True:
                    ids.add(session_id)
                elif isinstance(meta, SessionMeta):
                    orphans[session_id] = meta
            ids |= set(orphans)
            chosen = sorted(i for i in ids if after is None or i > after)
            metas: builtins.list[SessionMeta] = []
            while chosen and (limit is None or len(metas) < limit):
                batch = chosen[:500] if limit is None else chosen[: limit - len(metas)]
                chosen = chosen[len(batch) :]
                async with conn.client.pipeline(transaction=False) as pipe:
                    for session_id in batch:
                        head = self._keys(session_id).head
                        pipe.hmget(head, "created", "updated", "count", "tail")
                        if self.ttl is not None:
                            pipe.pttl(head)
                    replies = await pipe.execute(raise_on_error=False)
                now = time.time()
                step = 1 if self.ttl is None else 2
                for at, session_id in enumerate(batch):
                    meta = orphans.get(session_id) or self._listed(session_id, replies[at * step])
                    if meta is not None and step == 2 and meta.damaged is None:
                        left = replies[at * step + 1]
                        if isinstance(left, int) and left >= 0:
                            meta = dataclasses.replace(meta, expires_at=iso_time(now + left / 1000))
                    if meta is not None:
                        metas.append(meta)
            return metas
        except UNAVAILABLE as exc:
            raise translate(exc, self.server, doing) from exc

    async def _probe(self, conn: Connection, session_id: str) -> SessionMeta | bool | None:
        """For an id whose messages the scan found without a head: True when the head
        is there now, a damaged meta when it is not, None when both are gone (an
        expiry, a delete)."""
        keys = self._keys(session_id)
        try:
            reply = await conn.probe(keys.session, [])
        except Exception as exc:
            raise translate(exc, self.server, "listing sessions") from exc
        if reply == 1:
            return True
        if isinstance(reply, list):
            error = self._orphaned(session_id, reply[1])
            return SessionMeta(session_id, "", "", 0, damaged=str(error))
        return None

    async def _apply_commit(self, request: CommitRequest) -> CommitResult:
        """Persist a checked commit: plan against the head, then one checked script."""
        session_id = request.session_id
        state_text = (
            None if request.agent_state is None else encode_state(request.agent_state, self.cipher)
        )
        redactions = encode_redactions(request.redactions, self.cipher)
        keys = self._keys(session_id)
        token = self._token(session_id)
        if token is None and self._unreleased.value.tokens:
            await self._release_left(session_id, keys)
        # Planned against the head this store last left (its own last commit, as a
        # rule), so a commit is one round trip; the script checks that guess, and a
        # refusal planned on it is only believed once the head was read afresh.
        seen, fresh = self._remembered(session_id), False
        for _ in range(_COMMIT_ATTEMPTS):
            if seen is None:
                seen, fresh = await self._read_head(session_id, keys, token), True
            head = seen.head
            try:
                plan = plan_commit(request, head.total, head.tail)
                if plan.compare_last:
                    last = [self._decode(session_id, head.total - 1, t) for t in seen.last]
                    check_extends(session_id, request.messages, head.total, last)
            except SessionConflictError:
                if fresh:
                    raise
                seen = None
                continue
            if not writes_anything(request, plan):
                if fresh:
                    return CommitResult(head.tail, head.total)
                seen = None
                continue
            if not request.rewritten and seen.length != head.total:
                raise self._damage(
                    session_id,
                    min(seen.length, head.total),
                    "bad_sequence",
                    f"the list holds {seen.length} messages, the head says {head.total}",
                )
            args, after, last_texts = await self._commit_args(
                request, keys, seen, plan.start, state_text, redactions, token
            )
            try:
                applied = await self._send(session_id, keys, args, head, after)
            except Exception:
                self._forget(session_id)
                raise
            if applied:
                self._remember(session_id, _Seen(after, last_texts, after.total))
                return CommitResult(after.tail, after.total)
            seen = None  # the session moved: read it and plan again
        self._forget(session_id)
        raise SessionConflictError(
            f"session {session_id!r} kept changing under this commit (Redis store at "
            f"{self.server}, {_COMMIT_ATTEMPTS} attempts); reopen the session to continue"
        )

    async def delete(self, session_id: str) -> None:
        """Delete a session with its messages, state and checkpoints; absent is fine.

        A lease this store could not release before (a lost connection) is
        released first.

        Raises:
            SessionLockedError: another writer holds the session's lease.
        """
        validate_session_id(session_id)
        keys = self._keys(session_id)
        await self._release_left(session_id, keys)
        token = self._token(session_id) or ""
        done = await self._call(
            lambda c: c.delete([*keys.session, keys.cp_meta, keys.cp_body, keys.lease], [token]),
            f"deleting session {session_id!r}",
        )
        self._forget(session_id)
        if done != 1:
            raise self._leased(session_id, done[1])

    def writer_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's writer lease for an ``async with`` block.

        Other store instances, processes and machines get ``SessionLockedError`` at
        once. The lease is renewed every ``lease / 3`` seconds while held and
        deleted on exit; a crashed holder's lease expires after ``lease`` seconds.
        A lease this store could not delete (the connection was lost) is taken back
        by its next ``writer_lock`` on the session, never by another writer.

        Raises (on enter):
            SessionLockedError: another writer holds it; never waits.
            StoreUnavailableError: the server cannot be reached.
        """
        validate_session_id(session_id)
        return self._hold(session_id)

    async def aclose(self) -> None:
        """Close the running loop's connections (reopened on the next call).

        Connections of other loops close when their loop shuts down.
        """
        await self._clients.aclose()

    def close(self) -> None:
        """Close the connections of every loop (reopened on use); see
        :meth:`PerLoop.close <perdure.stores.redis._client.PerLoop.close>`.

        A loop's connections also close by themselves when the loop shuts down (an
        ``asyncio.run`` ends); call this at shutdown for a loop that lives on.
        """
        self._clients.close()

    # ------------------------------------------------------------------ connections

    def _keys(self, session_id: str) -> Keys:
        return keys_of(self.prefix, session_id)

    async def _conn(self, doing: str) -> Connection:
        try:
            return await self._clients.get()
        except UNAVAILABLE as exc:
            raise translate(exc, self.server, doing) from exc

    async def _call(self, work: Any, doing: str) -> Any:
        """Run ``work(connection)``, sent again (up to 3 times) when the connection
        is lost: only for work that is safe to repeat (reads, checked scripts)."""
        for attempt in range(_READ_ATTEMPTS):
            try:
                conn = await self._clients.get()
                return await work(conn)
            except UNAVAILABLE as exc:
                if attempt + 1 == _READ_ATTEMPTS:
                    raise translate(exc, self.server, doing) from exc
                await asyncio.sleep(0.1 * (attempt + 1))
            except Exception as exc:
                raise translate(exc, self.server, doing) from exc
        raise AssertionError("unreachable")

    def _remembered(self, session_id: str) -> _Seen | None:
        with self._heads_guard:
            return self._heads.get(session_id)

    def _remember(self, session_id: str, seen: _Seen) -> None:
        with self._heads_guard:
            if len(self._heads) >= _HEADS_KEPT and session_id not in self._heads:
                self._heads.clear()
            self._heads[session_id] = seen

    def _forget(self, session_id: str) -> None:
        with self._heads_guard:
            self._heads.pop(session_id, None)

    # ------------------------------------------------------------------ leases

    def _token(self, session_id: str) -> str | None:
        if not self._locks.is_held(session_id):
            return None
        with self._tokens_guard:
            return self._tokens.get(session_id)

    @contextlib.asynccontextmanager
    async def _hold(self, session_id: str) -> AsyncIterator[None]:
        self._locks.acquire(session_id)  # this instance, in this process: at once
        try:
            keys = self._keys(session_id)
            token = secrets.token_hex(16)
            lease_ms = max(1, round(self.lease * 1000))
            unreleased = self._unreleased.value
            left = unreleased.of(session_id)  # leases of this store, held by no block
            try:
                taken = await self._call(
                    lambda c: c.acquire([keys.lease], [token, lease_ms, *left]),
                    f"taking the writer lease of session {session_id!r}",
                )
            except BaseException:
                # Maybe taken, the answer lost: this store's own to take back.
                unreleased.add(session_id, token)
                raise
            unreleased.discard(session_id, left)  # the lease is this token or not ours
            if not taken:
                raise lease_held(session_id, f"Redis store at {self.server}")
            with self._tokens_guard:
                self._tokens[session_id] = token
            renewer = asyncio.create_task(self._renew(keys.lease, token, lease_ms))
            try:
                yield
            finally:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer
                with self._tokens_guard:
                    self._tokens.pop(session_id, None)
                # Given back even when the block failed. When the server cannot be
                # reached, the token is kept: this store's next call on the session
                # gives it back or takes it over (else it expires).
                try:
                    await self._call(
                        lambda c: c.release([keys.lease], [token]),
                        f"releasing the writer lease of session {session_id!r}",
                    )
                except BaseException as exc:
                    unreleased.add(session_id, token)
                    if not isinstance(exc, Exception):
                        raise  # cancelled: kept all the same
        finally:
            self._locks.release(session_id)

    async def _release_left(self, session_id: str, keys: Keys) -> None:
        """Give back the leases of ``session_id`` this store could not release before
        (none: no I/O); still unreachable, they are kept for the next call."""
        unreleased = self._unreleased.value
        left = unreleased.of(session_id)
        if not left:
            return
        try:
            await self._call(
                lambda c: c.release([keys.lease], left),
                f"releasing a writer lease of session {session_id!r} left by a lost connection",
            )
        except PerdureError:
            return  # the call that follows says what the server does
        unreleased.discard(session_id, left)

    async def _renew(self, key: str, token: str, lease_ms: int) -> None:
        """Renew the lease every third of its life until cancelled (or taken over)."""
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                kept = await self._call(
                    lambda c: c.renew([key], [token, lease_ms]), "renewing a writer lease"
                )
            except (StoreUnavailableError, OSError):
                continue  # try again; commits are fenced by the token anyway
            if not kept:
                return  # taken over: this writer's commits are refused from now on

    # ------------------------------------------------------------------ errors

    def _leased(self, session_id: str, lease: Any) -> SessionLockedError:
        """The refusal of a writer while ``lease`` (the lease's value) is held: by
        another writer, or by this store's own lease it could not release yet."""
        where = f"Redis store at {self.server}"
        if lease is None or _text(lease) not in self._unreleased.value.of(session_id):
            return lease_held(session_id, where)
        return SessionLockedError(
            f"session {session_id!r} is locked ({where}) by this store's own writer "
            "lease, which it could not release when the connection to the server was "
            "lost; no other writer holds it. This store releases it on its next call "
            f"once the server answers, and it expires within {self.lease:g} s anyway",
            details={"session_id": session_id, "reason": "own_lease"},
        )

    def _damage(self, session_id: str, row: int, kind: str, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} is damaged (Redis store at {self.server}): "
            f"message {row}: {detail}",
            details={
                "session_id": session_id,
                "server": self.server,
                "prefix": self.prefix,
                "kind": kind,
                "row": row,
            },
        )

    def _bad_meta(
        self, session_id: str, detail: str = "impossible values"
    ) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} is damaged (Redis store at {self.server}): its head "
            f"hash holds {detail}",
            details={"session_id": session_id, "prefix": self.prefix, "kind": "bad_meta"},
        )

    def _orphaned(self, session_id: str, found: Any) -> SessionCorruptedError:
        """The error for a session whose ``found`` key is there without its head."""
        head, left = self._keys(session_id).head, _text(found)
        return SessionCorruptedError(
            f"session {session_id!r} is damaged (Redis store at {self.server}): its head "
            f"hash {head!r} is missing while {left!r} still holds its data (evicted under "
            "a maxmemory-policy, or deleted by hand?); nothing was deleted: restore the "
            "key from a backup, or delete the session to start it afresh",
            details={
                "session_id": session_id,
                "server": self.server,
                "prefix": self.prefix,
                "kind": "bad_meta",
                "missing_key": head,
                "found_key": left,
            },
        )

    def _not_found(self, session_id: str, expired: bool) -> SessionNotFoundError:
        error: SessionNotFoundError = not_found(
            session_id, f"the Redis store at {self.server}", expired=expired, ttl=self.ttl
        )
        return error

    # ------------------------------------------------------------------ reading

    def _head(self, session_id: str, fields: Sequence[Any]) -> _Head:
        """The head hash's fields (``_scripts._HEAD_FIELDS`` order), checked for sense."""
        try:
            count, head, writes, tail, state, state_hash, created, updated = fields
            total, done = int(count), int(writes)
            texts = [_text(v) for v in (head, tail, created, updated)]
        except (TypeError, ValueError):
            raise self._bad_meta(session_id) from None
        if total < 0 or done < 0 or len(texts[0]) != HASH_LEN:
            raise self._bad_meta(session_id)
        return _Head(
            total,
            texts[0],
            done,
            texts[1],
            None if state is None else _text(state),
            None if state_hash is None else _text(state_hash),
            texts[2],
            texts[3],
        )

    async def _read(
        self, session_id: str, keys: Keys, args: builtins.list[Any], doing: str
    ) -> tuple[_Head, int, builtins.list[bytes], dict[int, bytes]]:
        reply = await self._call(
            lambda c: c.read([*keys.session, keys.cp_meta, keys.cp_body], args),
            f"{doing} session {session_id!r}",
        )
        if reply[0] == 0:
            raise self._not_found(session_id, bool(reply[1]))
        if reply[0] == 2:
            raise self._bad_meta(session_id)
        if reply[0] == 3:
            raise self._orphaned(session_id, reply[1])
        head = self._head(session_id, reply[1])
        redacted: dict[int, bytes] = {}
        pairs = reply[4]
        for i in range(0, len(pairs) - 1, 2):
            try:
                redacted[int(pairs[i])] = pairs[i + 1]
            except ValueError:
                raise self._bad_meta(session_id, "a redaction of no message") from None
        return head, int(reply[2]), list(reply[3]), redacted

    async def _read_whole(
        self, session_id: str, keys: Keys, offset: int
    ) -> tuple[_Head, int, builtins.list[bytes], dict[int, bytes]] | None:
        """What the READ script returns for ``get`` without TTL, read by plain commands
        in one ``MULTI``/``EXEC`` (one snapshot, one round trip): the script would copy
        every element into Lua and out again. ``None`` when ``offset`` lies past the
        end (the script then reads the last element, which this cannot know).
        """
        start = max(0, offset - 1)

        async def work(conn: Connection) -> Any:
            async with conn.client.pipeline(transaction=True) as pipe:
                pipe.hmget(keys.head, *_HEAD_FIELDS)
                pipe.lrange(keys.messages, start, -1)
                pipe.hgetall(keys.redactions)
                pipe.exists(keys.head, keys.tomb, keys.messages, keys.redactions)
                replies = await pipe.execute(raise_on_error=False)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply  # as the server said it (WRONGTYPE: a damaged key)
            return replies

        fields, rows, pairs, exists = await self._call(work, f"reading session {session_id!r}")
        if fields[3] is None:  # no tail: no session, or a damaged head
            if exists:  # the script tells damage (a lost head) from expiry
                return None
            raise self._not_found(session_id, False)
        try:
            total = int(fields[0])
        except (TypeError, ValueError):
            raise self._bad_meta(session_id) from None
        if offset > total:
            return None
        head = self._head(session_id, fields)
        redacted: dict[int, bytes] = {}
        for index, text in pairs.items():
            try:
                redacted[int(index)] = text
            except ValueError:
                raise self._bad_meta(session_id, "a redaction of no message") from None
        return head, start, rows, redacted

    def _verify(
        self,
        session_id: str,
        head: _Head,
        elements: builtins.list[bytes],
        base: int,
        redacted: dict[int, bytes],
        first: int,
        end: int,
    ) -> builtins.list[Message]:
        """Check that ``elements`` (from index ``base``) hold messages ``first..end-1``
        chained from the one before ``first``; decode them (the rows' one check,
        :func:`~perdure.session.rules.verify_rows`)."""
        if not redacted:
            messages = _verified(
                elements, base, first, end, head.head if end == head.total else None, self.cipher
            )
            if messages is not None:
                return messages
        # Redactions, or a doubt: the rows' one check finds and names the damage.
        rows: builtins.list[tuple[int, bytes, str, bytes | None, str | None]] = []
        for at, element in enumerate(elements, start=base):
            body, stored = self._split(session_id, at, element)
            mark = redacted.get(at)
            if mark is None:
                rows.append((at, body, stored, None, None))
            else:
                text, mark_hash = self._split(session_id, at, mark)
                rows.append((at, body, stored, text, mark_hash))
        prev = ZERO_HASH
        if first > 0:
            if not rows or rows[0][0] != first - 1:
                raise self._damage(session_id, first - 1, "bad_sequence", "the element is missing")
            prev = rows[0][2]
            rows = rows[1:]
        return verify_rows(
            rows,
            first,
            prev,
            end,
            head.head if end == head.total else None,
            lambda at, kind, detail: self._damage(session_id, at, kind, detail),
            cipher=self.cipher,
        )

    def _split(self, session_id: str, at: int, element: bytes) -> tuple[bytes, str]:
        """An element's body and its stored hash."""
        try:
            stored = element[:HASH_LEN].decode("ascii")
        except UnicodeDecodeError:
            stored = ""
        if len(stored) != HASH_LEN:
            raise self._damage(session_id, at, "bad_payload", "the element has no hash")
        return bytes(element[HASH_LEN:]), stored

    def _state(self, session_id: str, head: _Head) -> dict[str, Any]:
        def damaged(detail: str) -> SessionCorruptedError:
            return SessionCorruptedError(
                f"session {session_id!r} is damaged (Redis store at {self.server}): "
                f"agent state: {detail}",
                details={"session_id": session_id, "prefix": self.prefix, "kind": "bad_state"},
            )

        if head.state is None:
            if head.state_hash is not None:
                raise damaged("the state is missing")
            return {}
        if head.state_hash != text_hash(head.state):
            raise damaged("the state does not match its hash")
        try:
            return decode_state(head.state, self.cipher)
        except DecodeError as exc:
            raise damaged(str(exc)) from None

    def _decode(self, session_id: str, index: int, text: str) -> Message:
        try:
            return decode_message(text, self.cipher)
        except DecodeError as exc:
            raise self._damage(session_id, index, "bad_payload", str(exc)) from None

    def _listed(self, session_id: str, reply: Any) -> SessionMeta | None:
        if isinstance(reply, Exception):
            return SessionMeta(session_id, "", "", 0, damaged=str(self._bad_meta(session_id)))
        created, updated, count, tail = reply
        if tail is None and created is None and count is None:
            return None  # expired or deleted since the scan
        try:
            return SessionMeta(session_id, _text(created), _text(updated), int(count))
        except (TypeError, ValueError):
            return SessionMeta(session_id, "", "", 0, damaged=str(self._bad_meta(session_id)))

    # ------------------------------------------------------------------ writing

    async def _read_head(self, session_id: str, keys: Keys, token: str | None) -> _Seen:
        """The head as it is now, with the last message; raises why a commit cannot go.

        Raises:
            SessionNotFoundError: the session is gone or expired.
            SessionLockedError: ``token`` names a lease that is no longer this
                writer's, or (no token) another writer holds a live lease.
        """
        reply = await self._call(
            lambda c: c.head([*keys.session, keys.lease], []), f"reading session {session_id!r}"
        )
        if reply[0] == 2:
            raise self._bad_meta(session_id)
        if reply[0] == 3:
            raise self._orphaned(session_id, reply[1])
        lease = reply[2] if reply[0] == 0 else reply[4]
        if reply[0] == 0:
            raise self._not_found(session_id, bool(reply[1]))
        self._check_lease(session_id, token, lease)
        head = self._head(session_id, reply[1])
        last: tuple[str, ...] = ()
        if head.total > 0:
            if reply[2] is None:
                raise self._damage(
                    session_id, head.total - 1, "bad_sequence", "the element is missing"
                )
            body, _ = self._split(session_id, head.total - 1, reply[2])
            last = (_text(body),)
            if reply[3] is not None:
                text, _ = self._split(session_id, head.total - 1, reply[3])
                last = (last[0], _text(text))
        return _Seen(head, last, int(reply[5]))

    def _check_lease(self, session_id: str, token: str | None, lease: Any) -> None:
        if token is not None and (lease is None or _text(lease) != token):
            raise lease_lost(session_id, f"Redis store at {self.server}")
        if token is None and lease is not None:
            raise self._leased(session_id, lease)

    async def _commit_args(
        self,
        request: CommitRequest,
        keys: Keys,
        seen: _Seen,
        start: int,
        state_text: str | None,
        redactions: dict[int, str],
        token: str | None,
    ) -> tuple[builtins.list[Any], _Head, tuple[str, ...]]:
        """The commit script's arguments, the head it leaves when applied, and the
        texts of the last message it leaves (as stored, and its redaction if any)."""
        head = seen.head
        messages = request.messages
        elements: builtins.list[bytes] = []
        total, chained = head.total, head.head
        row_hashes: dict[int, str] = {}
        last = seen.last
        if request.rewritten or len(messages) > start:
            last = ()
            chained = ZERO_HASH if request.rewritten else head.head
            for index in range(start, len(messages)):
                body = encode_message(messages[index], f"messages[{index}]", self.cipher)
                chained = chain_hash(chained, body)
                row_hashes[index] = chained
                elements.append(chained.encode("ascii") + body.encode("utf-8"))
                last = (body,)
            total = len(messages)
        if total - 1 in redactions and last:
            last = (last[0], redactions[total - 1])
        older = sorted(i for i in redactions if i not in row_hashes)
        if older:  # the hashes of stored rows; the script's tail check keeps them valid
            found = await self._call(
                lambda c: _lindex_many(c, keys.messages, older),
                f"reading session {request.session_id!r}",
            )
            for index, element in zip(older, found, strict=True):
                if element is None:
                    raise self._damage(
                        request.session_id, index, "bad_sequence", "the element is missing"
                    )
                row_hashes[index] = self._split(request.session_id, index, element)[1]
        pairs: builtins.list[Any] = []
        for index, text in sorted(redactions.items()):
            mark = chain_hash(row_hashes[index], text)
            pairs += [index, mark.encode("ascii") + text.encode("utf-8")]
        writes = head.writes + 1
        state_hash = head.state_hash if state_text is None else text_hash(state_text)
        after = _Head(
            total,
            chained,
            writes,
            new_tail(writes),
            state_text if state_text is not None else head.state,
            state_hash,
            head.created_at,
            utc_now(),
        )
        args: builtins.list[Any] = [
            head.tail,
            token or "",
            "1" if request.rewritten else "0",
            after.total,
            after.head,
            after.writes,
            after.tail,
            after.updated_at,
            "0" if state_text is None else "1",
            state_text or "",
            state_hash or "",
            self._ttl_ms,
            self._tomb_ms,
            start,
            len(elements),
            *elements,
            *pairs,
        ]
        return args, after, last

    async def _send(
        self, session_id: str, keys: Keys, args: builtins.list[Any], planned: _Head, after: _Head
    ) -> bool:
        """Send the commit; True once applied, False when the session moved (plan again).

        Raises:
            SessionNotFoundError, SessionLockedError: why the script refused it.
            SessionConflictError: the connection was lost and the session moved on.
            StoreUnavailableError: the server did not answer (``details["outcome"]``).
        """
        doing = f"committing to session {session_id!r}"
        conn = await self._conn(doing)
        for _ in range(_COMMIT_ATTEMPTS):
            try:
                reply = await conn.commit(
                    [*keys.session, keys.lease, keys.cp_meta, keys.cp_body], args
                )
            except UNAVAILABLE as exc:
                tail, count, hash_there = await self._settle(session_id, keys, after, exc)
                if tail is None:
                    raise self._not_found(session_id, False) from exc
                if tail == after.tail:
                    return True
                if tail == planned.tail:
                    conn = await self._conn(doing)
                    continue  # provably not applied: send it again
                if (
                    after.total > planned.total
                    and count >= after.total
                    and (hash_there == after.head)
                ):
                    return True  # applied, then others committed after it
                raise SessionConflictError(
                    f"session {session_id!r} changed (Redis store at {self.server}) while "
                    "the connection was lost during a commit; whether that commit was "
                    "applied first cannot be told: reopen the session to continue",
                    details={"session_id": session_id, "outcome": "unknown"},
                ) from exc
            except Exception as exc:
                raise translate(exc, self.server, doing) from exc
            status = _text(reply[0])
            if status == "ok":
                return True
            if status == "missing":
                raise self._not_found(session_id, bool(reply[1]))
            if status == "orphan":
                raise self._orphaned(session_id, reply[1])
            if status == "lease_lost":
                raise lease_lost(session_id, f"Redis store at {self.server}")
            if status == "leased":
                raise self._leased(session_id, reply[1] if len(reply) > 1 else None)
            if status == "bad_length":
                raise self._damage(
                    session_id,
                    planned.total,
                    "bad_sequence",
                    f"the list holds {int(reply[1])} messages, the head says {planned.total}",
                )
            # "moved": someone committed since the plan — or this very commit, sent
            # again by the driver after a lost reply.
            return _text(reply[1]) == after.tail
        raise StoreUnavailableError(
            f"Redis store at {self.server}: {doing}: the connection kept failing; the "
            "commit was not applied",
            details={"session_id": session_id, "outcome": "not_applied"},
        )

    async def _settle(
        self, session_id: str, keys: Keys, after: _Head, cause: BaseException
    ) -> tuple[str | None, int, str | None]:
        """After a lost connection: the session's tail (None: no session), message
        count and the hash of the element the commit would have ended with, once
        the server answers again.

        Raises:
            StoreUnavailableError: the server did not answer (outcome unknown).
        """
        for attempt in range(5):
            try:
                conn = await self._clients.get()
                async with conn.client.pipeline(transaction=True) as pipe:
                    pipe.hmget(keys.head, "tail", "count")
                    pipe.lindex(keys.messages, after.total - 1)
                    (tail, count), element = await pipe.execute()
            except UNAVAILABLE:
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            if tail is None:
                return None, 0, None
            there = (
                None if element is None else bytes(element[:HASH_LEN]).decode("ascii", "replace")
            )
            try:
                total = int(count)
            except (TypeError, ValueError):
                raise self._bad_meta(session_id) from None
            return _text(tail), total, there
        raise StoreUnavailableError(
            f"Redis store at {self.server}: the connection was lost during a commit to "
            f"session {session_id!r} and the server did not answer since; the commit may "
            "or may not have been applied: reopen the session once the server is back",
            details={"session_id": session_id, "server": self.server, "outcome": "unknown"},
        ) from cause


_HEAD_FIELDS = ("count", "head", "writes", "tail", "state", "state_hash", "created", "updated")
_ZERO = ZERO_HASH.encode("ascii")


def _verified(
    elements: Sequence[bytes],
    base: int,
    first: int,
    end: int,
    head: str | None,
    cipher: Cipher | None = None,
) -> builtins.list[Message] | None:
    """Messages ``first..end-1`` of ``elements`` (from index ``base``, no redaction
    among them) when each element's hash is its body chained to the element before
    (the one before ``first`` too, when ``first > 0``), the last one is ``head`` (when
    given) and every body is a message; ``None`` at the first doubt, for the
    one-check-at-a-time path of :meth:`RedisSessionStore._verify` to name it.

    The hot loop of a long resume: no call per element but the hash's own.
    """
    skip = first - base
    if skip not in (0, 1) or (skip == 1) != (first > 0) or len(elements) - skip != end - first:
        return None
    prev = _ZERO if skip == 0 else bytes(elements[0][:HASH_LEN])
    sha256 = hashlib.sha256
    bodies: builtins.list[bytes] = []
    append = bodies.append
    for at in range(skip, len(elements)):
        element = elements[at]
        body = element[HASH_LEN:]
        digest = sha256(prev + body).hexdigest()[:HASH_LEN].encode("ascii")
        if not element.startswith(digest):
            return None
        append(body)
        prev = digest
    if head is not None and prev != head.encode("ascii"):
        return None
    return decode_messages(unseal_all(cipher, bodies))


async def _lindex_many(conn: Connection, key: str, indexes: Sequence[int]) -> Any:
    async with conn.client.pipeline(transaction=False) as pipe:
        for index in indexes:
            pipe.lindex(key, index)
        return await pipe.execute()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected text, got {type(value).__name__}")


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
