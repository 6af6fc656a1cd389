"""The raw floors the benchmarks measure a store against, one step at a time.

It imports nothing from perdure, so the peers' script (``peers.py``), which runs in
a virtual environment without perdure, steps the same floor as perdure's scripts.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path


class FileFloor:
    """The file store's floor, one step at a time: append + fsync to one file."""

    def __init__(self, directory: Path, line: bytes) -> None:
        self.path = directory / "floor.log"
        self.line = line
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def once(self) -> float:
        start = time.perf_counter()
        os.write(self.fd, self.line)
        os.fsync(self.fd)
        return time.perf_counter() - start

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink()


class SQLiteFloor:
    """The SQLite store's floor, one step at a time: one insert per transaction."""

    def __init__(self, directory: Path, body: str) -> None:
        self.path = directory / "floor.db"
        self.body = body
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")

    def once(self) -> float:
        start = time.perf_counter()
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO t (body) VALUES (?)", (self.body,))
        self.conn.execute("COMMIT")
        return time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)


class PostgresFloor:
    """The PostgreSQL stores' floor, one step at a time: one ``INSERT`` + ``COMMIT`` of
    ``body`` on one psycopg connection, ``synchronous_commit=on``, in a table ``floor``
    of ``schema`` (created here, dropped by :meth:`close`)."""

    def __init__(self, dsn: str, schema: str, body: str) -> None:
        import psycopg  # both environments have it; the file and SQLite floors need none

        self.conn = psycopg.connect(dsn)
        self.conn.execute("SET synchronous_commit TO on")
        self.table = f'"{schema}".floor'
        self.conn.execute(f"DROP TABLE IF EXISTS {self.table}")
        self.conn.execute(f"CREATE TABLE {self.table} (id bigserial PRIMARY KEY, body text)")
        self.conn.commit()
        self.body = body
        self.samples: list[float] = []

    def once(self) -> float:
        """One step; its seconds, also kept in :attr:`samples`."""
        start = time.perf_counter()
        self.conn.execute(f"INSERT INTO {self.table} (body) VALUES (%s)", (self.body,))
        self.conn.commit()
        took = time.perf_counter() - start
        self.samples.append(took)
        return took

    def close(self) -> None:
        self.conn.execute(f"DROP TABLE IF EXISTS {self.table}")
        self.conn.commit()
        self.conn.close()


class RedisFloor:
    """The Redis store's floor, one step at a time: one ``RPUSH`` of ``body`` on one
    synchronous redis-py connection, to the list ``key`` (deleted by :meth:`close`)."""

    def __init__(self, url: str, key: str, body: str) -> None:
        import redis  # both environments have it; the file and SQLite floors need none

        self.client = redis.Redis.from_url(url, single_connection_client=True)
        self.key = key
        self.client.delete(key)
        self.body = body.encode()
        self.samples: list[float] = []

    def once(self) -> float:
        """One step; its seconds, also kept in :attr:`samples`."""
        start = time.perf_counter()
        self.client.rpush(self.key, self.body)
        took = time.perf_counter() - start
        self.samples.append(took)
        return took

    def close(self) -> None:
        self.client.delete(self.key)
        self.client.close()
