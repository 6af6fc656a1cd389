"""``perdure sessions list|show|history`` and ``perdure verify`` with ``--store redis://``.

Against the real Redis server (see redis_server: skipped without one, failed under
CI=true), each test under a key prefix of its own, deleted after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from perdure.cli._common import EXIT_NOT_FOUND, EXIT_PROBLEM
from perdure.cli.main import cli
from perdure.testing.messages import conversation
from redis_server import client, drop_prefix, import_redis, new_prefix, require_server

import_redis()
from perdure.session import RedisSessionStore  # noqa: E402  (needs redis)


@pytest.fixture
def prefix() -> Iterator[str]:
    require_server()
    name = new_prefix()
    yield name
    drop_prefix(name)


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_the_session_commands_read_a_redis_store(prefix: str) -> None:
    url = require_server()
    store = RedisSessionStore(url, prefix=prefix)

    async def fill() -> None:
        await store.create("alpha")
        await store.commit("alpha", conversation(4), agent_state={"state": {"k": 1}})
        await store.create("beta")

    asyncio.run(fill())
    at = f"{url}?prefix={prefix}"
    listed = invoke("sessions", "list", "--store", at)
    assert listed.exit_code == 0, listed.stderr
    assert "alpha" in listed.stdout
    assert "beta" in listed.stdout
    shown = invoke("sessions", "show", "alpha", "--store", at)
    assert shown.exit_code == 0, shown.stderr
    assert "4" in shown.stdout
    history = invoke("sessions", "history", "alpha", "--store", at)
    assert history.exit_code == 0, history.stderr
    assert "m0" in history.stdout
    assert "m3" in history.stdout
    assert invoke("sessions", "show", "nope", "--store", at).exit_code == EXIT_NOT_FOUND
    verified = invoke("verify", "--store", at)
    assert verified.exit_code == 0, (verified.stdout, verified.stderr)
    with client() as c:  # damage one message behind the store's back
        key = f"{prefix}{{alpha}}:m"
        c.lset(key, 2, c.lindex(key, 2) + b" ")
    damaged = invoke("verify", "--store", at)
    assert damaged.exit_code == EXIT_PROBLEM, (damaged.stdout, damaged.stderr)
    assert "alpha" in damaged.stdout
    assert "damaged" in damaged.stderr  # the summary: on stderr when piped
