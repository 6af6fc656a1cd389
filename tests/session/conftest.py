"""Fixtures for the session stores: one parametrized fixture every store joins."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import session_stores
from session_stores import STORE_KINDS, make_store

from perdure.session import SessionStore


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> SessionStore:
    return make_store(store_kind, tmp_path)


@pytest.fixture
def store_factory(store_kind: str, tmp_path: Path) -> Callable[..., SessionStore]:
    """Another store instance over the same data (a second process would see this)."""
    return lambda **options: make_store(store_kind, tmp_path, **options)


@pytest.fixture(autouse=True)
def server_stores() -> Iterator[None]:
    """Close the server stores a test opened and drop their schemas (key prefixes)."""
    yield
    opened, session_stores.OPENED[:] = list(session_stores.OPENED), []
    for store in opened:
        store.close()
    schemas, session_stores.PG_SCHEMAS = set(session_stores.PG_SCHEMAS), set()
    if schemas:
        from postgres_server import drop_schema

        for schema in schemas:
            drop_schema(schema)
    prefixes, session_stores.REDIS_PREFIXES = set(session_stores.REDIS_PREFIXES), set()
    if prefixes:
        from redis_server import drop_prefix

        for prefix in prefixes:
            drop_prefix(prefix)
