"""One URL parser for ``open_storage`` and ``open_store`` (issue 15, STYLE §8)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import perdure.cli.migrate as cli_migrate
import perdure.session.urls as open_store_module
import perdure.storage.urls as storage_urls
from perdure._runtime import urls as _urls
from perdure.session import FileSessionStore, MemorySessionStore, SQLiteSessionStore, open_store
from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage, open_storage


@pytest.mark.parametrize(
    ("url", "backend", "extra", "issue"),
    [
        ("s3://bucket/prefix", "S3", "s3", 19),
    ],
)
def test_a_later_backend_is_refused_naming_its_extra_and_issue(
    url: str, backend: str, extra: str, issue: int
) -> None:
    # Both open redis:// since issue 18 (test_redis_store.py, test_redis_storage.py);
    # open_storage opens s3:// since issue 19 (test_s3_storage.py): sessions do not.
    for opener in (open_store,):
        with pytest.raises(ValueError) as info:
            opener(url)
        message = str(info.value)
        assert backend in message
        assert f"perdure[{extra}]" in message
        assert f"issue {issue}" in message
        assert "unknown" not in message
        assert "perdure has no S3 store" in message
        assert "open_storage" in message


def test_an_unknown_scheme_lists_the_known_ones_in_both_openers() -> None:
    with pytest.raises(
        ValueError, match=r"unknown storage scheme 'ftp'.*file:, sqlite:, memory:, postgresql:"
    ):
        open_storage("ftp://host/x")
    with pytest.raises(ValueError, match=r"unknown store scheme 'ftp'.*file:, sqlite:, memory:"):
        open_store("ftp://host/x")
    for bad in (None, 3, "no-scheme", "file:", "sqlite://"):
        with pytest.raises(ValueError):
            open_storage(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            open_store(bad)  # type: ignore[arg-type]


def test_both_openers_read_a_url_the_same_way(tmp_path: Path) -> None:
    db = tmp_path / "one.db"
    storage = open_storage(f"sqlite://{db}")
    store = open_store(f"sqlite://{db}")
    assert isinstance(storage, SQLiteStorage)
    assert isinstance(store, SQLiteSessionStore)
    assert storage.path == db
    assert Path(store.path) == db
    storage.close()
    store.close()
    assert isinstance(open_storage(f"file:{tmp_path}/blobs"), LocalFileStorage)
    assert isinstance(open_store(f"file:{tmp_path}/sessions"), FileSessionStore)
    assert isinstance(open_storage("memory:"), MemoryStorage)
    assert isinstance(open_store("memory:"), MemorySessionStore)


def test_there_is_one_parser() -> None:
    assert storage_urls.split_url is _urls.split_url
    assert open_store_module.split_url is _urls.split_url
    assert not hasattr(open_store_module, "LATER_SCHEMES")
    for module in (storage_urls, open_store_module, cli_migrate):
        assert ".partition(" not in inspect.getsource(module)


def test_a_postgres_url_opens_the_postgres_store_without_io() -> None:
    pytest.importorskip("psycopg")
    from perdure.session import PostgresSessionStore

    store = open_store(
        "postgresql://alice@db.example:6432/app?schema=agents&sslmode=require&ttl=1800"
        "&lease=10&max_checkpoints=3&max_checkpoint_age=86400"
    )
    assert isinstance(store, PostgresSessionStore)
    assert store.schema == "agents"
    assert (store.ttl, store.lease, store.max_checkpoints) == (1800.0, 10.0, 3)
    assert store.max_checkpoint_age == store.checkpoints.max_checkpoint_age == 86400.0
    assert store.db.dsn == "postgresql://alice@db.example:6432/app?sslmode=require"
    plain = open_store("postgres://db/app", schema="other")
    assert isinstance(plain, PostgresSessionStore)
    assert plain.schema == "other"
    with pytest.raises(ValueError, match="both give schema"):
        open_store("postgresql://db/app?schema=a", schema="b")
    with pytest.raises(ValueError, match="max_checkpoint_age must be None or a number"):
        open_store("postgresql://db/app?max_checkpoint_age=0")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://db/app?ttl=soon", "ttl='soon' is not a number"),
        ("postgresql://db/app?max_checkpoints=2.5", "max_checkpoints='2.5' is not an integer"),
        ("postgresql://db/app?max_checkpoint_age=1d", "max_checkpoint_age='1d' is not a number"),
        ("postgresql://db/app?schema=a&schema=b", "schema= twice"),
        ("postgresql://db/app?table=blobs", "table= is not an option of the store"),
    ],
)
def test_postgres_url_options_are_checked(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        _urls.postgres_url(url)
    assert _urls.postgres_url("postgresql://u@h/d?sslmode=disable&schema=x") == (
        "postgresql://u@h/d?sslmode=disable",
        {"schema": "x"},
    )
