"""Schema versions and their upgrades (``perdure migrate-schema``), on the real server.

A test-only component, ``widgets``, stands in for a backend whose tables change: at
version 1 a table ``perdure_widgets(id, name)``; version 2 adds a column ``colour``
(the step from 1); version 3 adds ``size`` (the step from 2). Opening the tables at
another version than one's own is refused — an older schema with a message naming
``perdure migrate-schema``, a newer one with "upgrade perdure" — and never changes
them; :meth:`PostgresDatabase.migrate` runs the steps, each one transaction under
the schema's advisory lock, keeps the rows, says beforehand what it would do, and
does the work once when two processes run it at once. Each test has a schema of its
own (see postgres_server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from perdure.errors import (
    PerdureError,
    SchemaVersionError,
    SessionCorruptedError,
    SessionLockedError,
    StoreUnavailableError,
)
from postgres_server import DSN, execute, import_psycopg, schema_fixture

psycopg = import_psycopg()
from perdure._runtime.postgres import (  # noqa: E402  (after the import check)
    VERSION_TABLE,
    PostgresBugError,
    PostgresDatabase,
    PostgresErrors,
    SchemaPart,
    schema_lock_key,
)

ERRORS = PostgresErrors(
    unavailable=StoreUnavailableError,
    locked=SessionLockedError,
    damage=SessionCorruptedError,
    failure=PerdureError,
    version=SchemaVersionError,
)

COLUMNS = {1: ("id", "name"), 2: ("id", "name", "colour"), 3: ("id", "name", "colour", "size")}

ADD_COLOUR = "ALTER TABLE {q}.perdure_widgets ADD COLUMN colour text NOT NULL DEFAULT 'grey'"
ADD_SIZE = "ALTER TABLE {q}.perdure_widgets ADD COLUMN size integer"


def widgets(
    version: int, *, steps: dict[int, Sequence[str]] | None = None, oldest: int = 1
) -> SchemaPart:
    """The widgets component at ``version``, with its steps from ``oldest`` on (the
    steps' SQL as templates of ``{q}``; ``steps`` overrides them)."""
    known = {1: [ADD_COLOUR], 2: [ADD_SIZE]}
    if steps is not None:
        known.update(steps)
    columns = COLUMNS[version]

    def create(q: str) -> list[str]:
        extra = {"colour": "colour text NOT NULL DEFAULT 'grey'", "size": "size integer"}
        body = ", ".join(["id bigint PRIMARY KEY", "name text", *(extra[c] for c in columns[2:])])
        return [f"CREATE TABLE IF NOT EXISTS {q}.perdure_widgets ({body})"]

    def step(templates: Sequence[str]) -> Callable[[str], list[str]]:
        return lambda q: [t.format(q=q) for t in templates]

    return SchemaPart(
        component="widgets",
        version=version,
        tables={"perdure_widgets": columns},
        statements=create,
        steps={v: step(known[v]) for v in range(oldest, version)},
    )


@pytest.fixture
def schema() -> Iterator[str]:
    yield from schema_fixture()


@pytest.fixture
def opened(schema: str) -> Iterator[Callable[[SchemaPart], PostgresDatabase]]:
    """Opens databases on the test's schema; each is closed after the test."""
    made: list[PostgresDatabase] = []

    def open_one(part: SchemaPart) -> PostgresDatabase:
        db = PostgresDatabase(DSN, schema=schema, part=part, errors=ERRORS, what="widget store")
        made.append(db)
        return db

    yield open_one
    for db in made:
        db.close()


def touch(db: PostgresDatabase) -> None:
    """The first use of ``db``: makes or checks its tables."""
    db.call(lambda conn: None, doing="opening")


def recorded(schema: str) -> int:
    rows = execute(
        f'SELECT version FROM "{schema}".{VERSION_TABLE} WHERE component = %s', ("widgets",)
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def columns_of(schema: str) -> list[str]:
    rows = execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'perdure_widgets' ORDER BY ordinal_position",
        (schema,),
    )
    return [str(name) for (name,) in rows]


def test_steps_must_lead_to_the_version_without_a_gap() -> None:
    with pytest.raises(ValueError, match="without a gap"):
        SchemaPart("widgets", 3, {}, lambda q: [], steps={1: lambda q: []})
    with pytest.raises(ValueError, match="without a gap"):
        SchemaPart("widgets", 4, {}, lambda q: [], steps={1: lambda q: [], 3: lambda q: []})
    with pytest.raises(ValueError, match=">= 1"):
        SchemaPart("widgets", 0, {}, lambda q: [])
    assert widgets(3).oldest == 1
    assert widgets(3, oldest=2).oldest == 2
    assert widgets(1).oldest == 1


def test_an_older_schema_is_refused_with_the_command_that_upgrades_it(
    schema: str, opened: Callable[[SchemaPart], PostgresDatabase]
) -> None:
    old = opened(widgets(1))
    old.call(
        lambda conn: conn.execute(f"INSERT INTO {old.q}.perdure_widgets VALUES (1, 'bolt')"),
        doing="adding",
    )
    new = opened(widgets(2))
    with pytest.raises(SchemaVersionError) as info:
        touch(new)
    error = info.value
    assert error.code == "schema_version"
    assert error.details["reason"] == "older"
    assert (error.details["found"], error.details["supported"]) == (1, 2)
    assert "perdure migrate-schema --store" in error.message
    assert f"?schema={schema}" in error.message
    assert "stop the processes" in error.message
    # Refusing changed nothing: still version 1, the old columns, the row.
    assert recorded(schema) == 1
    assert columns_of(schema) == ["id", "name"]
    with pytest.raises(SchemaVersionError):  # and it stays refused: no silent upgrade
        touch(new)
    assert recorded(schema) == 1


def test_migrate_upgrades_keeps_the_rows_and_is_idempotent(
    schema: str, opened: Callable[[SchemaPart], PostgresDatabase]
) -> None:
    old = opened(widgets(1))
    old.call(
        lambda conn: conn.execute(
            f"INSERT INTO {old.q}.perdure_widgets VALUES (1, 'bolt'), (2, 'nut')"
        ),
        doing="adding",
    )
    old.close()
    new = opened(widgets(2))

    plan = new.migrate(dry_run=True)
    assert (plan.action, plan.before, plan.after, plan.dry_run) == ("upgrade", 1, 2, True)
    assert plan.steps == ((1, (ADD_COLOUR.format(q=new.q),)),)
    assert recorded(schema) == 1  # a dry run changes nothing
    assert columns_of(schema) == ["id", "name"]

    done = new.migrate()
    assert (done.action, done.before, done.after, done.dry_run) == ("upgrade", 1, 2, False)
    assert done.steps == plan.steps
    assert (done.component, done.schema) == ("widgets", schema)
    assert recorded(schema) == 2
    assert columns_of(schema) == ["id", "name", "colour"]
    rows = new.call(
        lambda conn: conn.execute(
            f"SELECT id, name, colour FROM {new.q}.perdure_widgets ORDER BY id"
        ).fetchall(),
        doing="reading",
    )
    assert rows == [(1, "bolt", "grey"), (2, "nut", "grey")]

    again = new.migrate()  # idempotent: nothing left to do
    assert (again.action, again.before, again.after, again.steps) == ("none", 2, 2, ())
    assert new.migrate(dry_run=True).action == "none"
    assert recorded(schema) == 2

    # The perdure that knows version 1 only now refuses the newer tables.
    older = opened(widgets(1))
    with pytest.raises(SchemaVersionError) as info:
        touch(older)
    assert info.value.details["reason"] == "newer"
    assert "upgrade perdure" in info.value.message
    with pytest.raises(SchemaVersionError):  # and will not "migrate" them down
        older.migrate()
    assert recorded(schema) == 2


def test_each_step_is_a_transaction_of_its_own(
    schema: str, opened: Callable[[SchemaPart], PostgresDatabase]
) -> None:
    touch(opened(widgets(1)))
    # The step from 2 fails half-way: the step from 1 stays, the failed one leaves nothing.
    broken = opened(widgets(3, steps={2: [ADD_SIZE, "SELECT 1 / 0"]}))
    with pytest.raises(PostgresBugError, match="division by zero"):
        broken.migrate()
    assert recorded(schema) == 2
    assert columns_of(schema) == ["id", "name", "colour"]
    fixed = opened(widgets(3))
    done = fixed.migrate()
    assert (done.action, done.before, done.after) == ("upgrade", 2, 3)
    assert [start for start, _ in done.steps] == [2]
    assert columns_of(schema) == ["id", "name", "colour", "size"]
    touch(fixed)  # opens at the version it knows


def test_a_schema_older_than_the_steps_reach_is_refused(
    schema: str, opened: Callable[[SchemaPart], PostgresDatabase]
) -> None:
    touch(opened(widgets(1)))
    newest = opened(widgets(3, oldest=2))  # can upgrade 2 -> 3 only
    for attempt in (lambda: touch(newest), newest.migrate, lambda: newest.migrate(dry_run=True)):
        with pytest.raises(SchemaVersionError) as info:
            attempt()
        assert info.value.details["reason"] == "too_old"
        assert "earlier perdure release" in info.value.message
    assert recorded(schema) == 1


def test_migrate_makes_missing_tables_and_a_dry_run_makes_nothing(
    schema: str, opened: Callable[[SchemaPart], PostgresDatabase]
) -> None:
    db = opened(widgets(2))
    plan = db.migrate(dry_run=True)
    assert (plan.action, plan.before, plan.after) == ("create", None, 2)
    assert execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []
    made = db.migrate()
    assert (made.action, made.before, made.after, made.steps) == ("create", None, 2, ())
    assert recorded(schema) == 2
    assert columns_of(schema) == ["id", "name", "colour"]
    assert db.migrate().action == "none"


RACER = """
import json, sys
from perdure._runtime.postgres import PostgresDatabase, PostgresErrors, SchemaPart
from perdure.errors import PerdureError, SchemaVersionError

dsn, schema, process, action = sys.argv[1:5]
errors = PostgresErrors(PerdureError, PerdureError, PerdureError, PerdureError, SchemaVersionError)
part = SchemaPart(
    component="widgets",
    version=2,
    tables={"perdure_widgets": ("id", "name", "colour")},
    statements=lambda q: [
        f"CREATE TABLE IF NOT EXISTS {q}.perdure_widgets "
        "(id bigint PRIMARY KEY, name text, colour text NOT NULL DEFAULT 'grey')"
    ],
    steps={1: lambda q: [
        f"ALTER TABLE {q}.perdure_widgets ADD COLUMN colour text NOT NULL DEFAULT 'grey'",
        f"INSERT INTO {q}.perdure_widget_steps VALUES ({int(process)})",
    ]},
)
db = PostgresDatabase(dsn, schema=schema, part=part, errors=errors, what="w")
try:
    if action == "open":
        db.call(lambda conn: None, doing="opening")
        print(json.dumps({"opened": True}))
    else:
        done = db.migrate()
        print(json.dumps({"action": done.action, "before": done.before, "after": done.after}))
finally:
    db.close()
"""


def race(schema: str, actions: Sequence[str]) -> list[dict[str, object]]:
    """Run a process per action (``"open"`` or ``"migrate"`` the version-2 widgets)
    at once, and return what each printed.

    The test holds the schema's lock first and lets go once every process waits
    for it, past its own start: a real race, every time.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    key = schema_lock_key(schema)
    with psycopg.connect(DSN, autocommit=True) as holder:
        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", RACER, DSN, schema, str(n), action],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                for n, action in enumerate(actions)
            ]
            deadline = time.monotonic() + 30
            while True:
                waiting = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND objid = (%s::bigint & 4294967295)::oid",
                    (key,),
                ).fetchone()
                if waiting is not None and waiting[0] == len(actions):
                    break
                assert time.monotonic() < deadline, "the processes never queued for the lock"
                assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
                time.sleep(0.05)
        outcomes = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            outcomes.append(json.loads(out.splitlines()[-1]))
    return outcomes


def test_two_processes_migrating_at_once_do_the_work_once(
    schema: str, opened: Callable[[SchemaPart], PostgresDatabase]
) -> None:
    old = opened(widgets(1))
    old.call(
        lambda conn: conn.execute(
            f"CREATE TABLE {old.q}.perdure_widget_steps (process integer); "
            f"INSERT INTO {old.q}.perdure_widgets VALUES (1, 'bolt')"
        ),
        doing="adding",
    )
    outcomes = race(schema, ["migrate", "migrate"])
    assert sorted(str(o["action"]) for o in outcomes) == ["none", "upgrade"], outcomes
    applied = next(o for o in outcomes if o["action"] == "upgrade")
    waited = next(o for o in outcomes if o["action"] == "none")
    assert (applied["before"], applied["after"]) == (1, 2)
    assert (waited["before"], waited["after"]) == (2, 2)  # it saw the other's work done
    assert recorded(schema) == 2
    assert len(execute(f'SELECT process FROM "{schema}".perdure_widget_steps')) == 1
    assert columns_of(schema) == ["id", "name", "colour"]
    assert execute(f'SELECT id, name, colour FROM "{schema}".perdure_widgets') == [
        (1, "bolt", "grey")
    ]


def test_processes_making_the_tables_at_once_make_them_once(schema: str) -> None:
    # Each looked for the tables (and found none) before it waited for the lock: the
    # one that waits must still see, once it holds the lock, what the first made.
    outcomes = race(schema, ["open", "open", "migrate"])
    assert outcomes[:2] == [{"opened": True}, {"opened": True}]
    assert outcomes[2]["after"] == 2
    assert outcomes[2]["action"] in ("create", "none")
    assert recorded(schema) == 2
    assert columns_of(schema) == ["id", "name", "colour"]
