"""A TCP proxy in front of the real PostgreSQL server that can cut a connection.

It plays a network that fails at the worst moment, in two ways:

- :meth:`CuttingProxy.cut_after` lets the next client message holding some bytes
  (``b"UPDATE"``, or a value only one statement sends) reach the server, then
  closes the client's connection before any answer gets back. The server runs the
  statement and commits it; the client only sees its connection lost — the
  "applied, but never acknowledged" case a crash of the client cannot show. A
  ``then`` callable runs once the server's answer arrived, before the client's
  connection is cut (another writer committing meanwhile, say).
- :meth:`CuttingProxy.drop_next` drops the next client message holding some bytes
  before it reaches the server, and cuts that connection: a request that never
  arrived. The server ends the connection's open transaction, if any.

:meth:`CuttingProxy.watch` counts the client messages holding some bytes that did
reach the server: how often a request was sent again.

A marker is looked for in each chunk a client sends at once (libpq writes a
statement with its values in one go); statements psycopg has prepared are sent
without their text, so a value of the statement is the surer marker.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


class CuttingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port); see the module docstring."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._marker: bytes | None = None
        self._then: Callable[[], None] | None = None
        self._drop: bytes | None = None
        self._watched: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self.cuts = 0
        self.drops = 0
        self.errors: list[BaseException] = []  # raised by a ``then`` (the test checks)
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, marker: bytes, then: Callable[[], None] | None = None) -> None:
        """Cut the connection that next sends ``marker``, once it reached the server
        and the server answered (``then`` runs before the cut)."""
        with self._lock:
            self._marker = marker
            self._then = then

    def drop_next(self, marker: bytes) -> None:
        """Drop the next client message holding ``marker`` and cut its connection."""
        with self._lock:
            self._drop = marker

    def watch(self, marker: bytes) -> None:
        """Count from now on the client messages holding ``marker`` that are forwarded."""
        with self._lock:
            self._watched[marker] = 0

    def forwarded(self, marker: bytes) -> int:
        """How many client messages holding ``marker`` reached the server (see :meth:`watch`)."""
        with self._lock:
            return self._watched[marker]

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            cut: list[Callable[[], None] | None] = []  # set: the answer to drop
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _up(
        self, client: socket.socket, server: socket.socket, cut: list[Callable[[], None] | None]
    ) -> None:
        """Client to server: forward; on a marker, arm the cut of the answer, or drop."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if self._drop is not None and self._drop in data:
                        self._drop = None
                        self.drops += 1
                        break  # never sent: the connection is cut below
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        cut.append(self._then)
                    for marker in self._watched:
                        if marker in data:
                            self._watched[marker] += 1
                server.sendall(data)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _down(
        self, server: socket.socket, client: socket.socket, cut: list[Callable[[], None] | None]
    ) -> None:
        """Server to client: forward, unless the answer is the one to drop."""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if cut:
                    self.cuts += 1
                    then = cut[0]
                    if then is not None:
                        try:
                            then()
                        except BaseException as exc:
                            self.errors.append(exc)
                    break  # the server answered: the statement ran; drop its answer
                client.sendall(data)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def cutting_proxy(host: str = "127.0.0.1", port: int = 5432) -> Iterator[CuttingProxy]:
    """A :class:`CuttingProxy` to the server, closed after the block."""
    proxy = CuttingProxy((host, port))
    try:
        yield proxy
    finally:
        proxy.close()
