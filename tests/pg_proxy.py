"""A TCP proxy in front of the real PostgreSQL server that can cut a connection.

It plays a network that fails at the worst moment: :meth:`CuttingProxy.cut_after`
lets the next client message holding some bytes (``b"UPDATE"``, say) reach the
server, then closes the client's connection before any answer gets back. The server
runs the statement and commits it; the client only sees its connection lost — the
"applied, but never acknowledged" case a crash of the client cannot show.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class CuttingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port); see the module docstring."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.cuts = 0
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, marker: bytes) -> None:
        """Cut the connection that next sends ``marker``, once it reached the server."""
        with self._lock:
            self._marker = marker

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
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        """Client to server: forward; on the marker, arm the cut of the answer."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        cut.set()
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _down(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        """Server to client: forward, unless the answer is the one to drop."""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if cut.is_set():
                    self.cuts += 1
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
