"""``perdure serve``: the JSON API and web page over a store (needs ``perdure[server]``).

::

    perdure serve --store sqlite:./perdure.db                 # http://127.0.0.1:8765/
    perdure serve --store file:./data --memory sqlite:./memory.db
    PERDURE_TOKEN=s3cret perdure serve --host 0.0.0.0 --store postgresql://app@db/prod

Bound to anything but loopback, it refuses to start without a token (``--token`` or
``PERDURE_TOKEN``); with one, every ``/api/`` request needs
``Authorization: Bearer <token>``. With ``--signing-key-file`` (the key file of
``perdure checkpoints export --signing-key-file``) exports can be signed
(``…/export?signed=true``) and every import must be signed with that key.

A port outside 0–65535 is a usage error (exit 2); an address it cannot listen on
(a port in use, one it may not bind, a host that is not this machine's) is one
``error: cannot listen on HOST:PORT: …`` line, exit 6. The ``perdure serve: http://…``
line is printed once the socket listens (``--port 0``: on the port the system chose).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import click

from perdure.cli._common import (
    EXIT_ERROR,
    EXIT_USAGE,
    env_cipher,
    fail,
    handle_errors,
    read_key_file,
    session_store,
    store_option,
)


@click.command()
@store_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--token",
    envvar="PERDURE_TOKEN",
    default=None,
    metavar="TOKEN",
    help="Require Authorization: Bearer TOKEN on every /api/ route (env PERDURE_TOKEN).",
)
@click.option(
    "--memory",
    "memory_url",
    default=None,
    metavar="URL",
    help="A memory store to browse: sqlite:PATH or postgresql://…[?schema=NAME] (must exist).",
)
@click.option(
    "--max-body",
    type=int,
    default=None,
    metavar="BYTES",
    help="Largest request body accepted (default 64 MiB); larger ones get 413.",
)
@click.option(
    "--signing-key-file",
    metavar="FILE",
    default=None,
    help="HMAC key (the bytes of FILE, less a final newline) to sign exports with "
    "(?signed=true) and to verify every import against: unsigned ones are refused.",
)
@handle_errors
def serve(
    store_url: str,
    host: str,
    port: int,
    token: str | None,
    memory_url: str | None,
    max_body: int | None,
    signing_key_file: str | None,
) -> None:
    """Serve the JSON API and the web inspector (sessions, checkpoints, verify, memory).

    Open http://HOST:PORT/ in a browser; the API is described at /openapi.json.
    """
    try:
        import uvicorn

        from perdure.server import MAX_BODY, MemoryBrowser, check_bind, create_app
    except ImportError as exc:
        fail(f"{exc} (pip install 'perdure[server]')", EXIT_USAGE)
    check_bind(host, token)
    key = read_key_file(signing_key_file, "--signing-key-file")
    memory = MemoryBrowser(memory_url, cipher=env_cipher()) if memory_url else None
    if memory_url:
        from perdure.cli.memory import require_memory_store

        require_memory_store(memory_url)  # browsing must not create a memory store
    with session_store(store_url) as store:
        app = create_app(
            store,
            memory=memory,
            token=token,
            max_body=max_body or MAX_BODY,
            close_store=False,
            signing_key=key,
        )
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", server_header=False)
        server = uvicorn.Server(config)
        with listening_socket(host, port, config.backlog) as sock:
            url = f"http://{_url_host(host)}:{sock.getsockname()[1]}/"
            click.echo(f"perdure serve: {url} (store {store_url})", err=True)
            # What uvicorn.run does, on the socket bound above: Ctrl-C stops the
            # server; a startup that fails exits uvicorn's way (its own status 3
            # would read as "not found" here).
            with contextlib.suppress(KeyboardInterrupt, SystemExit):
                server.run(sockets=[sock])
        if not server.started:
            fail(f"the server on {url} did not start", EXIT_ERROR)
    if memory is not None:
        memory.close()


@contextlib.contextmanager
def listening_socket(host: str, port: int, backlog: int = 2048) -> Iterator[socket.socket]:
    """A TCP socket bound to ``host:port`` and listening, closed afterwards.

    Bound here rather than by uvicorn, so that an address it cannot take is one
    ``error: …`` line (exit 6) naming it and the system's reason, before anything
    says the server runs.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        fail(f"cannot listen on {_url_host(host)}:{port}: {reason}", EXIT_ERROR)
    try:
        yield sock
    finally:
        sock.close()


def _url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
