"""The SessionStore contract (SPEC §7): each of perdure's stores runs the suite in
``perdure.testing`` exactly as a third-party store would."""

from __future__ import annotations

from pathlib import Path

import pytest
from session_stores import make_store

from perdure.session import SessionStore
from perdure.testing import SessionStoreSuite
from perdure.testing.sessions import StoreFactory


class TestFileSessionStore(SessionStoreSuite):
    durability_options = ("commit", "invocation", "none")
    supports_history_page = True
    supports_checkpoints = True

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: make_store("file", tmp_path, **options)


class TestSQLiteSessionStore(SessionStoreSuite):
    durability_options = ("commit", "invocation", "none")
    supports_history_page = True
    supports_checkpoints = True

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: make_store("sqlite", tmp_path, **options)


class TestMemorySessionStore(SessionStoreSuite):
    durable_across_reopen = False
    supports_history_page = True
    supports_checkpoints = True

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        def factory(**options: object) -> SessionStore:
            return make_store("memory", Path(), **options)

        return factory
