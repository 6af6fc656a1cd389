"""The Storage contract (SPEC §6): each of perdure's backends runs the suite in
``perdure.testing`` exactly as a third-party backend would."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_backends import make_storage

from perdure.testing import AppendStorageSuite, ConditionalStorageSuite, StorageSuite
from perdure.testing.storage import StorageFactory


class TestMemoryStorage(AppendStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_storage("memory", tmp_path)  # one MemoryStorage per path


class TestLocalFileStorage(AppendStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_storage("local_file", tmp_path)


class TestSQLiteStorage(StorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_storage("sqlite", tmp_path)


class TestMemoryConditionalStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_storage("memory", tmp_path)


class TestLocalFileConditionalStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_storage("local_file", tmp_path)


class TestSQLiteConditionalStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, tmp_path: Path) -> StorageFactory:
        return lambda: make_storage("sqlite", tmp_path)
