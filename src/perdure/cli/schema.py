"""``perdure migrate-schema``: create or upgrade perdure's tables in PostgreSQL.

::

    perdure migrate-schema --store 'postgresql://app@db/prod?schema=perdure' --dry-run
    perdure migrate-schema --store 'postgresql://app@db/prod?schema=perdure' \\
        --storage 'postgresql://app@db/prod?schema=perdure&table=snapshots' \\
        --memory 'postgresql://app@db/prod?schema=perdure' --json

A thin face over the PostgreSQL backends' ``migrate_schema`` (the steps, their
transactions and the advisory lock are :meth:`perdure._runtime.postgres.
PostgresDatabase.migrate`'s). A store opened on an older schema refuses it, naming
this command: upgrading shared tables is an operator's decision, never a side effect
of whichever process starts first. A URL of another kind (``file:``, ``sqlite:``)
is a usage error (exit 2): those stores have no schema to migrate; tables newer
than this perdure exit 6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import click

from perdure._runtime.urls import postgres_url, split_url
from perdure.cli._common import echo_json, handle_errors, json_option, open_cli_store, run
from perdure.cli.output import plural
from perdure.storage import open_storage

if TYPE_CHECKING:
    from perdure._runtime.postgres import SchemaMigration

__all__ = ["migrate_schema"]

_SERVER_SCHEMES = ("postgresql", "postgres")


def _store(url: str) -> Any:
    try:
        return open_cli_store(url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--store") from None


def _storage(url: str) -> Any:
    try:
        return open_storage(url)
    except (ValueError, ImportError) as exc:
        raise click.BadParameter(str(exc), param_hint="--storage") from None


def _memory(url: str) -> Any:
    try:
        split_url(url, _SERVER_SCHEMES, "memory store")
        dsn, options = postgres_url(url, {"schema": str}, "memory store")
        from perdure.memory.postgres_store import PostgresMemoryStore

        # The tables serve every namespace of the schema; the store needs one to exist.
        return PostgresMemoryStore(
            dsn,
            namespace="perdure-migrate-schema",
            schema=str(options.get("schema", "perdure")),
        )
    except (ValueError, ImportError) as exc:
        raise click.BadParameter(str(exc), param_hint="--memory") from None


_OPENERS: dict[str, Callable[[str], Any]] = {
    "--store": _store,
    "--storage": _storage,
    "--memory": _memory,
}


def _migrate(option: str, url: str, dry_run: bool) -> SchemaMigration:
    backend = _OPENERS[option](url)
    try:
        migrate = getattr(backend, "migrate_schema", None)
        if migrate is None:
            raise click.BadParameter(
                f"{url!r} has no schema to migrate: only postgresql:// backends keep "
                "versioned tables",
                param_hint=option,
            )
        return cast("SchemaMigration", run(migrate(dry_run=dry_run)))
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()


def _print(option: str, done: SchemaMigration) -> None:
    where = f"{done.component} ({option} {done.server}, schema {done.schema!r})"
    before = "no tables" if done.before is None else f"version {done.before}"
    count = len(done.steps)
    steps = f" ({plural(count, 'step')})" if count else ""
    if done.action == "create":
        what = "would create" if done.dry_run else "created"
    elif done.action == "upgrade":
        what = ("would upgrade" if done.dry_run else "upgraded") + steps
    else:
        what = "up to date"
    click.echo(f"{where}: {before} -> version {done.after}: {what}")
    if done.dry_run:
        for start, statements in done.steps:
            click.echo(f"  step {start} -> {start + 1}:")
            for statement in statements:
                click.echo("    " + " ".join(statement.split()) + ";")


@click.command("migrate-schema")
@click.option(
    "--store",
    "stores",
    multiple=True,
    metavar="URL",
    help="A PostgreSQL session store: postgresql://USER@HOST/DB?schema=NAME (repeatable).",
)
@click.option(
    "--storage",
    "storages",
    multiple=True,
    metavar="URL",
    help="A PostgreSQL blob storage: postgresql://…?schema=NAME&table=T (repeatable).",
)
@click.option(
    "--memory",
    "memories",
    multiple=True,
    metavar="URL",
    help="A PostgreSQL memory store: postgresql://…?schema=NAME (repeatable).",
)
@click.option(
    "--dry-run", is_flag=True, help="Say what would be done, SQL included; change nothing."
)
@json_option
@handle_errors
def migrate_schema(
    stores: tuple[str, ...],
    storages: tuple[str, ...],
    memories: tuple[str, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Create or upgrade perdure's tables in PostgreSQL schemas.

    A store opened on tables made by an older perdure refuses them rather than
    upgrade them by itself; this command upgrades them, one step per version, each
    step a transaction of its own under the schema's lock. Stop the processes that
    use the schema first (and keep a backup). It prints each component's version
    before and after; --dry-run prints the steps and their SQL and changes nothing.
    Running it again does nothing, and two at once do the work once. Tables without
    a version yet are created; tables newer than this perdure are refused (exit 6:
    upgrade perdure).
    """
    wanted = [
        *(("--store", url) for url in stores),
        *(("--storage", url) for url in storages),
        *(("--memory", url) for url in memories),
    ]
    if not wanted:
        raise click.UsageError("nothing to migrate: give --store, --storage or --memory")
    results: list[dict[str, Any]] = []
    if dry_run and not as_json:
        click.echo("dry run: nothing was changed; without --dry-run these would be applied")
    for option, url in wanted:
        done = _migrate(option, url, dry_run)
        if as_json:
            results.append({"option": option, **_as_dict(done)})
        else:
            _print(option, done)
    if as_json:
        echo_json(results)


def _as_dict(done: SchemaMigration) -> dict[str, Any]:
    return {
        "component": done.component,
        "server": done.server,
        "schema": done.schema,
        "before": done.before,
        "after": done.after,
        "action": done.action,
        "dry_run": done.dry_run,
        "steps": [{"from": start, "sql": list(sql)} for start, sql in done.steps],
    }
