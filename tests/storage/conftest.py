"""One parametrized ``storage`` fixture that every backend joins (see storage_backends)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from storage_backends import STORAGE_KINDS, close_storage, make_storage

from perdure.storage import Storage


@pytest.fixture(params=STORAGE_KINDS)
def storage_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage_factory(storage_kind: str, tmp_path: Path) -> Iterator[Callable[[], Storage]]:
    """Open another instance over the same data (as a restarted process would)."""
    opened: list[Storage] = []

    def factory() -> Storage:
        storage = make_storage(storage_kind, tmp_path)
        opened.append(storage)
        return storage

    yield factory
    for storage in opened:
        close_storage(storage)


@pytest.fixture
def storage(storage_factory: Callable[[], Storage]) -> Storage:
    return storage_factory()
