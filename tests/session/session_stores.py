"""The session stores under test, by kind (shared by fixtures and child processes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perdure.session import FileSessionStore, SessionStore

STORE_KINDS = ["file", "sqlite", "memory", "postgres", "redis"]

OPENED: list[Any] = []
"""Stores of server kinds opened in this process, closed (and their schemas dropped)
after each test by the ``server_stores`` fixture of conftest.py."""
PG_SCHEMAS: set[str] = set()
REDIS_PREFIXES: set[str] = set()


def make_store(kind: str, path: Path, **options: Any) -> SessionStore:
    """A fresh store of ``kind`` rooted at ``path``."""
    if kind == "file":
        return FileSessionStore(path / "file-store", **options)
    if kind == "sqlite":
        from perdure.stores.sqlite import SQLiteSessionStore

        return SQLiteSessionStore(path / "sessions.db", **options)
    if kind == "memory":
        from perdure.stores.memory import MemorySessionStore

        return MemorySessionStore(**options)
    if kind == "postgres":
        # A schema per test directory: a child process given the same path sees the
        # same sessions. Skipped without a server (failed under CI=true).
        import hashlib
        import sys

        tests = str(Path(__file__).resolve().parents[1])
        if tests not in sys.path:  # a child process given only this directory
            sys.path.append(tests)
        from postgres_server import DSN, require_server

        require_server()
        from perdure.stores.postgres import PostgresSessionStore

        schema = "perdure_t_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
        PG_SCHEMAS.add(schema)
        store = PostgresSessionStore(DSN, schema=schema, **options)
        OPENED.append(store)
        return store
    if kind == "redis":
        # A key prefix per test directory, as the PostgreSQL schema above.
        import hashlib
        import sys

        tests = str(Path(__file__).resolve().parents[1])
        if tests not in sys.path:
            sys.path.append(tests)
        from redis_server import require_server

        url = require_server()
        from perdure.stores.redis import RedisSessionStore

        prefix = "perdure-t-" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16] + ":"
        REDIS_PREFIXES.add(prefix)
        redis_store = RedisSessionStore(url, prefix=prefix, **options)
        OPENED.append(redis_store)
        return redis_store
    raise ValueError(kind)


# ------------------------------------------------------------- crash-suite writers
# Called in the writer process of perdure.testing's CrashSuite (see test_crash.py).


def crash_file_writer(location: str, seed: int, die: Callable[[], None]) -> SessionStore:
    """A file store whose renames and fsyncs may die (the critical sections of sealing,
    rewrite commit points and completion; appends inside a held turn sync in
    ``start_fsync``), before or after the real call."""
    import os

    from perdure.session import Segmentation
    from perdure.stores.file import store as fs_module

    real_replace, real_fsync = os.replace, os.fsync
    real_start_fsync = fs_module.start_fsync

    def replace(a: Any, b: Any) -> None:
        die()
        real_replace(a, b)
        die()

    def fsync(fd: int) -> None:
        die()
        real_fsync(fd)

    def start_fsync(fd: int, executor: Any = None) -> Any:
        die()
        return real_start_fsync(fd, executor)

    fs_module.os.replace = replace  # type: ignore[assignment]
    fs_module.os.fsync = fsync
    fs_module.start_fsync = start_fsync  # type: ignore[assignment]
    return FileSessionStore(location, segmentation=Segmentation(max_records=4))


def crash_sqlite_writer(location: str, seed: int, die: Callable[[], None]) -> SessionStore:
    """A SQLite store that may die inside its transaction before COMMIT, right after
    it, and around folding the WAL into the database (in the background or by the
    writer). Even seeds commit durably; odd ones with ``durability="none"``, whose
    commits must survive a killed process too (only a power cut may take them)."""
    from perdure.stores.sqlite import SQLiteSessionStore

    def around(name: str) -> None:
        real = getattr(SQLiteSessionStore, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            die()
            result = real(*args, **kwargs)
            die()
            return result

        setattr(SQLiteSessionStore, name, wrapper)

    around("_write_messages")
    around("_count_wal")
    around("_checkpoint_wal")
    store = SQLiteSessionStore(location, durability="commit" if seed % 2 == 0 else "none")
    store._fold_pages = 4  # fold often, so that kills land around folds
    return store


def crash_postgres_writer(location: str, seed: int, die: Callable[[], None]) -> SessionStore:
    """A PostgreSQL store (``location`` is its URL) that may die after any statement it
    sent ran, before its answer is acted on — so kills land inside a rewrite's
    transaction (before its COMMIT) and between a commit and its acknowledgement.
    Odd seeds commit with ``durability="none"``: a killed client must lose nothing
    the server acknowledged either way."""
    import psycopg

    from perdure.session import open_store

    real_execute = psycopg.Connection.execute

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        cursor = real_execute(self, *args, **kwargs)
        die()
        return cursor

    store = open_store(location, durability="commit" if seed % 2 == 0 else "none")
    # Connected and the schema checked before any death is armed: kills land in the
    # writer's work, not in its start-up.
    store.db.call(lambda conn: None, doing="connecting")  # type: ignore[attr-defined]
    psycopg.Connection.execute = execute  # type: ignore[method-assign]
    return store
