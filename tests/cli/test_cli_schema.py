"""``perdure migrate-schema`` through its real entry point, on the real PostgreSQL server.

Each test has a schema of its own, dropped after it (see postgres_server). The
upgrade is shown with a test-only version of the session store's tables one past
this perdure's (its step adds a column), put in place of the store's own for the
test: a store opened on the older tables refuses them, naming the command; the
command upgrades them and the sessions are all there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

import postgres_server
from perdure.cli.main import cli

postgres_server.import_psycopg()
from perdure.stores.postgres import PostgresSessionStore  # noqa: E402  (needs psycopg)
from perdure.stores.postgres.schema import SESSIONS  # noqa: E402

ADD_NOTE = "ALTER TABLE {q}.perdure_sessions ADD COLUMN note text"


def perdure(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None})
    return runner.invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def schema() -> Iterator[str]:
    yield from postgres_server.schema_fixture()


def url(schema: str, extra: str = "") -> str:
    return f"{postgres_server.DSN}?schema={schema}{extra}"


def versions(schema: str) -> dict[str, int]:
    rows = postgres_server.execute(
        f'SELECT component, version FROM "{schema}".perdure_schema_version'
    )
    return {str(component): int(version) for component, version in rows}  # type: ignore[call-overload]


def schema_made(schema: str) -> bool:
    return bool(postgres_server.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)))


def test_it_creates_the_tables_of_each_backend_once_and_a_dry_run_creates_none(
    schema: str,
) -> None:
    args = [
        "--store", url(schema),
        "--storage", url(schema, "&table=snapshots"),
        "--memory", url(schema),
    ]  # fmt: skip
    dry = perdure("migrate-schema", *args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("dry run: nothing was changed")
    assert [line.split(" (")[0] for line in lines[1:]] == [
        "sessions",
        "storage:snapshots",
        "memory",
    ]
    versions_now = [SESSIONS.version, 1, 1]  # sessions, snapshots storage, memory
    assert [line.split(": ", 1)[1] for line in lines[1:]] == [
        f"no tables -> version {v}: would create" for v in versions_now
    ]
    assert not schema_made(schema)

    made = perdure("migrate-schema", *args, "--json")
    assert made.exit_code == 0, made.output
    report = json.loads(made.stdout)
    assert [
        (r["option"], r["component"], r["before"], r["after"], r["action"]) for r in report
    ] == [
        ("--store", "sessions", None, SESSIONS.version, "create"),
        ("--storage", "storage:snapshots", None, 1, "create"),
        ("--memory", "memory", None, 1, "create"),
    ]
    assert all(r["schema"] == schema and r["dry_run"] is False for r in report)
    assert "password" not in made.stdout
    assert versions(schema) == {"sessions": SESSIONS.version, "storage:snapshots": 1, "memory": 1}

    again = perdure("migrate-schema", *args)
    assert again.exit_code == 0, again.output
    assert [line.split(": ", 1)[1] for line in again.stdout.splitlines()] == [
        f"version {v} -> version {v}: up to date" for v in versions_now
    ]


def test_it_refuses_what_has_no_schema_and_tables_newer_than_perdure(
    schema: str, tmp_path: object
) -> None:
    nothing = perdure("migrate-schema")
    assert nothing.exit_code == 2
    assert "give --store, --storage or --memory" in nothing.stderr
    for option, target in (
        ("--store", f"file:{tmp_path}"),
        ("--storage", "sqlite:./blobs.db"),
        ("--memory", "sqlite:./memory.db"),
    ):
        refused = perdure("migrate-schema", option, target)
        assert refused.exit_code == 2, refused.output
        assert option in refused.stderr
    assert perdure("migrate-schema", "--store", url(schema)).exit_code == 0
    postgres_server.execute(
        f"UPDATE \"{schema}\".perdure_schema_version SET version = 9 WHERE component = 'sessions'"
    )
    newer = perdure("migrate-schema", "--store", url(schema), "--dry-run")
    assert newer.exit_code == 6
    assert "version 9, made by a newer perdure" in newer.stderr
    assert "upgrade perdure [schema_version]" in newer.stderr
    assert versions(schema) == {"sessions": 9}


def test_an_older_store_is_refused_until_migrate_schema_upgrades_it(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def write() -> None:
        store = PostgresSessionStore(postgres_server.DSN, schema=schema)
        try:
            for sid in ("a", "b"):
                await store.create(sid)
                messages = [{"role": "user", "content": [{"text": f"hello from {sid}"}]}]
                await store.commit(sid, messages)  # type: ignore[arg-type]
        finally:
            store.close()

    asyncio.run(write())  # this perdure's tables (version `now`), with two sessions
    now, later = SESSIONS.version, SESSIONS.version + 1
    columns = SESSIONS.tables["perdure_sessions"]
    newer = dataclasses.replace(  # a perdure one version later
        SESSIONS,
        version=later,
        tables={**SESSIONS.tables, "perdure_sessions": (*columns, "note")},
        steps={**SESSIONS.steps, now: lambda q: [ADD_NOTE.format(q=q)]},
    )
    monkeypatch.setattr("perdure.stores.postgres.sessions.SESSIONS", newer)

    refused = perdure("sessions", "list", "--store", url(schema))
    assert refused.exit_code == 6, refused.output
    assert f"version {now}, older than this perdure's version {later}" in refused.stderr
    assert f"perdure migrate-schema --store '{url(schema)}'" in refused.stderr

    dry = perdure("migrate-schema", "--store", url(schema), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"version {now} -> version {later}: would upgrade (1 step)" in dry.stdout
    assert f"  step {now} -> {later}:" in dry.stdout
    assert f'ALTER TABLE "{schema}".perdure_sessions ADD COLUMN note text;' in dry.stdout
    assert versions(schema) == {"sessions": now}

    done = perdure("migrate-schema", "--store", url(schema))
    assert done.exit_code == 0, done.output
    assert done.stdout.rstrip().endswith(f"version {now} -> version {later}: upgraded (1 step)")
    assert versions(schema) == {"sessions": later}

    listed = perdure("sessions", "list", "--store", url(schema), "--json")
    assert listed.exit_code == 0, listed.output
    assert [
        (s["session_id"], s["message_count"]) for s in json.loads(listed.stdout)["sessions"]
    ] == [
        ("a", 1),
        ("b", 1),
    ]
    history = perdure("sessions", "history", "b", "--store", url(schema))
    assert history.exit_code == 0, history.output
    assert "hello from b" in history.stdout
    again = perdure("migrate-schema", "--store", url(schema))
    assert again.stdout.rstrip().endswith(f"version {later} -> version {later}: up to date")
