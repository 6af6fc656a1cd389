"""RedisSessionStore after a network blip: its own writer lease is its own (SPEC §7).

The network drops while a store holds a session's writer lease — a commit applied
with its answer lost, then nothing reaches the server until the block has ended —
so the lease cannot be given back and stays in Redis until it expires. The store
that left it must not be locked out by it: ``session_locked`` is for a second
writer, expiry for a crashed holder. Its next ``writer_lock`` takes the lease back,
its next ``delete`` or commit outside a lease releases it; any other store is still
refused while that lease lives.

The network is a TCP proxy of the test's own in front of the real server (see
redis_server), whose answers can be lost and which can go down and come back up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from perdure.errors import SessionLockedError, StoreUnavailableError
from perdure.testing.messages import text
from perdure.types import Message
from redis_server import client, drop_prefix, import_redis, new_prefix, require_server

import_redis()
from perdure.session import RedisSessionStore  # noqa: E402  (needs redis)
from perdure.stores.redis import _scripts  # noqa: E402


class BlipProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``: a network that can fail.

    - :meth:`cut_after`: the next client message holding some bytes reaches the
      server; its answer is lost, and the network goes down at that moment.
    - :meth:`down` / :meth:`up`: while down, every connection is cut and new ones are
      closed at once.
    - :meth:`refuse`: client messages holding some bytes never reach the server;
      their connection is cut.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._marker: bytes | None = None
        self._refused: bytes | None = None
        self.is_down = False
        self.cuts = 0
        self.refusals = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def refuse(self, marker: bytes | None) -> None:
        with self._lock:
            self._refused = marker

    def down(self) -> None:
        with self._lock:
            self.is_down = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def up(self) -> None:
        with self._lock:
            self.is_down = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        self.down()

    def _accept(self) -> None:
        while True:
            try:
                client_side, _ = self._listener.accept()
            except OSError:
                return
            if self.is_down:
                client_side.close()
                continue
            try:
                server_side = socket.create_connection(self.target)
            except OSError:
                client_side.close()
                continue
            with self._lock:
                self._sockets += [client_side, server_side]
            armed: list[bool] = []  # set: the answer to lose
            up = (client_side, server_side, armed)
            threading.Thread(target=self._up, args=up, daemon=True).start()
            back = (server_side, client_side, armed)
            threading.Thread(target=self._back, args=back, daemon=True).start()

    def _up(self, source: socket.socket, sink: socket.socket, armed: list[bool]) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self._lock:
                    if self.is_down:
                        break
                    if self._refused is not None and self._refused in data:
                        self.refusals += 1
                        break  # never sent: the connection is cut below
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        armed.append(True)
                sink.sendall(data)
        _shut(source, sink)

    def _back(self, source: socket.socket, sink: socket.socket, armed: list[bool]) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if armed:  # the server ran it: its answer is lost, the network goes
                    self.cuts += 1
                    self.down()
                    break
                if self.is_down:
                    break
                sink.sendall(data)
        _shut(source, sink)


def _shut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def prefix() -> Iterator[str]:
    require_server()
    name = new_prefix()
    yield name
    drop_prefix(name)


@pytest.fixture
def proxy() -> Iterator[BlipProxy]:
    url = urlsplit(require_server())
    blip = BlipProxy((url.hostname or "127.0.0.1", url.port or 6379))
    yield blip
    blip.close()


@pytest.fixture
def opened(prefix: str, proxy: BlipProxy) -> Iterator[Callable[..., RedisSessionStore]]:
    """Opens stores under the test's prefix (``through_proxy=True``: through the
    proxy, else straight to the server); every one is closed after the test."""
    url = urlsplit(require_server())
    stores: list[RedisSessionStore] = []

    def open_one(*, through_proxy: bool = False, **options: Any) -> RedisSessionStore:
        where = f"127.0.0.1:{proxy.port}" if through_proxy else url.netloc
        store = RedisSessionStore(f"redis://{where}{url.path}", prefix=prefix, **options)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


def lease_key(prefix: str, session_id: str = "s") -> str:
    return f"{prefix}{{{session_id}}}:l"


def lease_of(prefix: str, session_id: str = "s") -> bytes | None:
    with client() as c:
        value: bytes | None = c.get(lease_key(prefix, session_id))
        return value


def texts(messages: list[Message]) -> list[str]:
    return [m["content"][0]["text"] for m in messages]


FIRST = [text("user", "first"), text("assistant", "lost-answer")]


async def leave_a_lease(proxy: BlipProxy, store: RedisSessionStore, prefix: str) -> None:
    """A turn whose commit is applied, its answer lost, the network down until the
    block ended (so the lease was not given back); then the network comes back."""
    await store.create("s")

    async def turn() -> None:
        async with store.writer_lock("s"):
            await store.commit("s", FIRST[:1])
            proxy.cut_after(b"lost-answer")
            await store.commit("s", FIRST)

    with pytest.raises(StoreUnavailableError):
        await turn()
    assert proxy.cuts == 1
    await asyncio.sleep(0.3)  # a short blip: back well within the lease
    proxy.up()
    assert lease_of(prefix) is not None  # left in Redis, to expire in 30 s


async def test_the_store_takes_back_its_own_lease_left_by_a_lost_connection(
    proxy: BlipProxy, opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store, reader = opened(through_proxy=True), opened()
    await leave_a_lease(proxy, store, prefix)
    left = lease_of(prefix)
    async with asyncio.timeout(5), store.writer_lock("s"):  # at once, not in 30 s
        assert lease_of(prefix) not in (None, left)  # taken over with a new token
        await store.commit("s", [*FIRST, text("user", "after the blip")])
    assert lease_of(prefix) is None  # given back this time
    record = await reader.get("s")
    assert texts(record.messages) == ["first", "lost-answer", "after the blip"]


async def test_another_store_is_refused_while_the_left_lease_stands(
    proxy: BlipProxy, opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store, other = opened(through_proxy=True), opened()
    await leave_a_lease(proxy, store, prefix)
    # Another writer (another store instance: another process, another machine)
    # cannot tell a lost connection from a live holder: refused until it expires.
    with pytest.raises(SessionLockedError) as info:
        async with other.writer_lock("s"):
            pass
    assert info.value.details["reason"] == "leased"
    with pytest.raises(SessionLockedError) as info:
        await other.commit("s", [*FIRST, text("user", "from the other store")])
    assert info.value.details["reason"] == "leased"
    with pytest.raises(SessionLockedError):
        await other.delete("s")
    assert lease_of(prefix) is not None
    # The store that left it takes it back; the other one is refused while it holds it.
    async with store.writer_lock("s"):
        with pytest.raises(SessionLockedError):
            async with other.writer_lock("s"):
                pass
        await store.commit("s", [*FIRST, text("user", "mine")])
    async with other.writer_lock("s"):  # given back on exit
        await other.commit("s", [*FIRST, text("user", "mine"), text("assistant", "theirs")])
    assert texts((await other.get("s")).messages)[-2:] == ["mine", "theirs"]


async def test_delete_after_a_lost_connection_releases_the_stores_own_lease(
    proxy: BlipProxy, opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store, other = opened(through_proxy=True), opened()
    await leave_a_lease(proxy, store, prefix)
    await store.delete("s")  # not refused by its own lease
    assert lease_of(prefix) is None  # released first
    await other.create("s")
    async with other.writer_lock("s"):  # another writer gets in at once
        await other.commit("s", [text("user", "anew")])


async def test_a_commit_outside_a_lease_releases_the_stores_own_left_lease(
    proxy: BlipProxy, opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store, other = opened(through_proxy=True), opened()
    await leave_a_lease(proxy, store, prefix)
    await store.commit("s", [*FIRST, text("user", "outside a lease")])
    assert lease_of(prefix) is None
    async with other.writer_lock("s"):
        await other.commit("s", [*FIRST, text("user", "outside a lease"), text("user", "b")])


async def test_a_lease_taken_with_its_answer_lost_is_taken_back_by_its_store(
    proxy: BlipProxy, opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store, other = opened(through_proxy=True), opened()
    await store.create("s")
    proxy.cut_after(lease_key(prefix).encode())  # the taking of the lease
    with pytest.raises(StoreUnavailableError):
        async with store.writer_lock("s"):
            pytest.fail("entered a lease whose taking was never answered")
    proxy.up()
    assert lease_of(prefix) is not None  # set by the server, its token never heard
    with pytest.raises(SessionLockedError):
        async with other.writer_lock("s"):
            pass
    async with asyncio.timeout(5), store.writer_lock("s"):
        await store.commit("s", [text("user", "mine after all")])
    assert lease_of(prefix) is None


async def test_its_own_lease_that_could_not_be_released_yet_is_named_as_its_own(
    proxy: BlipProxy, opened: Callable[..., RedisSessionStore], prefix: str
) -> None:
    store = opened(through_proxy=True)
    await leave_a_lease(proxy, store, prefix)
    # The release never gets through, while the commit does: refused, saying whose
    # lease it is — not "another process or machine".
    release = hashlib.sha1(_scripts.RELEASE.encode(), usedforsecurity=False).hexdigest()
    proxy.refuse(release.encode("ascii"))
    history = [*FIRST, text("user", "outside a lease")]
    with pytest.raises(SessionLockedError) as info:
        await store.commit("s", history)
    assert info.value.details["reason"] == "own_lease"
    assert "this store's own writer lease" in str(info.value)
    assert "another process" not in str(info.value)
    assert proxy.refusals >= 1  # the release was tried, and never got through
    proxy.refuse(None)
    await store.commit("s", history)  # released now, then committed
    assert lease_of(prefix) is None
