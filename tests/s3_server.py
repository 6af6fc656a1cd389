"""A real S3 API on loopback for the S3 tests: moto's server (import as a module).

``moto.server.ThreadedMotoServer`` serves S3's HTTP API on 127.0.0.1 at a free port,
started once per test process; each test gets a bucket of its own. No AWS account
is used: the credentials are dummies (``ENV``, which moto takes), set by the tests
for as long as they run, and every request goes to the loopback address. Without obstore or moto the
tests are skipped with the reason — except under ``CI=true``, where they must run:
they fail instead.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import urllib.request
import uuid
from typing import Any

import pytest

IN_CI = os.environ.get("CI") == "true"

# Dummy credentials for moto (any are taken), never real ones: a test sets them in
# its environment (monkeypatch) while it runs, and its subprocesses inherit them.
ENV = {
    "AWS_ACCESS_KEY_ID": "perdure-test",
    "AWS_SECRET_ACCESS_KEY": "perdure-test-secret",
    "AWS_REGION": "us-east-1",
}

_server: list[Any] = []  # (server, endpoint) once started


def require_s3() -> None:
    """Skip the test (fail it under CI=true) when obstore or moto is not installed."""
    missing = []
    for module, extra in (("obstore", "perdure[s3]"), ("moto.server", "moto[server]")):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"{module} ({extra})")
    if missing:
        reason = f"the S3 tests need {' and '.join(missing)}: pip install -e '.[dev]'"
        if IN_CI:
            pytest.fail(f"under CI=true the S3 tests must run, but {reason}")
        pytest.skip(reason)


def import_s3() -> None:
    """For a test module that imports obstore: skip it whole when it is missing."""
    try:
        import moto.server  # noqa: F401
        import obstore  # noqa: F401
    except ImportError:
        if IN_CI:
            raise
        pytest.skip(
            "obstore and moto[server] are not installed: pip install -e '.[dev]'",
            allow_module_level=True,
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def endpoint() -> str:
    """The loopback URL of the moto server, started on first use (once per process)."""
    require_s3()
    if not _server:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        port = _free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        atexit.register(stop)
        _server.append((server, f"http://127.0.0.1:{port}"))
    return str(_server[0][1])


def stop() -> None:
    """Stop the server if it was started (the session's end)."""
    if _server:
        server, _ = _server.pop()
        with contextlib.suppress(Exception):
            server.stop()


def new_bucket() -> str:
    """Create a bucket of its own for one test; return its name."""
    name = f"perdure-{uuid.uuid4().hex[:20]}"
    request = urllib.request.Request(f"{endpoint()}/{name}", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    return name
