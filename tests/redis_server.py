"""The real Redis server the Redis tests run against (import as a module).

The server is the one these machines run at 127.0.0.1:6379; ``PERDURE_TEST_REDIS``
names another. Each test gets a key prefix of its own, whose keys are deleted after
it. When no server answers, the tests are skipped with the reason — except under
``CI=true``, where they must run: they fail instead.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

URL = os.environ.get("PERDURE_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI") == "true"

_reason: list[str | None] = []  # the answer of the first probe, kept for the session


def unreachable() -> str | None:
    """Why the server cannot be used (None: it can), asked once per test process."""
    if not _reason:
        try:
            import redis
        except ImportError:
            _reason.append("redis-py is not installed: pip install 'perdure[redis]'")
        else:
            try:
                with redis.Redis.from_url(URL, socket_connect_timeout=3) as client:
                    client.ping()
                _reason.append(None)
            except redis.RedisError as exc:
                _reason.append(f"no Redis server at {URL}: {' '.join(str(exc).split())}")
    return _reason[0]


def import_redis() -> Any:
    """``redis``, for a test module that needs it at import: skipped when it is not
    installed (failed under CI=true, where ``perdure[redis]`` must be)."""
    try:
        import redis
    except ImportError:
        if IN_CI:
            raise
        pytest.skip(
            "redis-py is not installed: pip install 'perdure[redis]'", allow_module_level=True
        )
    return redis


def require_server() -> str:
    """The URL; skips the test when no server answers (fails it under CI=true)."""
    reason = unreachable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"under CI=true the Redis tests must run, but {reason}")
        pytest.skip(reason)
    return URL


def client() -> Any:
    """A synchronous client of its own (to act behind the store's back)."""
    import redis

    return redis.Redis.from_url(URL, socket_connect_timeout=5)


def new_prefix() -> str:
    """A key prefix no other test uses."""
    return f"perdure-test-{uuid.uuid4().hex[:12]}:"


def drop_prefix(prefix: str) -> None:
    """Delete every key under ``prefix``."""
    with client() as c:
        keys = list(c.scan_iter(match=prefix.replace("*", "\\*") + "*", count=1000))
        for start in range(0, len(keys), 500):
            c.delete(*keys[start : start + 500])
