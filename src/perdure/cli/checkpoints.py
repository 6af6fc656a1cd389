"""``perdure checkpoints`` and ``perdure fork``: a stored session's checkpoints.

::

    perdure checkpoints list s1
    perdure checkpoints create s1 --label "before the refactor"
    perdure checkpoints restore s1 01JD…          # a pre_restore checkpoint first
    perdure checkpoints export s1 01JD… -o s1.checkpoint.json
    perdure checkpoints import s2 s1.checkpoint.json --create
    perdure fork s1 01JD…                          # prints the new session's id

The commands run the :class:`~perdure.session.Session` operations on a dormant
session (no agent): each writes under the session's writer lock, so a session busy
in another process is refused (exit 5), never interleaved. A session whose history
is damaged still reaches its checkpoints: listing, exporting and forking read only
the checkpoint. A damaged checkpoint is listed, marked damaged, beside the others,
and can be deleted; restoring, exporting or forking it is exit 4 and writes
nothing. A checkpoint id that is not a ULID is a usage error (exit 2); one that
names nothing is exit 3; an import that fails verification is exit 4 and writes
nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.text import Text

from perdure._runtime.fs import atomic_write
from perdure.checkpoints.store import (
    DamagedCheckpoint,
    check_checkpoint_id,
)
from perdure.cli import ops
from perdure.cli._common import (
    EXIT_ERROR,
    echo_json,
    fail,
    handle_errors,
    json_option,
    read_key_file,
    run,
    session_store,
    store_option,
)
from perdure.cli.output import new_table, note, plural, print_listing, progress_bar
from perdure.cli.render import format_time


@click.group()
def checkpoints() -> None:
    """List, create, restore and move checkpoints.

    A checkpoint is a read-only copy of a whole stored session: its history and its
    agent state. Every subcommand takes the session ID first.
    """


@checkpoints.command("list")
@click.argument("session_id", metavar="ID")
@store_option
@json_option
@handle_errors
def list_checkpoints(session_id: str, store_url: str, as_json: bool) -> None:
    """List a session's checkpoints, oldest first.

    A damaged checkpoint is listed too, marked damaged (with --json, each
    checkpoint has "damaged": true or false, and a damaged one its error);
    delete it, or let repair quarantine it.
    """
    with session_store(store_url) as store:
        found = run(ops.list_checkpoints(store, session_id))
    if as_json:
        echo_json(
            {
                "session_id": session_id,
                "checkpoints": [ops.checkpoint_dict(item) for item in found],
            }
        )
        return
    table = new_table()
    table.add_column("id", no_wrap=True)
    table.add_column("trigger", no_wrap=True)
    table.add_column("label")
    table.add_column("messages", justify="right")
    table.add_column("created", no_wrap=True)
    for item in found:
        if isinstance(item, DamagedCheckpoint):
            kind = item.kind.replace("_", " ")
            table.add_row(Text(item.checkpoint_id), Text("DAMAGED", style="red"), Text(kind))
            continue
        cells = (item.checkpoint_id, item.trigger, item.label or "", str(item.message_count))
        table.add_row(*map(Text, cells), Text(format_time(item.created_at)))
    print_listing(table, f"session {session_id!r} has no checkpoints")
    damaged = [item for item in found if isinstance(item, DamagedCheckpoint)]
    for item in damaged:
        note(f"damaged: {item.error.message}", "red")
    if damaged:
        note(
            f"delete a damaged checkpoint with: perdure checkpoints delete {session_id} ID, "
            "or quarantine it with: perdure repair",
            "dim",
        )


@checkpoints.command("create")
@click.argument("session_id", metavar="ID")
@click.option("--label", metavar="TEXT", default=None, help="A label to recognise it by.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the new checkpoint's id.")
@store_option
@json_option
@handle_errors
def create(session_id: str, label: str | None, quiet: bool, store_url: str, as_json: bool) -> None:
    """Checkpoint a session now.

    Writes a manual checkpoint of the whole stored session and prints its id.
    """
    with session_store(store_url) as store:
        meta = run(ops.create_checkpoint(store, session_id, label))
    if as_json:
        echo_json(meta)
    elif quiet:
        click.echo(meta.checkpoint_id)
    else:
        click.echo(
            f"created checkpoint {meta.checkpoint_id} of session {session_id!r} "
            f"({plural(meta.message_count, 'message')})"
        )


@checkpoints.command("restore")
@click.argument("session_id", metavar="ID")
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@click.option(
    "--no-checkpoint",
    is_flag=True,
    help="Do not checkpoint the current state first (it is then lost).",
)
@store_option
@json_option
@handle_errors
def restore(
    session_id: str, checkpoint_id: str, no_checkpoint: bool, store_url: str, as_json: bool
) -> None:
    """Roll a session back to a checkpoint.

    The history and agent state become the checkpoint's. A pre_restore
    checkpoint of the current state is written first unless --no-checkpoint.
    """
    check_checkpoint_id(checkpoint_id)
    with session_store(store_url) as store:
        result = run(
            ops.restore_checkpoint(store, session_id, checkpoint_id, checkpoint=not no_checkpoint)
        )
    if result.status != "restored":
        fail(f"restore of session {session_id!r} rejected [{result.reason}]", EXIT_ERROR)
        return
    if as_json:
        echo_json({"session_id": session_id, "checkpoint_id": checkpoint_id, **vars(result)})
        return
    saved = (
        f"; the state before is checkpoint {result.pre_restore_checkpoint_id}"
        if result.pre_restore_checkpoint_id
        else ""
    )
    click.echo(
        f"restored session {session_id!r} to checkpoint {checkpoint_id}: "
        f"{result.from_messages} → {plural(result.to_messages, 'message')}{saved}"
    )


@checkpoints.command("delete")
@click.argument("session_id", metavar="ID")
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@store_option
@json_option
@handle_errors
def delete(session_id: str, checkpoint_id: str, store_url: str, as_json: bool) -> None:
    """Delete a checkpoint (gone already is fine)."""
    check_checkpoint_id(checkpoint_id)
    with session_store(store_url) as store:
        existed = run(ops.delete_checkpoint(store, session_id, checkpoint_id))
    if as_json:
        echo_json({"session_id": session_id, "checkpoint_id": checkpoint_id, "deleted": existed})
    elif existed:
        click.echo(f"deleted checkpoint {checkpoint_id} of session {session_id!r}")
    else:
        click.echo(f"no checkpoint {checkpoint_id} in session {session_id!r}; nothing to do")


@checkpoints.command("export")
@click.argument("session_id", metavar="ID")
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    default="-",
    show_default=True,
    help="Where to write the export (- for standard output).",
)
@click.option(
    "--signing-key-file",
    metavar="FILE",
    default=None,
    help="Sign the export (HMAC-SHA256) with the key in FILE (its bytes, less a final newline).",
)
@store_option
@handle_errors
def export(
    session_id: str,
    checkpoint_id: str,
    output: str,
    signing_key_file: str | None,
    store_url: str,
) -> None:
    """Write a checkpoint to a file or stdout.

    The export is self-contained and verifiable (format perdure-checkpoint/1):
    images and other binaries inlined once each, every part hashed; signed with
    --signing-key-file, so that an import with the same key refuses any edit.
    """
    check_checkpoint_id(checkpoint_id)
    key = read_key_file(signing_key_file, "--signing-key-file")
    with session_store(store_url) as store:
        data = run(ops.export_checkpoint(store, session_id, checkpoint_id, key))
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        atomic_write(Path(output), data)
    except OSError as exc:
        raise ValueError(f"--output: cannot write {output}: {exc.strerror or exc}") from None
    click.echo(f"exported checkpoint {checkpoint_id} ({len(data)} bytes) to {output}", err=True)


@checkpoints.command("import")
@click.argument("session_id", metavar="ID")
@click.argument("file", metavar="FILE")
@click.option("--create", "create_session", is_flag=True, help="Create the session if absent.")
@click.option(
    "--verify-key-file",
    metavar="FILE",
    default=None,
    help="Refuse the export unless it is signed with the key in FILE.",
)
@store_option
@json_option
@handle_errors
def import_(
    session_id: str,
    file: str,
    create_session: bool,
    verify_key_file: str | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Add an exported checkpoint to a session.

    FILE (- for standard input) is verified in full first: any altered byte is
    refused (exit 4) and nothing is written. With --verify-key-file an unsigned
    export, or one signed with another key, is refused too. On a terminal a
    progress bar follows the checks of a big export.
    """
    data = _read_input(file)
    key = read_key_file(verify_key_file, "--verify-key-file")
    with session_store(store_url, must_exist=not create_session) as store:
        created = create_session and run(ops.message_count(store, session_id)) is None
        with progress_bar("verifying", enabled=not as_json) as progress:
            meta = run(
                ops.import_checkpoint(store, session_id, data, create_session, key, progress)
            )
    if as_json:
        echo_json(meta)
        return
    click.echo(
        f"imported checkpoint {meta.checkpoint_id} into session {session_id!r} "
        f"({plural(meta.message_count, 'message')})"
    )
    if created:
        # The checkpoint is stored beside the session, not restored into it.
        click.echo(
            f"session {session_id!r} was created empty (0 messages); to continue from "
            f"the checkpoint, restore it: perdure checkpoints restore {session_id} "
            f"{meta.checkpoint_id} --store {store_url}"
        )


@click.command()
@click.argument("session_id", metavar="ID")
@click.argument("checkpoint_id", metavar="CHECKPOINT")
@store_option
@json_option
@handle_errors
def fork(session_id: str, checkpoint_id: str, store_url: str, as_json: bool) -> None:
    """Start a new session from a checkpoint.

    Prints the new session's id; the source session is untouched.
    """
    check_checkpoint_id(checkpoint_id)
    with session_store(store_url) as store:
        new_id = run(ops.fork_checkpoint(store, session_id, checkpoint_id))
    if as_json:
        echo_json(
            {"session_id": new_id, "source_session_id": session_id, "checkpoint_id": checkpoint_id}
        )
    else:
        click.echo(new_id)


def _read_input(file: str) -> bytes:
    if file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(file).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {file}: {exc.strerror or exc}") from None
