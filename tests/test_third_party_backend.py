"""A third-party backend runs perdure's conformance suites (docs/testing.md shows this file)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from perdure.session import SessionStore
from perdure.storage import Storage
from perdure.testing import SessionStoreSuite, StorageSuite
from toy_backends import DictSessionStore, DictStorage


class TestDictSessionStore(SessionStoreSuite):
    @pytest.fixture
    def store_factory(self) -> Callable[..., SessionStore]:
        data: dict[str, Any] = {}  # one test's data, seen by every instance over it
        return lambda: DictSessionStore(data)


class TestDictStorage(StorageSuite):
    @pytest.fixture
    def storage_factory(self) -> Callable[[], Storage]:
        blobs: dict[str, bytes] = {}
        return lambda: DictStorage(blobs)
