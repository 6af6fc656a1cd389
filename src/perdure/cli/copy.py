"""``perdure copy``: move sessions and their checkpoints between any two stores, verified.

::

    perdure copy --from file:./data --to postgresql://app@db/agents
    perdure copy --from sqlite:./p.db --to file:./backup --session s1 --dry-run

A thin front end over :func:`perdure.migrate.copy.copy_sessions`: each session is
read whole under the source's writer lock, written under the target's, and read
back and compared before it counts as copied.
"""

from __future__ import annotations

import click
from rich.text import Text

from perdure.cli._common import (
    EXIT_PROBLEM,
    echo_json,
    fail,
    handle_errors,
    json_option,
    run,
    session_store,
)
from perdure.cli.output import new_table, note, print_table, progress_bar
from perdure.migrate.copy import CopyReport, CopyStatus, copy_sessions
from perdure.stores.memory import MemorySessionStore

__all__ = ["copy"]

_STATUS_STYLE = {"copied": "green", "would_copy": "cyan", "skipped": "yellow", "failed": "red"}


@click.command()
@click.option(
    "--from",
    "source_url",
    required=True,
    metavar="URL",
    help="The store to copy from (file:DIR, sqlite:PATH, postgresql://…); only read.",
)
@click.option(
    "--to",
    "target_url",
    required=True,
    metavar="URL",
    help="The store to copy into (made if it does not exist; memory: is refused).",
)
@click.option(
    "--session",
    "session_ids",
    multiple=True,
    metavar="ID",
    help="Copy only this session (repeat for more); default: every session.",
)
@click.option("--overwrite", is_flag=True, help="Replace sessions that exist in the target.")
@click.option("--dry-run", is_flag=True, help="Read and check everything; write nothing.")
@json_option
@handle_errors
def copy(
    source_url: str,
    target_url: str,
    session_ids: tuple[str, ...],
    overwrite: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Copy sessions with their checkpoints from one store to another, verified.

    Each session is read whole under the source's writer lock (a session in a turn
    elsewhere is skipped), written under the target's, then read back and compared:
    history, agent state and every checkpoint. A redacted message is copied as its
    replacement. Sessions already in the target are skipped unless --overwrite.

    Exit status: 0 every session copied, 1 some session skipped or failed (the table
    says why), 2 bad usage, 3 no source store, 4/5/6 as for other commands.
    """
    with session_store(source_url) as source, session_store(target_url, must_exist=False) as target:
        if isinstance(target, MemorySessionStore):
            raise click.BadParameter(
                f"{target_url!r} keeps sessions only while this command runs; name a store "
                "that persists",
                param_hint="--to",
            )
        with progress_bar("copying", enabled=not as_json) as progress:
            report = run(
                copy_sessions(
                    source, target, session_ids=session_ids or None, overwrite=overwrite,
                    dry_run=dry_run, progress=progress,
                )
            )  # fmt: skip
    if as_json:
        echo_json(report.to_dict())
    else:
        _render(report, source_url, target_url)
    if not report.ok:
        fail("some sessions were not copied (see above)", EXIT_PROBLEM)


def _render(report: CopyReport, source_url: str, target_url: str) -> None:
    table = new_table(title=f"{source_url} → {target_url}")
    table.add_column("session", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("msgs", justify="right", no_wrap=True)
    table.add_column("ckpts", justify="right", no_wrap=True)
    table.add_column("why", overflow="fold")
    for entry in report.sessions:
        table.add_row(
            Text(entry.session_id),
            Text(entry.status.replace("_", " "), style=_STATUS_STYLE[entry.status]),
            str(entry.messages),
            str(entry.checkpoints),
            Text(entry.reason or ""),
        )
    print_table(table)
    done: CopyStatus = "would_copy" if report.dry_run else "copied"
    verb = "would copy" if report.dry_run else "copied"
    suffix = " (dry run: nothing written)" if report.dry_run else ""
    note(
        f"{report.count(done)} {verb}, {report.count('skipped')} skipped, "
        f"{report.count('failed')} failed{suffix}"
    )
