"""``perdure gc``: expire inactive sessions and prune old checkpoints (SPEC §9).

::

    perdure gc --store sqlite:./perdure.db --ttl 30d                 # dry run
    perdure gc --store file:./data --ttl 12h --keep-checkpoints 5 --apply --json

A thin face over :func:`perdure.maintenance.gc_store`: a dry run unless
``--apply`` is given. Durations are a whole number and a unit (``3600s``, ``90m``,
``12h``, ``30d``, ``2w``); anything else is a usage error (exit 2) naming the option.
"""

from __future__ import annotations

import datetime as _dt

import click
from rich.table import Table

from perdure.cli._common import (
    EXIT_PROBLEM,
    console,
    echo_json,
    handle_errors,
    json_option,
    run,
    session_store,
    store_option,
)
from perdure.maintenance import GcReport, gc_store, parse_duration
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
    keeps its newest --keep-checkpoints checkpoints. In a file
    store, temp files of killed writes and sessions a killed fork left empty go too.
    Without --apply nothing is deleted and the report says what would be. Exit 1
    when a session had to be skipped (locked by a writer, or damaged).
    """
    ttl_seconds = None
    if ttl is not None:
        try:
            ttl_seconds = parse_duration(ttl)
        except ValueError as exc:
            raise ValueError(f"--ttl: {exc}") from None
    if keep_checkpoints is not None and keep_checkpoints < 0:
        raise ValueError(f"--keep-checkpoints must be 0 or more, got {keep_checkpoints}")
    when = _parse_now(now) if now is not None else None
    with session_store(store_url) as store:
        own_ttl = store.ttl if isinstance(store, SupportsExpiry) else None
        if ttl is None and keep_checkpoints is None and own_ttl is None:
            raise ValueError(
                "nothing to do: give --ttl, --keep-checkpoints or both, or a store URL "
                "with a ttl (file:DIR?ttl=86400)"
            )
        report = run(
            gc_store(
                store,
                ttl_seconds=ttl_seconds,
                keep_checkpoints=keep_checkpoints,
                dry_run=not apply,
                now=when,
            )
        )
    if as_json:
        echo_json(report.to_dict())
    else:
        label = ttl
        if label is None and report.ttl_seconds is not None:
            label = f"{report.ttl_seconds:g}s (the store's ttl)"
        _print(report, label)
    if report.skipped:
        raise SystemExit(EXIT_PROBLEM)


def _parse_now(text: str) -> _dt.datetime:
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--now: {text!r} is not an ISO-8601 time") from None
    return parsed if parsed.utcoffset() is not None else parsed.replace(tzinfo=_dt.UTC)


def _print(report: GcReport, ttl: str | None) -> None:
    out = console()
    verb = "would delete" if report.dry_run else "deleted"
    if report.dry_run:
        out.print("[bold]dry run[/]: nothing was deleted; --apply deletes what is listed")
    if report.expired:
        out.print(f"sessions inactive for more than {ttl}:")
        table = Table()
        table.add_column("session", overflow="fold")
        table.add_column("updated", no_wrap=True)
        table.add_column("idle", justify="right", no_wrap=True)
        table.add_column("messages", justify="right")
        for item in report.expired:
            table.add_row(
                item.session_id,
                short_time(item.updated_at),
                human_duration(item.idle_seconds),
                str(item.message_count),
            )
        out.print(table)
    if report.pruned:
        out.print(f"checkpoints beyond each session's newest {report.keep_checkpoints}:")
        table = Table()
        table.add_column("session", overflow="fold")
        table.add_column("checkpoint", overflow="fold")
        table.add_column("trigger", no_wrap=True)
        table.add_column("created", no_wrap=True)
        for pruned in report.pruned:
            table.add_row(
                pruned.session_id,
                pruned.checkpoint_id,
                "damaged" if pruned.damaged else pruned.trigger,
                short_time(pruned.created_at),
            )
        out.print(table)
    if report.skipped:
        out.print("skipped:")
        table = Table()
        table.add_column("session", overflow="fold")
        table.add_column("reason", no_wrap=True)
        table.add_column("detail")
        for skipped in report.skipped:
            table.add_row(skipped.session_id or "(store)", skipped.code, skipped.detail)
        out.print(table)
    if report.orphans or report.temp_files:
        out.print(
            f"{verb} what killed writers left: {len(report.orphans)} empty session"
            f"{'' if len(report.orphans) == 1 else 's'} of an interrupted fork, "
            f"{len(report.temp_files)} temp file{'' if len(report.temp_files) == 1 else 's'}"
        )
    sessions, checkpoints = len(report.expired), len(report.pruned)
    out.print(
        f"{verb} {sessions} of {report.sessions_checked} session"
        f"{'' if report.sessions_checked == 1 else 's'} and {checkpoints} checkpoint"
        f"{'' if checkpoints == 1 else 's'}"
    )


def short_time(iso: str) -> str:
    """An ISO-8601 UTC time to the second, for tables: ``2025-03-01 12:00:05``."""
    return iso[:19].replace("T", " ")


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
