"""The real PostgreSQL server the PostgreSQL tests run against (import as a module).

The server is the one these machines run at 127.0.0.1:5432 (trust auth, database
``test``); ``PERDURE_TEST_PG`` names another. Each test gets a schema of its own,
dropped after it. When no server answers, the tests are skipped with the reason —
except under ``CI=true``, where they must run: they fail instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

DSN = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI") == "true"

_reason: list[str | None] = []  # the answer of the first probe, kept for the session


def unreachable() -> str | None:
    """Why the server cannot be used (None: it can), asked once per test process."""
    if not _reason:
        try:
            import psycopg
        except ImportError:
            _reason.append("psycopg is not installed: pip install 'perdure[postgres]'")
        else:
            try:
                with psycopg.connect(DSN, connect_timeout=3) as conn:
                    conn.execute("SELECT 1")
                _reason.append(None)
            except psycopg.Error as exc:
                _reason.append(f"no PostgreSQL server at {DSN}: {' '.join(str(exc).split())}")
    return _reason[0]


def import_psycopg() -> Any:
    """``psycopg``, for a test module that needs it at import: skipped when it is not
    installed (failed under CI=true, where ``perdure[postgres]`` must be)."""
    try:
        import psycopg
    except ImportError:
        if IN_CI:
            raise
        pytest.skip(
            "psycopg is not installed: pip install 'perdure[postgres]'", allow_module_level=True
        )
    return psycopg


def require_server() -> str:
    """The DSN; skips the test when no server answers (fails it under CI=true)."""
    reason = unreachable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"under CI=true the PostgreSQL tests must run, but {reason}")
        pytest.skip(reason)
    return DSN


def new_schema_name() -> str:
    """A schema name no other test uses."""
    return f"perdure_test_{uuid.uuid4().hex[:12]}"


def drop_schema(schema: str) -> None:
    """Drop ``schema`` and everything in it (absent is fine)."""
    import psycopg

    with psycopg.connect(DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def execute(statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run one statement on a connection of its own (behind the store's back)."""
    import psycopg

    with psycopg.connect(DSN, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description is not None else []


def schema_fixture() -> Iterator[str]:
    """Body of a ``schema`` fixture: a fresh schema name, dropped after the test."""
    require_server()
    schema = new_schema_name()
    try:
        yield schema
    finally:
        drop_schema(schema)


def store_url(request: pytest.FixtureRequest) -> str:
    """A ``postgresql://`` store URL over a fresh schema, dropped after the test."""
    require_server()
    schema = new_schema_name()
    request.addfinalizer(lambda: drop_schema(schema))
    return f"{DSN}?schema={schema}"
