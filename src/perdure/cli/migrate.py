"""``perdure migrate``: bring sessions over from other agent SDKs.

A thin front end over :func:`perdure.migrate.strands.migrate_strands`,
:func:`perdure.migrate.openai_agents.migrate_openai_agents` and
:func:`perdure.migrate.langgraph.migrate_langgraph`; the conversion rules and the
source layouts are described there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import click
from rich.text import Text

from perdure.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_PROBLEM,
    echo_json,
    fail,
    handle_errors,
    json_option,
    resolve_target_store,
    run,
)
from perdure.cli.output import new_table, note, print_table, progress_bar
from perdure.migrate.langgraph import (
    LangGraphMigrationReport,
    ThreadMigration,
    migrate_langgraph,
)
from perdure.migrate.openai_agents import (
    OpenAIAgentsMigration,
    OpenAIAgentsMigrationReport,
    migrate_openai_agents,
)
from perdure.migrate.strands import (
    MigrationReport,
    MigrationStatus,
    SessionMigration,
    migrate_strands,
)
from perdure.session import SessionStore, open_store
from perdure.session.urls import SCHEMES
from perdure.storage import STORAGE_SCHEMES, MemoryStorage, Storage, open_storage, split_url
from perdure.stores.memory import MemorySessionStore

__all__ = ["migrate"]

_STATUS_STYLE = {
    "imported": "green",
    "would_import": "cyan",
    "skipped": "yellow",
    "failed": "red",
}


def _target_path(url: str) -> Path | None:
    """The file or directory a store URL that opened names (``None`` for ``memory:``)."""
    return split_url(url, SCHEMES, "store")[1]


def _open_target(url: str, *, dry_run: bool) -> SessionStore:
    """The store to import into; one that keeps nothing after the command is refused.

    Raises:
        click.BadParameter: a bad URL, or ``memory:`` (exit 2, dry run or not).
    """
    try:
        store = open_store(url)  # a bad URL exits 2 here, dry run or not
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--to") from None
    if isinstance(store, MemorySessionStore):
        # It would report every session imported and lose them all when the command
        # exits: the one outcome a migration must never have.
        _close(store)
        raise click.BadParameter(
            f"{url!r} keeps sessions only while this command runs, so nothing would be "
            "imported; name a store that persists (file:DIR, sqlite:PATH, …)",
            param_hint="--to",
        )
    path = _target_path(url)
    if dry_run and path is not None and not path.exists():
        # Nothing to compare with, and opening some stores creates their file:
        # an empty stand-in answers "does this session exist?" without a side effect.
        _close(store)
        return MemorySessionStore()
    return store


def _close(store: SessionStore | Storage) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


def _render(report: MigrationReport) -> None:
    verb = "would import" if report.dry_run else "imported"
    table = new_table(title=f"Strands sessions in {report.source_dir}")
    table.add_column("session", overflow="fold")
    table.add_column("status", no_wrap=True)
    for column in ("msgs", "+results", "-orphans", "redacted", "ckpts"):
        table.add_column(column, justify="right", no_wrap=True)
    for entry in report.sessions:
        table.add_row(
            Text(entry.session_id),
            Text(entry.status.replace("_", " "), style=_STATUS_STYLE[entry.status]),
            str(entry.messages_imported),
            str(entry.placeholders_added),
            str(entry.orphans_dropped),
            str(entry.redactions_applied),
            str(entry.checkpoints_imported),
        )
    print_table(table)
    for entry in report.sessions:
        lines = [f"  {entry.reason}"] if entry.reason else []
        lines += [f"  note: {text}" for text in entry.notes]
        if lines:
            note(f"{entry.session_id} (from {entry.source}):")
            for line in lines:
                note(line)
    skipped = report.all_skipped_files
    if skipped:
        note(f"not imported ({len(skipped)}):")
        for item in skipped:
            note(f"  {item.path}: {item.reason}")
    done: MigrationStatus = "would_import" if report.dry_run else "imported"
    counts = (
        f"{report.count(done)} {verb}, {report.count('skipped')} skipped, "
        f"{report.count('failed')} failed"
    )
    suffix = " (dry run: nothing written)" if report.dry_run else ""
    note(f"{counts}{suffix}")
    note(
        "+results: placeholder results for tool calls that never got one; -orphans: tool "
        "results dropped because nothing asked for them",
        "dim",
    )


_Entry = SessionMigration | OpenAIAgentsMigration | ThreadMigration


def _progress_bar() -> tuple[
    contextlib.ExitStack | None, Callable[[_Entry, int, int], None] | None
]:
    """The shared progress bar (:func:`perdure.cli.output.progress_bar`), already shown.

    ``(None, None)`` when stderr is not a terminal; else the stack that removes the
    bar when closed, and the migration's ``progress(entry, done, total)`` callback.
    """
    stack = contextlib.ExitStack()
    update = stack.enter_context(progress_bar("migrating"))
    if update is None:
        stack.close()
        return None, None

    def advance(_entry: _Entry, done: int, total: int) -> None:
        update(done, total)

    return stack, advance


@click.group()
def migrate() -> None:
    """Import sessions written by other agent SDKs into a perdure store."""


@migrate.command("strands")
@click.argument(
    "source_dir",
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option(
    "--to",
    "store_url",
    default=None,
    envvar="PERDURE_STORE",
    metavar="URL",
    callback=resolve_target_store,
    help=(
        "The perdure store to import into: file:DIR or sqlite:PATH (env PERDURE_STORE; "
        "or --store before the command)."
    ),
)
@click.option("--dry-run", is_flag=True, help="Read and convert everything; write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace sessions that already exist in the store.")
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse a session with a file that cannot be read, instead of importing it with a gap.",
)
@json_option
@handle_errors
def strands(
    source_dir: Path, store_url: str, dry_run: bool, overwrite: bool, strict: bool, as_json: bool
) -> None:
    """Import Strands Agents sessions (FileSessionManager logs and snapshots) into a store.

    DIR is the storage_dir of a FileSessionManager (session_<id>/agents/agent_<id>/
    messages/message_<n>.json) or the base directory of the LocalFileStorage of a
    SnapshotSessionManager (session/<id>/scopes/agent/<id>/snapshots/); both may be
    present. Broken tool pairs are repaired on the way and every change is reported;
    files that cannot be read are listed, never dropped silently. A session with one
    agent keeps its id, several agents become <session>.<agent>. Each message keeps,
    in its "metadata", Strands' message id, created_at and updated_at and any usage
    and metrics; the first message also keeps the session's creation time.

    Exit status: 0 all imported, 1 some file could not be read or some session not
    written, 2 bad usage (memory: is refused: it would keep nothing), 3 no Strands
    session under DIR.
    """
    store = _open_target(store_url, dry_run=dry_run)
    progress, advance = (None, None) if as_json else _progress_bar()
    try:
        report = run(
            migrate_strands(
                source_dir,
                store,
                dry_run=dry_run,
                overwrite=overwrite,
                progress=advance,
                strict=strict,
            )
        )
    finally:
        if progress is not None:
            progress.close()
        _close(store)
    if not report.sessions and not report.skipped_files:
        fail(
            f"no Strands sessions under {str(source_dir)!r} (expected session_<id>/agents/… "
            "or session/<id>/scopes/agent/…)",
            EXIT_NOT_FOUND,
        )
    if as_json:
        echo_json(report.to_dict())
    else:
        _render(report)
    if not report.ok:
        fail("some Strands data was not imported (see above)", EXIT_PROBLEM)


def _render_openai_agents(report: OpenAIAgentsMigrationReport) -> None:
    table = new_table(title=f"OpenAI Agents sessions in {report.source}")
    table.add_column("session", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("items", justify="right", no_wrap=True)
    table.add_column("not imported", justify="right", no_wrap=True)
    table.add_column("verified", no_wrap=True)
    for entry in report.sessions:
        table.add_row(
            Text(entry.session_id),
            Text(entry.status.replace("_", " "), style=_STATUS_STYLE[entry.status]),
            str(entry.items_imported),
            str(len(entry.skipped_rows)),
            "yes" if entry.verified else "-",
        )
    print_table(table)
    for entry in report.sessions:
        lines = [f"  {entry.reason}"] if entry.reason else []
        lines += [f"  note: {text}" for text in entry.notes]
        lines += [f"  row {row.row_id}: {row.reason}" for row in entry.skipped_rows]
        if lines:
            note(f"{entry.session_id}:")
            for line in lines:
                note(line)
    _summary(report)


def _summary(report: OpenAIAgentsMigrationReport | LangGraphMigrationReport) -> None:
    """The closing line: how many were (or would be) imported, skipped, failed."""
    verb = "would import" if report.dry_run else "imported"
    done: MigrationStatus = "would_import" if report.dry_run else "imported"
    counts = (
        f"{report.count(done)} {verb}, {report.count('skipped')} skipped, "
        f"{report.count('failed')} failed"
    )
    suffix = " (dry run: nothing written)" if report.dry_run else ""
    note(f"{counts}{suffix}")


def _sqlite_source(url: str) -> Path:
    """The database file of ``--from`` (``sqlite:PATH`` or a bare path)."""
    if ":" in url and not Path(url).exists():
        try:
            path = split_url(url, ("sqlite",), "source")[1]
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--from") from None
        assert path is not None
    else:
        path = Path(url).expanduser()
    if not path.is_file():
        raise click.BadParameter(f"{str(path)!r} is not a file", param_hint="--from")
    return path


@migrate.command("openai-agents")
@click.option(
    "--from",
    "source_url",
    required=True,
    metavar="sqlite:PATH",
    help="The OpenAI Agents SDK's SQLiteSession database (sqlite:PATH or PATH).",
)
@click.option(
    "--to",
    "store_url",
    default=None,
    envvar="PERDURE_STORE",
    metavar="URL",
    callback=resolve_target_store,
    help="The perdure store to import into: file:DIR, sqlite:PATH, postgresql://…, "
    "redis://… (env PERDURE_STORE; or --store before the command).",
)
@click.option(
    "--sessions-table",
    default="agent_sessions",
    show_default=True,
    help="SQLiteSession's sessions_table.",
)
@click.option(
    "--messages-table",
    default="agent_messages",
    show_default=True,
    help="SQLiteSession's messages_table.",
)
@click.option("--dry-run", is_flag=True, help="Read and convert everything; write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace sessions that already exist in the store.")
@json_option
@handle_errors
def openai_agents(
    source_url: str,
    store_url: str,
    sessions_table: str,
    messages_table: str,
    dry_run: bool,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Import OpenAI Agents SDK SQLiteSession conversations into a store.

    Every session of the database keeps its id; its items are stored whole, one per
    message, so PerdureSession (perdure.adapters.openai_agents) reads them back equal.
    Each session is read back and verified after the copy. Rows that are not JSON
    objects (SQLiteSession skips them when it reads) are listed, never dropped
    silently. The database is opened read-only.

    Exit status: 0 all imported, 1 some row could not be read or some session not
    written, 2 bad usage (memory: is refused: it would keep nothing), 3 no session in
    the database.
    """
    source = _sqlite_source(source_url)
    store = _open_target(store_url, dry_run=dry_run)
    progress, advance = (None, None) if as_json else _progress_bar()
    try:
        try:
            report = run(
                migrate_openai_agents(
                    source,
                    store,
                    sessions_table=sessions_table,
                    messages_table=messages_table,
                    dry_run=dry_run,
                    overwrite=overwrite,
                    progress=advance,
                )
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--from") from None
    finally:
        if progress is not None:
            progress.close()
        _close(store)
    if not report.sessions:
        fail(f"no OpenAI Agents sessions in {str(source)!r}", EXIT_NOT_FOUND)
    if as_json:
        echo_json(report.to_dict())
    else:
        _render_openai_agents(report)
    if not report.ok:
        fail("some OpenAI Agents data was not imported (see above)", EXIT_PROBLEM)


def _open_storage_target(url: str, *, dry_run: bool) -> Storage:
    """The storage to import into; one that keeps nothing after the command is refused.

    Raises:
        click.BadParameter: a bad URL, or ``memory:`` (exit 2, dry run or not).
    """
    try:
        storage = open_storage(url)  # a bad URL exits 2 here, dry run or not
        path = split_url(url, STORAGE_SCHEMES, "storage")[1]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--to") from None
    if isinstance(storage, MemoryStorage):
        raise click.BadParameter(
            f"{url!r} keeps data only while this command runs, so nothing would be "
            "imported; name a storage that persists (file:DIR, sqlite:PATH, …)",
            param_hint="--to",
        )
    if dry_run and path is not None and not path.exists():
        # Nothing to compare with, and reading some storages creates their file.
        _close(storage)
        return MemoryStorage()
    return storage


def _render_langgraph(report: LangGraphMigrationReport) -> None:
    table = new_table(title=f"LangGraph threads in {report.source}")
    table.add_column("thread", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("checkpoints", justify="right", no_wrap=True)
    table.add_column("writes", justify="right", no_wrap=True)
    table.add_column("verified", no_wrap=True)
    for entry in report.threads:
        table.add_row(
            Text(entry.thread_id),
            Text(entry.status.replace("_", " "), style=_STATUS_STYLE[entry.status]),
            str(entry.checkpoints),
            str(entry.writes),
            "yes" if entry.verified else "-",
        )
    print_table(table)
    for entry in report.threads:
        lines = [f"  {entry.reason}"] if entry.reason else []
        lines += [f"  note: {text}" for text in entry.notes]
        if lines:
            note(f"{entry.thread_id}:")
            for line in lines:
                note(line)
    _summary(report)


@migrate.command("langgraph")
@click.option(
    "--from",
    "source_url",
    required=True,
    metavar="sqlite:PATH",
    help="LangGraph's SqliteSaver database (sqlite:PATH or PATH).",
)
@click.option(
    "--to",
    "storage_url",
    required=True,
    envvar="PERDURE_STORAGE",
    metavar="URL",
    help="The perdure storage PerdureSaver keeps checkpoints in: file:DIR, sqlite:PATH, "
    "postgresql://…, redis://…, s3://… (env PERDURE_STORAGE).",
)
@click.option(
    "--prefix",
    default="langgraph",
    show_default=True,
    help="PerdureSaver's key prefix in the storage.",
)
@click.option("--dry-run", is_flag=True, help="Read everything; write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace threads that already exist.")
@json_option
@handle_errors
def langgraph(
    source_url: str, storage_url: str, prefix: str, dry_run: bool, overwrite: bool, as_json: bool
) -> None:
    """Import LangGraph SqliteSaver threads into PerdureSaver on a perdure storage.

    Every thread keeps its id, every checkpoint (all namespaces) its id, parent,
    metadata and pending writes; channel values are stored incrementally, so the
    copy is usually much smaller than the source. Each thread is read back through
    PerdureSaver (which checks every hash) and compared with the source after the
    copy; a thread that differs is removed again and reported failed. The database
    is opened read-only. Needs perdure[langgraph] and langgraph-checkpoint-sqlite.

    Exit status: 0 all imported, 1 some thread not copied, 2 bad usage (memory: is
    refused: it would keep nothing), 3 no thread in the database.
    """
    try:
        from perdure.adapters.langgraph import PerdureSaver
    except ImportError as exc:
        raise click.UsageError(f"{exc} (and langgraph-checkpoint-sqlite)") from None
    source = _sqlite_source(source_url)
    storage = _open_storage_target(storage_url, dry_run=dry_run)
    try:
        saver = PerdureSaver(storage, prefix=prefix)
    except ValueError as exc:
        _close(storage)
        raise click.BadParameter(str(exc), param_hint="--prefix") from None
    progress, advance = (None, None) if as_json else _progress_bar()
    try:
        try:
            report = run(
                migrate_langgraph(
                    source, saver, dry_run=dry_run, overwrite=overwrite, progress=advance
                )
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--from") from None
        except ImportError as exc:
            raise click.UsageError(
                f"{exc}: pip install 'perdure[langgraph]' langgraph-checkpoint-sqlite"
            ) from None
    finally:
        if progress is not None:
            progress.close()
        _close(storage)
    if not report.threads:
        fail(f"no LangGraph threads in {str(source)!r}", EXIT_NOT_FOUND)
    if as_json:
        echo_json(report.to_dict())
    else:
        _render_langgraph(report)
    if not report.ok:
        fail("some LangGraph threads were not imported (see above)", EXIT_PROBLEM)
