"""``perdure gc``: expire inactive sessions and prune old checkpoints (SPEC §9).

::

    perdure gc --store sqlite:./perdure.db --ttl 30d                 # dry run
    perdure gc --store file:./data --ttl 12h --keep-checkpoints 5 --apply --json
    perdure gc --store file:./data --max-checkpoint-age 30d --apply
    perdure gc --checkpoints 'postgresql://db/app?schema=app' --max-checkpoint-age 90d

``--checkpoints URL`` prunes a checkpoint store of its own (``postgresql://…`` for a
``PostgresCheckpointStore``, ``file:DIR`` for a ``FileCheckpointStore``) session by
session — also the sessions no session store lists any more, as those Redis expired
in the seed-004 layout (:func:`perdure.maintenance.gc_checkpoints`).

A thin face over :func:`perdure.maintenance.gc_store`: a dry run unless
``--apply`` is given. Durations are a whole number and a unit (``3600s``, ``90m``,
``12h``, ``30d``, ``2w``); anything else is a usage error (exit 2) naming the option.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Iterator
from typing import Any

import click
from rich.text import Text

from perdure.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_PROBLEM,
    echo_json,
    fail,
    handle_errors,
    json_option,
    run,
    session_store,
    store_option,
)
from perdure.cli.output import (
    format_time,
    new_table,
    note,
    plural,
    print_sections,
    progress_bar,
)
from perdure.maintenance import GcReport, gc_checkpoints, gc_store, parse_duration
from perdure.session.store import SupportsExpiry


@click.command()
@click.option(
    "--ttl",
    metavar="DURATION",
    default=None,
    help="Delete sessions inactive for longer than this (3600s, 90m, 12h, 30d, 2w).",
)
@click.option(
    "--keep-checkpoints",
    metavar="N",
    type=int,
    default=None,
    help="Keep each session's newest N checkpoints; delete older ones, any trigger.",
)
@click.option(
    "--max-checkpoint-age",
    metavar="DURATION",
    default=None,
    help="Delete checkpoints older than this (default: the store URL's max_checkpoint_age).",
)
@click.option(
    "--checkpoints",
    "checkpoints_url",
    metavar="URL",
    default=None,
    help="Prune this checkpoint store of its own instead of --store "
    "(postgresql://…?schema=S or file:DIR), every session it holds checkpoints of.",
)
@click.option("--apply", "apply", is_flag=True, help="Delete (without it: a dry run).")
@click.option(
    "--now",
    metavar="TIME",
    default=None,
    hidden=True,
    help="Measure inactivity against this ISO-8601 time instead of the clock.",
)
@store_option
@json_option
@handle_errors
def gc(
    ttl: str | None,
    keep_checkpoints: int | None,
    max_checkpoint_age: str | None,
    checkpoints_url: str | None,
    apply: bool,
    now: str | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Expire inactive sessions, prune old checkpoints (dry run by default).

    A store opened with a ttl (file:DIR?ttl=3600, sqlite:P?ttl=…, postgresql://…?ttl=…)
    deletes the messages of the sessions its ttl expired, keeping their
    checkpoints and a tombstone (they still read as expired). A session whose last
    update is older than --ttl is deleted with its checkpoints; every other session
    keeps its newest --keep-checkpoints checkpoints and loses those older than
    --max-checkpoint-age (by default the age limit the store URL sets,
    ``?max_checkpoint_age=SECONDS``). In a file
    store, temp files of killed writes and sessions a killed fork left empty go too.
    Without --apply nothing is deleted and the report says what would be. Exit 1
    when a session had to be skipped (locked by a writer, or damaged).
    """
    age_seconds = None
    if max_checkpoint_age is not None:
        try:
            age_seconds = parse_duration(max_checkpoint_age)
        except ValueError as exc:
            raise ValueError(f"--max-checkpoint-age: {exc}") from None
    ttl_seconds = None
    if ttl is not None:
        try:
            ttl_seconds = parse_duration(ttl)
        except ValueError as exc:
            raise ValueError(f"--ttl: {exc}") from None
    if keep_checkpoints is not None and keep_checkpoints < 0:
        raise ValueError(f"--keep-checkpoints must be 0 or more, got {keep_checkpoints}")
    when = _parse_now(now) if now is not None else None
    if checkpoints_url is not None:
        if ttl is not None:
            raise ValueError("--ttl expires sessions: give it with --store, not --checkpoints")
        with _checkpoint_store(checkpoints_url) as checkpoints:
            configured = getattr(checkpoints, "max_checkpoint_age", None)
            if keep_checkpoints is None and age_seconds is None and configured is None:
                raise ValueError(
                    "nothing to do: give --keep-checkpoints, --max-checkpoint-age "
                    "or a --checkpoints URL with max_checkpoint_age"
                )
            report = run(
                gc_checkpoints(
                    checkpoints,
                    keep_checkpoints=keep_checkpoints,
                    max_checkpoint_age=age_seconds,
                    dry_run=not apply,
                    now=when,
                )
            )
        _report(report, ttl, as_json)
        return
    with session_store(store_url) as store:
        configured = getattr(getattr(store, "checkpoints", None), "max_checkpoint_age", None)
        own_ttl = store.ttl if isinstance(store, SupportsExpiry) else None
        if (
            ttl is None
            and keep_checkpoints is None
            and age_seconds is None
            and configured is None
            and own_ttl is None
        ):
            raise ValueError(
                "nothing to do: give --ttl, --keep-checkpoints, --max-checkpoint-age, "
                "or a store URL with a ttl or max_checkpoint_age (file:DIR?ttl=86400)"
            )
        with progress_bar("collecting", enabled=not as_json) as progress:
            report = run(
                gc_store(
                    store,
                    ttl_seconds=ttl_seconds,
                    keep_checkpoints=keep_checkpoints,
                    dry_run=not apply,
                    now=when,
                    max_checkpoint_age=age_seconds,
                    progress=progress,
                )
            )
    _report(report, ttl, as_json)


def _report(report: GcReport, ttl: str | None, as_json: bool) -> None:
    if as_json:
        echo_json(report.to_dict())
    else:
        label = ttl
        if label is None and report.ttl_seconds is not None:
            label = f"{report.ttl_seconds:g}s (the store's ttl)"
        _print(report, label)
    if report.skipped:
        raise SystemExit(EXIT_PROBLEM)


_CHECKPOINT_OPTIONS: dict[str, type] = {
    "schema": str,
    "max_checkpoints": int,
    "max_checkpoint_age": float,
}


@contextlib.contextmanager
def _checkpoint_store(url: str) -> Iterator[Any]:
    """Open ``--checkpoints URL`` for the command, closed after; a bad URL is a usage
    error (exit 2), a store that is not there is not found (exit 3), never created."""
    store = _open_checkpoint_store(url)
    try:
        if hasattr(store, "schema_exists") and not run(store.schema_exists()):
            fail(f"no checkpoint store at {url} (no perdure tables in its schema)", EXIT_NOT_FOUND)
        yield store
    finally:
        if hasattr(store, "close"):
            store.close()


def _open_checkpoint_store(url: str) -> Any:
    from perdure._runtime.urls import postgres_url, split_url

    try:
        _, path = split_url(url, ("file", "postgresql", "postgres"), "checkpoint store")
        if path is not None:
            from perdure.checkpoints.store import FileCheckpointStore

            if not path.is_dir():
                fail(f"no checkpoint store at {path} (--checkpoints {url})", EXIT_NOT_FOUND)
            return FileCheckpointStore(path)
        from perdure.stores.postgres import PostgresCheckpointStore

        dsn, found = postgres_url(url, _CHECKPOINT_OPTIONS, "checkpoint store")
        return PostgresCheckpointStore(dsn, **found)  # type: ignore[arg-type]
    except (ValueError, ImportError) as exc:  # ImportError: perdure[postgres] is missing
        raise ValueError(f"--checkpoints: {exc}") from None


def _parse_now(text: str) -> _dt.datetime:
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--now: {text!r} is not an ISO-8601 time") from None
    return parsed if parsed.utcoffset() is not None else parsed.replace(tzinfo=_dt.UTC)


def _print(report: GcReport, ttl: str | None) -> None:
    # The tables are the output (piped: one table with a kind column, see
    # print_sections); every other line is a note, on stderr when piped.
    verb = "would delete" if report.dry_run else "deleted"
    if report.dry_run:
        note(
            Text.assemble(
                ("dry run", "bold"), ": nothing was deleted; --apply deletes what is listed"
            )
        )
    expired = new_table()
    expired.add_column("session", overflow="fold")
    expired.add_column("updated", no_wrap=True)
    expired.add_column("idle", justify="right", no_wrap=True)
    expired.add_column("messages", justify="right")
    for item in report.expired:
        expired.add_row(
            item.session_id,
            short_time(item.updated_at),
            human_duration(item.idle_seconds),
            str(item.message_count),
        )
    limits = []
    if report.keep_checkpoints is not None:
        limits.append(f"beyond each session's newest {report.keep_checkpoints}")
    if report.max_checkpoint_age is not None:
        limits.append(f"older than {human_duration(report.max_checkpoint_age)}")
    pruned = new_table()
    pruned.add_column("session", overflow="fold")
    pruned.add_column("checkpoint", overflow="fold")
    pruned.add_column("trigger", no_wrap=True)
    pruned.add_column("created", no_wrap=True)
    for checkpoint in report.pruned:
        pruned.add_row(
            checkpoint.session_id,
            checkpoint.checkpoint_id,
            "damaged" if checkpoint.damaged else checkpoint.trigger,
            short_time(checkpoint.created_at),
        )
    skipped = new_table()
    skipped.add_column("session", overflow="fold")
    skipped.add_column("reason", no_wrap=True)
    skipped.add_column("detail")
    for refused in report.skipped:
        skipped.add_row(refused.session_id or "(store)", refused.code, refused.detail)
    print_sections(
        [
            ("session", f"sessions inactive for more than {ttl}:", expired),
            ("checkpoint", f"checkpoints {' or '.join(limits)}:", pruned),
            ("skipped", "skipped:", skipped),
        ]
    )
    if report.orphans or report.temp_files:
        note(
            f"{verb} what killed writers left: {plural(len(report.orphans), 'empty session')} "
            f"of an interrupted fork, {plural(len(report.temp_files), 'temp file')}"
        )
    sessions, checkpoints = len(report.expired), report.checkpoints_deleted
    note(
        f"{verb} {sessions} of {plural(report.sessions_checked, 'session')} and "
        f"{plural(checkpoints, 'checkpoint')}"
    )


def short_time(iso: str) -> str:
    """An ISO-8601 time in UTC to the second with ``Z``: ``2025-03-01T12:00:05Z``."""
    return format_time(iso)


def human_duration(seconds: float) -> str:
    """A duration for people, two units at most: ``45s``, ``12m 3s``, ``31d 4h``."""
    total = int(seconds)
    if total < 60:
        return f"{max(total, 0)}s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
        if len(parts) == 2 or (parts and total == 0):
            break
    return " ".join(parts)
