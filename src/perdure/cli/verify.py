"""``perdure verify`` and ``perdure repair``: find damaged sessions, heal damaged records.

::

    perdure verify --store sqlite:./perdure.db          # exit 1 when anything is damaged
    perdure verify --store file:./data s1 s2 --json
    perdure repair --store file:./data                  # dry run: what would move
    perdure repair --store file:./data --apply --quarantine-dir ./quarantine

Both are thin faces over :func:`perdure.maintenance.verify_store` and
:func:`~perdure.maintenance.repair_store`. ``verify`` only reads. ``repair``
is a dry run unless ``--apply`` is given, works on ``file:`` and ``sqlite:`` stores, and reports
counts and positions of what it moves, never content. Neither creates a store: a
``file:`` directory or ``sqlite:`` file that does not exist is an error (exit 3).
"""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from perdure.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_PROBLEM,
    echo_json,
    handle_errors,
    json_option,
    run,
    session_store,
    store_option,
)
from perdure.cli.output import (
    new_table,
    note,
    output_format,
    plural,
    print_sections,
    print_table,
    progress_bar,
)
from perdure.maintenance import (
    Damage,
    RepairReport,
    VerifyReport,
    repair_store,
    verify_store,
)
from perdure.session import FileSessionStore
from perdure.stores.sqlite import SQLiteSessionStore


@click.command()
@click.argument("session_ids", metavar="[SESSION]...", nargs=-1)
@store_option
@json_option
@handle_errors
def verify(session_ids: tuple[str, ...], store_url: str, as_json: bool) -> None:
    """Verify every session and checkpoint; report the damage (exit 1 if any).

    Each session is read in full and checked against its hash chain, and so is
    every checkpoint. Each damaged one is reported with the kind of damage and
    where it is (file and byte offset, or row); the walk never stops at the first.
    Name sessions to check only those. Nothing is written.
    """
    with session_store(store_url) as store:
        with progress_bar("verifying", enabled=not as_json) as progress:
            report = run(
                verify_store(store, session_ids=list(session_ids) or None, progress=progress)
            )
        # What repair can act on: every damage of a file store but an unreadable
        # file; a SQLite store's rows and WAL, not its checkpoints.
        repairable = any(
            d.kind != "unreadable"
            and (
                isinstance(store, FileSessionStore)
                or (isinstance(store, SQLiteSessionStore) and d.checkpoint_id is None)
            )
            for d in report.damage
        )
    # Sessions named and none found: nothing was verified, so the not-found error is
    # the whole answer (a "no damage" line before it would say the opposite).
    if not _only_missing(report.sessions_checked, report.missing, report.clean):
        if as_json:
            echo_json(report.to_dict())
        else:
            _print_verify(report, store_url, repairable=repairable)
    _exit(report.missing, report.clean)


def _only_missing(checked: int, missing: tuple[str, ...], clean: bool) -> bool:
    """Sessions were named and none was found: the not-found errors are the whole answer.

    Nothing was verified, so a report ("no damage", "nothing to repair") printed
    before the errors would say the opposite of them.
    """
    return bool(missing) and not checked and clean


def _exit(missing: tuple[str, ...], clean: bool) -> None:
    """Name each session not found (exit 3); exit 1 when damage is left."""
    for session_id in missing:
        click.echo(f"error: session {session_id!r} not found [session_not_found]", err=True)
    if missing:
        raise SystemExit(EXIT_NOT_FOUND)
    if not clean:
        raise SystemExit(EXIT_PROBLEM)


def _print_verify(report: VerifyReport, store_url: str, *, repairable: bool) -> None:
    # The damage table is the output (piped: always, empty when there is none); the
    # summary is a note, under it on a terminal and on stderr when piped.
    checked = (
        f"{plural(report.sessions_checked, 'session')} and "
        f"{plural(report.checkpoints_checked, 'checkpoint')}"
    )
    if report.clean:
        if output_format() != "table":
            print_table(damage_table(()))
        found = (
            "" if report.sessions_checked or report.missing else f" (no sessions in {store_url})"
        )
        note(Text.assemble(("✓", "green"), f" {checked} verified: no damage{found}"))
        return
    print_table(damage_table(report.damage))
    sessions = report.damaged_sessions
    note(
        Text.assemble(
            ("✗", "red"),
            f" {len(sessions)} of {plural(report.sessions_checked, 'session')} "
            f"damaged ({checked} verified)",
        )
    )
    if repairable:
        note(f"see what quarantine would move: perdure repair --store {store_url}", "dim")


def damage_table(damage: tuple[Damage, ...]) -> Table:
    """Damaged sessions and checkpoints: session, kind, position."""
    table = new_table()
    table.add_column("session", overflow="fold")
    table.add_column("damage", no_wrap=True)
    table.add_column("position", overflow="fold")
    for found in damage:
        table.add_row(found.session_id or "(store)", found.kind, found.position)
    return table


@click.command()
@click.argument("session_ids", metavar="[SESSION]...", nargs=-1)
@click.option(
    "--apply", "apply", is_flag=True, help="Move the bad records (without it: a dry run)."
)
@click.option(
    "--quarantine-dir",
    metavar="DIR",
    default=None,
    help="Where moved records go (default: .session-recovery-quarantine in the store).",
)
@store_option
@json_option
@handle_errors
def repair(
    session_ids: tuple[str, ...],
    apply: bool,
    quarantine_dir: str | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Quarantine bad records of a file or SQLite store (dry run by default).

    Damaged sessions are found as verify finds them. With --apply, records whose
    bytes were altered, and lines that are no record, move to the quarantine
    directory and the rest of each session is kept; records already gone (lines
    deleted) are reported missing and the intact records after them kept. In a
    SQLite store each damaged session keeps its verifiable prefix of rows (the rows
    from the first bad one move), and a damaged WAL moves to quarantine. A damaged
    checkpoint file moves to the quarantine directory too; one written by perdure
    0.1 without a sha256 is sealed in place, its content unchanged. The report
    gives counts and line numbers (from 1), never content. Damage that cannot be
    pinned on single records (manifests, attachments) is reported and left alone.
    Exit 1 when damage remains afterwards (always, in a dry run that found some);
    exit 3 when a named session does not exist.
    """
    with session_store(store_url, file_only="repair") as store:
        assert isinstance(store, FileSessionStore | SQLiteSessionStore)
        with progress_bar("checking", enabled=not as_json) as progress:
            report = run(
                repair_store(
                    store,
                    dry_run=not apply,
                    quarantine_dir=quarantine_dir,
                    session_ids=list(session_ids) or None,
                    progress=progress,
                )
            )
    if not _only_missing(report.sessions_checked, report.missing, report.clean):
        if as_json:
            echo_json(report.to_dict())
        else:
            _print_repair(report)
    _exit(report.missing, report.clean)


def _print_repair(report: RepairReport) -> None:
    # The tables are the output (piped: one table with a kind column, see
    # print_sections); every other line is a note, on stderr when piped.
    sessions_table = new_table()
    sessions_table.add_column("session", overflow="fold")
    sessions_table.add_column("damage", no_wrap=True)
    sessions_table.add_column("position", overflow="fold")
    sessions_table.add_column("status", no_wrap=True)
    sessions_table.add_column("records", justify="right")
    sessions_table.add_column("lines")
    sessions_table.add_column("missing")
    for item in report.sessions:
        sessions_table.add_row(
            item.session_id,
            item.damage.kind,
            item.damage.position,
            item.status.replace("_", " "),
            str(item.quarantined),
            ", ".join(map(str, item.positions)) or "-",
            ", ".join(f"{count} before line {line}" for line, count in item.gaps) or "-",
        )
    checkpoints_table = new_table()
    checkpoints_table.add_column("session", overflow="fold")
    checkpoints_table.add_column("checkpoint", overflow="fold")
    checkpoints_table.add_column("damage", no_wrap=True)
    checkpoints_table.add_column("status", no_wrap=True)
    for fixed in report.checkpoints:
        checkpoints_table.add_row(
            fixed.session_id,
            fixed.checkpoint_id,
            fixed.damage.kind,
            fixed.status.replace("_", " "),
        )
    listed = {item.damage for item in report.sessions}
    listed.update(fixed.damage for fixed in report.checkpoints)
    if report.moved_files:  # the WAL line below says what happens to it
        listed.update(d for d in report.remaining if d.kind == "bad_wal" and d.session_id is None)
    by_hand = tuple(d for d in report.remaining if d not in listed)
    nothing = (
        not report.sessions
        and not report.remaining
        and not report.checkpoints
        and not report.moved_files
    )
    if report.dry_run and not nothing:
        note(
            Text.assemble(
                ("dry run", "bold"),
                ": nothing was changed; --apply moves the records below to "
                f"{report.quarantine_dir}",
            )
        )
    print_sections(
        [
            ("session", None, sessions_table),
            ("checkpoint", None, checkpoints_table),
            (
                "not repaired",
                "not repaired by quarantine (delete or restore these by hand):",
                damage_table(by_hand),
            ),
        ]
    )
    if nothing:
        checked = report.sessions_checked
        note(
            Text.assemble(
                ("✓", "green"), f" {plural(checked, 'session')} verified: nothing to repair"
            )
        )
        return
    for item in report.sessions:
        if item.quarantine_path is not None:
            note(f"{item.session_id}: moved to {item.quarantine_path}")
    for moved_file in report.moved_files:
        verb = "would move" if report.dry_run else "moved"
        note(f"{verb} the damaged WAL {moved_file} to quarantine")
    for fixed in report.checkpoints:
        if fixed.quarantine_path is not None:
            note(
                f"{fixed.session_id}: checkpoint {fixed.checkpoint_id} moved to "
                f"{fixed.quarantine_path}"
            )
        elif fixed.detail is not None:
            note(f"{fixed.session_id}: {fixed.status}: {fixed.detail}", "dim")
    moved = report.quarantined
    sessions = sum(1 for s in report.sessions if s.quarantined)
    if report.checkpoints and not report.sessions:
        pass  # only checkpoints: their table said it all
    else:
        verb = "would move" if report.dry_run else "moved"
        note(f"{verb} {plural(moved, 'record')} of {plural(sessions, 'session')}")
    missing = report.missing_records
    if missing:
        gaps = sum(1 for s in report.sessions if s.gaps)
        keep = "would be kept" if report.dry_run else "were kept"
        them = "it" if missing == 1 else "them"
        note(
            f"{plural(missing, 'record')} already missing from the journal of "
            f"{plural(gaps, 'session')} (lines deleted?): nothing can bring {them} back; the "
            f"records around {them} {keep}"
        )
    for item in report.sessions:
        if item.detail is not None:
            note(f"{item.session_id}: {item.status}: {item.detail}", "dim")
