"""The PostgreSQL foundation every PostgreSQL backend stands on (layer 0).

Against the real server (see postgres_server): the schema is made on first use and
versioned, a newer schema is refused, an altered table is damage, psycopg's errors
are sorted into faults and never leak, and work runs from any loop and any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from perdure.errors import (
    PerdureError,
    SchemaVersionError,
    SessionCorruptedError,
    SessionLockedError,
    StoreUnavailableError,
)
from postgres_server import DSN, execute, import_psycopg, require_server, schema_fixture

psycopg = import_psycopg()
from perdure._runtime.postgres import (  # noqa: E402  (after the import check)
    VERSION_TABLE,
    PostgresBugError,
    PostgresDatabase,
    PostgresErrors,
    SchemaPart,
    check_schema_name,
    pg_fault,
    quote_ident,
    server_display,
)

ERRORS = PostgresErrors(
    unavailable=StoreUnavailableError,
    locked=SessionLockedError,
    damage=SessionCorruptedError,
    failure=PerdureError,
    version=SchemaVersionError,
)


def part(version: int = 1) -> SchemaPart:
    return SchemaPart(
        component="widgets",
        version=version,
        tables={"perdure_widgets": ("id", "name")},
        statements=lambda q: [
            f"CREATE TABLE IF NOT EXISTS {q}.perdure_widgets (id bigint PRIMARY KEY, name text)"
        ],
    )


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def database(schema: str) -> Iterator[PostgresDatabase]:
    db = PostgresDatabase(DSN, schema=schema, part=part(), errors=ERRORS, what="test store")
    yield db
    db.close()


def test_the_constructor_does_no_io_and_checks_its_arguments() -> None:
    db = PostgresDatabase(
        "postgresql://nobody@127.0.0.1:1/none",
        schema="s",
        part=part(),
        errors=ERRORS,
        what="test store",
    )
    assert db.where == "postgresql://nobody@127.0.0.1:1/none (schema 's')"
    with pytest.raises(ValueError, match="dsn"):
        PostgresDatabase("nonsense", schema="s", part=part(), errors=ERRORS, what="t")
    for bad in ("", "x" * 64, "a\x00b"):
        with pytest.raises(ValueError, match="schema"):
            check_schema_name(bad)
    with pytest.raises(TypeError, match="schema"):
        check_schema_name(3)
    assert check_schema_name("é" * 31) == "é" * 31
    assert quote_ident('we"ird') == '"we""ird"'


def test_messages_never_show_a_password() -> None:
    shown = server_display("postgresql://alice:s3cret@db.example:6432/app")
    assert shown == "postgresql://alice@db.example:6432/app"
    assert "s3cret" not in server_display("host=h user=u password=s3cret dbname=d")


def test_the_schema_is_made_on_first_use_and_versioned(
    database: PostgresDatabase, schema: str
) -> None:
    assert not database.schema_exists()
    assert execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []
    database.call(lambda conn: conn.execute(
        f"INSERT INTO {database.q}.perdure_widgets VALUES (1, 'a')"
    ), doing="adding")  # fmt: skip
    assert database.schema_exists()
    rows = execute(f'SELECT component, version FROM "{schema}".{VERSION_TABLE}')
    assert rows == [("widgets", 1)]
    # Another component joins the same schema and table of versions.
    other = PostgresDatabase(
        DSN,
        schema=schema,
        part=SchemaPart("gadgets", 3, {}, lambda q: []),
        errors=ERRORS,
        what="other store",
    )
    try:
        other.call(lambda conn: None, doing="nothing")
    finally:
        other.close()
    assert sorted(execute(f'SELECT component, version FROM "{schema}".{VERSION_TABLE}')) == [
        ("gadgets", 3),
        ("widgets", 1),
    ]


def test_a_newer_schema_is_refused_with_a_typed_error(schema: str) -> None:
    newer = PostgresDatabase(DSN, schema=schema, part=part(2), errors=ERRORS, what="new")
    newer.call(lambda conn: None, doing="making it")
    newer.close()
    older = PostgresDatabase(DSN, schema=schema, part=part(1), errors=ERRORS, what="old store")
    with pytest.raises(SchemaVersionError) as info:
        older.call(lambda conn: None, doing="reading")
    assert info.value.code == "schema_version"
    assert info.value.details["found"] == 2
    assert info.value.details["supported"] == 1
    assert "newer perdure" in info.value.message
    older.close()


def test_a_table_altered_behind_perdure_is_damage(schema: str) -> None:
    first = PostgresDatabase(DSN, schema=schema, part=part(), errors=ERRORS, what="s")
    first.call(lambda conn: None, doing="making it")
    first.close()
    execute(f'ALTER TABLE "{schema}".perdure_widgets DROP COLUMN name')
    second = PostgresDatabase(DSN, schema=schema, part=part(), errors=ERRORS, what="s")
    with pytest.raises(SessionCorruptedError) as info:
        second.call(lambda conn: None, doing="reading")
    assert info.value.details["kind"] == "bad_schema"
    second.close()


def test_driver_errors_are_sorted_and_never_leak(database: PostgresDatabase) -> None:
    with pytest.raises(PostgresBugError, match="syntax"):
        database.call(lambda conn: conn.execute("SELEC 1"), doing="a typo")
    # A table dropped behind the store's back: damage, not a bug.
    database.call(lambda conn: None, doing="making it")
    execute(f"DROP TABLE {database.q}.perdure_widgets")
    with pytest.raises(SessionCorruptedError) as info:
        database.call(
            lambda conn: conn.execute(f"SELECT * FROM {database.q}.perdure_widgets"),
            doing="reading",
        )
    assert info.value.details["kind"] == "bad_schema"
    assert info.value.details["sqlstate"] == "42P01"


def test_a_refused_connection_says_why_at_once() -> None:
    require_server()  # the server itself refuses the database
    bad = PostgresDatabase(
        DSN.rsplit("/", 1)[0] + "/no_such_database_here",
        schema="s",
        part=part(),
        errors=ERRORS,
        what="test store",
    )
    with pytest.raises(PerdureError) as info:
        bad.call(lambda conn: None, doing="opening")
    assert type(info.value) is PerdureError  # the general error: no retry, no wait
    assert "no_such_database_here" in info.value.message
    down = PostgresDatabase(
        "postgresql://postgres@127.0.0.1:1/test",
        schema="s",
        part=part(),
        errors=ERRORS,
        what="test store",
        connect_timeout=1,
        reconnect_timeout=0.5,
    )
    with pytest.raises(StoreUnavailableError) as unavailable:
        down.call(lambda conn: None, doing="opening")
    assert isinstance(unavailable.value, ConnectionError)
    assert unavailable.value.details["fault"] == "unavailable"


@pytest.mark.parametrize(
    ("sqlstate", "fault"),
    [
        ("57P01", "unavailable"),
        ("08006", "unavailable"),
        ("53300", "unavailable"),
        ("55P03", "locked"),
        ("40001", "locked"),
        ("XX001", "damage"),
        ("42P01", "damage"),
        ("42601", "bug"),
        ("23505", "bug"),
        ("42501", "failure"),
        ("53100", "failure"),
    ],
)
def test_faults_by_sqlstate(sqlstate: str, fault: str) -> None:
    error_class = psycopg.errors.lookup(sqlstate)
    assert pg_fault(error_class("x")) == fault


def test_work_runs_from_any_loop_and_any_thread(database: PostgresDatabase) -> None:
    database.call(lambda conn: None, doing="making it")

    async def add(i: int) -> None:
        await database.run(
            lambda conn: conn.execute(
                f"INSERT INTO {database.q}.perdure_widgets VALUES (%s, 'w')", (i,)
            ),
            doing="adding",
        )

    errors: list[BaseException] = []

    def worker(start: int) -> None:
        try:
            asyncio.run(asyncio.wait_for(_each(add, range(start, start + 5)), 30))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i * 5,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    count: Any = database.call(
        lambda conn: conn.execute(f"SELECT count(*) FROM {database.q}.perdure_widgets").fetchone(),
        doing="counting",
    )
    assert count == (20,)


async def _each(work: Any, items: Any) -> None:
    for item in items:
        await work(item)
