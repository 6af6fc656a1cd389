"""Fixtures of the ``perdure serve`` tests: real stores filled with real sessions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import postgres_server
from perdure.session import SessionStore, open_store
from server_support import close, conversation, fill

pytest.importorskip("starlette", reason="perdure serve needs perdure[server]")


@pytest.fixture(params=["file", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_server.store_url(request)
    if request.param == "file":
        return f"file:{tmp_path / 'store'}"
    return f"sqlite:{tmp_path / 'p.db'}"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SessionStore]:
    opened = open_store(store_url)
    await fill(opened, "s1", conversation(10))
    await fill(opened, "s2", conversation(1))
    try:
        yield opened
    finally:
        close(opened)
