"""PostgresStorage against the real server (SPEC §6).

It runs perdure.testing's StorageSuite and ConditionalStorageSuite exactly as a
third-party backend would, each test in a schema of its own, dropped after it (see
postgres_server: skipped without a server, failed under CI=true). Then what a
server backend adds: the table and its version, keys sorted as Python sorts them,
typed errors for a server that is down or a table altered behind its back, and
conditional writes that stay exact while the server drops their connections.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crypto_keys import cipher
from perdure.errors import (
    SchemaVersionError,
    SessionCorruptedError,
    StorageConflictError,
    StorageError,
    StoreUnavailableError,
)
from perdure.storage import ConditionalStorage, EncryptedStorage, Storage, open_storage
from perdure.testing import ConditionalStorageSuite, StorageSuite
from perdure.testing.storage import StorageFactory
from pg_proxy import cutting_proxy
from postgres_server import DSN, execute, import_psycopg, require_server, schema_fixture

import_psycopg()
from perdure.storage.postgres import MAX_KEY_BYTES, PostgresStorage  # noqa: E402


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def opened(schema: str) -> Iterator[Callable[..., PostgresStorage]]:
    """Opens storages over the test's schema; every one is closed after the test."""
    storages: list[PostgresStorage] = []

    def open_one(dsn: str = DSN, **options: Any) -> PostgresStorage:
        storage = PostgresStorage(dsn, schema=schema, **options)
        storages.append(storage)
        return storage

    yield open_one
    for storage in storages:
        storage.close()


class TestPostgresStorage(StorageSuite):
    @pytest.fixture
    def storage_factory(self, opened: Callable[..., PostgresStorage]) -> StorageFactory:
        return opened


class TestEncryptedPostgresConditionalStorage(ConditionalStorageSuite):
    """The contract holds with every blob encrypted (SPEC §9)."""

    @pytest.fixture
    def storage_factory(self, opened: Callable[..., PostgresStorage]) -> StorageFactory:
        return lambda: EncryptedStorage(opened(), cipher())


class TestPostgresConditionalStorage(ConditionalStorageSuite):
    @pytest.fixture
    def storage_factory(self, opened: Callable[..., PostgresStorage]) -> StorageFactory:
        return opened


def test_it_is_a_conditional_storage_and_the_constructor_does_no_io() -> None:
    storage = PostgresStorage("postgresql://nobody@127.0.0.1:1/none", table="blobs_2")
    assert isinstance(storage, Storage)
    assert isinstance(storage, ConditionalStorage)
    assert (storage.schema, storage.table) == ("perdure", "blobs_2")
    assert "nobody@127.0.0.1:1/none" in repr(storage)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"table": ""}, "table"),
        ({"table": "1abc"}, "table"),
        ({"table": "a-b"}, "table"),
        ({"table": 'a"b'}, "table"),
        ({"table": "x" * 55}, "table"),
        ({"schema": ""}, "schema"),
        ({"schema": "a\x00b"}, "schema"),
        ({"max_connections": 0}, "max_connections"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"reconnect_timeout": -1}, "reconnect_timeout"),
        ({"reconnect_timeout": True}, "reconnect_timeout"),
    ],
)
def test_bad_arguments_are_refused_by_name(options: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        PostgresStorage(DSN, **options)


def test_bad_dsn_and_types_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="dsn"):
        PostgresStorage("host=x no_such_option=1")
    with pytest.raises(TypeError, match="dsn"):
        PostgresStorage(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="table"):
        PostgresStorage(DSN, table=3)  # type: ignore[arg-type]


async def test_a_key_too_long_for_the_index_is_refused_by_name(
    opened: Callable[..., PostgresStorage],
) -> None:
    storage = opened()
    longest = "k/" + "é" * ((MAX_KEY_BYTES - 2) // 2)
    await storage.write(longest, b"fits")
    assert await storage.read(longest) == b"fits"
    for too_long in (longest + "x", "x" * (MAX_KEY_BYTES + 1)):
        with pytest.raises(ValueError, match="key"):
            await storage.write(too_long, b"x")
        with pytest.raises(ValueError, match="key"):
            await storage.write_if(too_long, b"x", expected=None)


async def test_the_table_is_made_on_first_use_in_its_schema_and_versioned(
    opened: Callable[..., PostgresStorage], schema: str
) -> None:
    storage = opened(table="snapshots")
    assert execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []
    await storage.write("a", b"1")
    rows = execute(f'SELECT component, version FROM "{schema}".perdure_schema_version')
    assert rows == [("storage:snapshots", 1)]
    assert execute(f'SELECT key, data FROM "{schema}".snapshots') == [("a", b"1")]
    # Keys compare byte by byte whatever the database's default collation.
    collation = execute(
        "SELECT collation_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = 'snapshots' AND column_name = 'key'",
        (schema,),
    )
    assert collation == [("C",)]
    # A second table in the same schema is its own component.
    other = opened()
    await other.write("a", b"2")
    assert await storage.read("a") == b"1"
    rows = execute(f'SELECT component FROM "{schema}".perdure_schema_version ORDER BY 1')
    assert rows == [("storage:perdure_blobs",), ("storage:snapshots",)]


async def test_a_newer_table_is_refused_and_an_altered_one_is_damage(
    opened: Callable[..., PostgresStorage], schema: str
) -> None:
    await opened().write("a", b"1")
    execute(
        f'UPDATE "{schema}".perdure_schema_version SET version = 99 '
        "WHERE component = 'storage:perdure_blobs'"
    )
    with pytest.raises(SchemaVersionError, match="newer perdure"):
        await opened().read("a")
    execute(
        f'UPDATE "{schema}".perdure_schema_version SET version = 1 '
        "WHERE component = 'storage:perdure_blobs'"
    )
    execute(f'ALTER TABLE "{schema}".perdure_blobs DROP COLUMN tag')
    with pytest.raises(SessionCorruptedError) as info:
        await opened().read("a")
    assert info.value.details["kind"] == "bad_schema"
    # Dropped under a storage that already checked it: damage, not a driver error.
    storage = opened()
    execute(f'ALTER TABLE "{schema}".perdure_blobs ADD COLUMN tag uuid')
    await storage.read("a")
    execute(f'DROP TABLE "{schema}".perdure_blobs')
    for call in (storage.read("a"), storage.write("a", b"x"), storage.list("")):
        with pytest.raises(SessionCorruptedError):
            await call
    with pytest.raises(SessionCorruptedError):
        await storage.write_if("a", b"x", expected=None)


async def test_a_server_that_cannot_be_reached_is_a_typed_error() -> None:
    storage = PostgresStorage(
        "postgresql://postgres@127.0.0.1:1/test", connect_timeout=1, reconnect_timeout=0.3
    )
    for call in (storage.read("k"), storage.list(""), storage.version("k")):
        with pytest.raises(StoreUnavailableError) as info:
            await call
        assert isinstance(info.value, ConnectionError)
        assert "127.0.0.1:1" in info.value.message
        assert "outcome" not in info.value.details  # a read
    for write in (storage.write("k", b"x"), storage.delete("k")):
        with pytest.raises(StoreUnavailableError) as info:
            await write
        assert info.value.details["outcome"] == "unknown"
    with pytest.raises(StoreUnavailableError) as info:
        await storage.write_if("k", b"x", expected=None)
    assert info.value.details["outcome"] == "not_applied"  # it never had a connection
    storage.close()


async def test_a_missing_database_is_a_storage_error_at_once() -> None:
    require_server()
    storage = PostgresStorage(DSN.rsplit("/", 1)[0] + "/no_such_database_here")
    with pytest.raises(StorageError) as info:
        await storage.read("k")
    assert not isinstance(info.value, StoreUnavailableError)
    assert "no_such_database_here" in info.value.message
    storage.close()


def test_open_storage_opens_it_with_its_url_options() -> None:
    storage = open_storage("postgresql://alice@db.example:6432/app?schema=agents&table=snaps")
    assert isinstance(storage, PostgresStorage)
    assert (storage.schema, storage.table) == ("agents", "snaps")
    plain = open_storage("postgres://db/app?sslmode=require")
    assert isinstance(plain, PostgresStorage)
    assert (plain.schema, plain.table) == ("perdure", "perdure_blobs")
    assert plain.db.dsn == "postgres://db/app?sslmode=require"
    with pytest.raises(ValueError, match="ttl= is not an option of the storage"):
        open_storage("postgresql://db/app?ttl=30")
    with pytest.raises(ValueError, match="table= twice"):
        open_storage("postgresql://db/app?table=a&table=b")
    with pytest.raises(ValueError, match="table"):
        open_storage("postgresql://db/app?table=no-dashes")


async def test_open_storage_and_the_class_share_the_data(schema: str) -> None:
    by_url = open_storage(f"{DSN}?schema={schema}&table=t")
    direct = PostgresStorage(DSN, schema=schema, table="t")
    try:
        await by_url.write("k", b"v")
        assert await direct.read("k") == b"v"
    finally:
        for storage in (by_url, direct):
            assert isinstance(storage, PostgresStorage)
            storage.close()


_keys = st.lists(
    st.text(
        alphabet=st.characters(
            min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=("Cs",)
        ).filter(lambda c: c not in "/\\"),
        min_size=1,
        max_size=6,
    ).filter(lambda s: s not in (".", "..")),
    min_size=1,
    max_size=25,
    unique=True,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=_keys)
def test_list_sorts_any_unicode_as_python_sorts_it(keys: list[str]) -> None:
    # Each example in a schema of its own (hypothesis runs them in one test).
    schema_iter = schema_fixture()
    schema = next(schema_iter)
    storage = PostgresStorage(DSN, schema=schema)
    try:

        async def run() -> list[str]:
            for key in keys:
                await storage.write(key, b"")
            return await storage.list("")

        assert asyncio.run(run()) == sorted(keys)
    finally:
        storage.close()
        schema_iter.close()


async def test_conditional_writes_stay_exact_while_the_server_drops_connections(
    schema: str,
) -> None:
    # Four writers append their own entries to one blob by compare-and-set, while
    # the server ends the storage's connections again and again (as a failover or an
    # administrator would). Every acknowledged entry must be in the blob exactly
    # once, and no entry may be there twice.
    name = f"perdure-storage-{uuid.uuid4().hex[:8]}"
    storage = PostgresStorage(f"{DSN}?application_name={name}", schema=schema)
    await storage.write_if("log", b"", expected=None)
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        while not stop.wait(0.02):
            rows = execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            )
            kills += sum(1 for (done,) in rows if done)

    outcomes: dict[str, int] = {"acknowledged": 0, "conflicts": 0, "unknown": 0}
    acknowledged: list[str] = []

    async def writer(index: int) -> None:
        for n in range(15):
            entry = f"{index}:{n}"
            maybe_applied = False
            while True:
                version = await storage.version("log")
                data = await storage.read("log")
                assert data is not None
                if entry in data.decode().split():
                    assert maybe_applied  # only an unknown outcome may have written it
                    break
                try:
                    await storage.write_if("log", data + f"{entry}\n".encode(), expected=version)
                except StorageConflictError as exc:
                    outcomes["conflicts"] += 1
                    if exc.details.get("outcome") == "unknown":
                        outcomes["unknown"] += 1
                        maybe_applied = True
                    continue
                outcomes["acknowledged"] += 1
                acknowledged.append(entry)
                break

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        await asyncio.gather(*(writer(i) for i in range(4)))
    finally:
        stop.set()
        thread.join()
    final = await storage.read("log")
    storage.close()
    assert final is not None
    entries = final.decode().split()
    assert len(entries) == len(set(entries)) == 60
    assert set(acknowledged) <= set(entries)
    assert kills > 0


async def test_a_lost_connection_is_resolved_by_the_rows_tag(
    opened: Callable[..., PostgresStorage],
) -> None:
    # What _write_if concludes once the connection of a write it sent was lost: the
    # three answers the row can give, read from the real table.
    storage = opened()
    made = await storage.write_if("k", b"1", expected=None)
    tag = execute(f'SELECT tag FROM "{storage.schema}".perdure_blobs WHERE key = %s', ("k",))[0][0]
    lost = ConnectionError("lost")
    resolve = storage._resolve  # the one place that decides
    assert await asyncio.to_thread(resolve, "k", tag, None, lost) == made  # it was applied
    other = uuid.uuid4()
    assert await asyncio.to_thread(resolve, "k", other, int(made), lost) is None  # not applied
    assert await asyncio.to_thread(resolve, "absent", other, None, lost) is None
    with pytest.raises(StorageConflictError) as info:
        await asyncio.to_thread(resolve, "k", other, int(made) - 1, lost)  # moved on
    assert info.value.details["outcome"] == "unknown"
    with pytest.raises(StorageConflictError):
        await asyncio.to_thread(resolve, "k", other, None, lost)  # created by another


async def test_a_write_applied_but_never_acknowledged_returns_its_version(schema: str) -> None:
    # The network fails after the server ran the write and before its answer came
    # back (a proxy cuts the connection there): the storage finds its write by the
    # row's tag and returns the version it made, instead of sending it again (which
    # would be refused as a conflict with its own write).
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    where = conninfo_to_dict(DSN)
    with cutting_proxy(str(where.get("host", "127.0.0.1")), int(where.get("port", 5432))) as proxy:
        storage = PostgresStorage(
            make_conninfo(DSN, host="127.0.0.1", port=proxy.port), schema=schema
        )
        try:
            first = await storage.write_if("k", b"1", expected=None)
            proxy.cut_after(b"UPDATE")
            made = await storage.write_if("k", b"2", expected=first)
            assert proxy.cuts == 1
            assert await storage.version("k") == made
            assert await storage.read("k") == b"2"
            proxy.cut_after(b"INSERT")
            created = await storage.write_if("new", b"n", expected=None)
            assert proxy.cuts == 2
            assert await storage.version("new") == created
            # A plain write is sent again: the same bytes, under a newer version.
            proxy.cut_after(b"INSERT")
            await storage.write("k", b"3")
            assert proxy.cuts == 3
            assert await storage.read("k") == b"3"
        finally:
            storage.close()
