"""``perdure rotate-keys``: re-encrypt a store's records under a new key, in place.

::

    export PERDURE_KEYS_FILE=./keys.json
    perdure rotate-keys --store sqlite:./perdure.db --to k2
    perdure rotate-keys --storage file:./snapshots --to k2

A thin face over :func:`perdure.rotation.rotate_keys` and
:func:`perdure.rotation.rotate_storage_keys`.
"""

from __future__ import annotations

from pathlib import Path

import click

from perdure.cli._common import (
    EXIT_NOT_FOUND,
    echo_json,
    fail,
    handle_errors,
    json_option,
    open_cli_store,
    remembered_store,
    run,
    session_store,
    store_option,
)
from perdure.cli.memory import memory_store
from perdure.cli.output import plural, progress_bar
from perdure.cli.snapshots import _opened as opened_storage
from perdure.crypto import AESGCMCipher, Cipher, keys_from_env, keys_from_file
from perdure.memory import LocalMemoryStore
from perdure.rotation import rotate_keys as rotate
from perdure.rotation import rotate_storage_keys
from perdure.storage import open_storage


@click.command("rotate-keys")
@store_option
@click.option(
    "--storage",
    "storage_url",
    default=None,
    metavar="URL",
    help=(
        "Rotate the blobs of this storage instead of a store (a SnapshotSessionManager's "
        "snapshots, a LangGraph saver's checkpoints): file:DIR, sqlite:PATH, "
        "postgresql://…, redis://… or s3://… (as snapshots --storage)."
    ),
)
@click.option(
    "--memory",
    "memory_url",
    default=None,
    metavar="URL",
    help=(
        "Rotate a memory store instead: sqlite:PATH or postgresql://USER@HOST/DB[?schema=NAME] "
        "(every user's memories)."
    ),
)
@click.option("--to", "to", required=True, help="The key id to re-encrypt everything under.")
@click.option(
    "--keys-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="JSON key file (see below); default: $PERDURE_KEYS, then $PERDURE_KEYS_FILE.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Rewrite everything, also what is already under --to (and plain records).",
)
@json_option
@click.pass_context
@handle_errors
def rotate_keys(
    ctx: click.Context,
    store_url: str,
    storage_url: str | None,
    memory_url: str | None,
    to: str,
    keys_file: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Re-encrypt every session and checkpoint of a store (or every blob of a
    --storage, or every memory of a --memory store) under key --to.

    \b
    Keys are read from --keys-file, else from the environment variable
    PERDURE_KEYS (the JSON itself), else from the file PERDURE_KEYS_FILE names.
    The JSON names every key records may be under, base64 of 32 bytes each:
        {"keys": {"k1": "<base64>", "k2": "<base64>"}, "active": "k2"}
    ("active" is optional here: --to decides). Keep the old keys in it until the
    rotation has finished: they are needed to read what is not rotated yet.

    \b
    Each session is rewritten in one atomic commit under its writer lock, and each
    checkpoint replaced atomically: killed at any moment (even SIGKILL), the store
    stays readable with the same keys, and running the command again resumes,
    skipping what is already under --to. Sessions held by a running agent are
    refused (exit 5): run again later. Rewriting a session folds its redactions
    in and renews its TTL.

    \b
    With --storage, each blob not under --to is written again on condition that
    it is unchanged since it was read; a blob a running snapshot manager replaced
    meanwhile is left as it wrote it (counted as changed), and such a manager's
    next save reports a conflict instead of overwriting: rotate while nothing
    writes. Killed, it resumes the same way.

    \b
    With --memory, every user's memories are sealed again, a batch a transaction:
    killed, it resumes when run again.
    """
    cipher = _cipher(keys_file, to)
    if storage_url is not None or memory_url is not None:
        explicit = ctx.get_parameter_source("store_url") is click.core.ParameterSource.COMMANDLINE
        given = [explicit or remembered_store(ctx) is not None, storage_url, memory_url]
        if sum(1 for one in given if one) > 1:
            raise click.UsageError("give one of --store, --storage and --memory")
        if storage_url is not None:
            _rotate_storage(storage_url, cipher, force=force, as_json=as_json)
        else:
            assert memory_url is not None
            _rotate_memory(memory_url, cipher, force=force, as_json=as_json)
        return
    with session_store(store_url, cipher=cipher):
        pass  # a missing store is reported (exit 3) before anything is opened to write
    with progress_bar("re-encrypting", enabled=not as_json) as progress:
        report = run(
            rotate(
                lambda c: open_cli_store(store_url, cipher=c),
                cipher,
                force=force,
                progress=progress,
            )
        )
    if as_json:
        echo_json(report.to_dict())
        return
    click.echo(
        f"{report.sessions_rotated} of {plural(report.sessions_checked, 'session')} and "
        f"{report.checkpoints_rotated} of {plural(report.checkpoints_checked, 'checkpoint')} "
        f"re-encrypted; everything is under key {report.to!r}"
    )


def _rotate_storage(url: str, cipher: Cipher, *, force: bool, as_json: bool) -> None:
    with opened_storage(url):
        pass  # a missing storage is reported (exit 3) before anything is written
    with progress_bar("re-encrypting", enabled=not as_json) as progress:
        report = run(
            rotate_storage_keys(
                lambda c: open_storage(url, cipher=c), cipher, force=force, progress=progress
            )
        )
    if as_json:
        echo_json(report.to_dict())
        return
    changed = f"; {plural(report.blobs_changed, 'blob')} changed meanwhile, left as written"
    click.echo(
        f"{report.blobs_rotated} of {plural(report.blobs_checked, 'blob')} re-encrypted"
        f"{changed if report.blobs_changed else ''}; everything is under key {report.to!r}"
    )


def _rotate_memory(url: str, cipher: Cipher, *, force: bool, as_json: bool) -> None:
    with memory_store(url, "perdure", cipher=cipher) as store:
        users: list[str] = []
        if isinstance(store, LocalMemoryStore):
            rotated = run(store.rotate_keys(force=force))  # every namespace of the file
        else:
            rotated, users = 0, run(store.namespaces())
    for user in users:  # a PostgreSQL memory store rotates one namespace at a time
        with memory_store(url, user, cipher=cipher) as one:
            rotated += run(one.rotate_keys(force=force))
    if as_json:
        echo_json({"to": cipher.active, "memories_rotated": rotated})
        return
    click.echo(
        f"{plural(rotated, 'memory', 'memories')} re-encrypted; everything is under key "
        f"{cipher.active!r}"
    )


def _cipher(keys_file: Path | None, to: str) -> Cipher:
    if keys_file is not None:
        if not keys_file.exists():
            fail(f"--keys-file: no file {str(keys_file)!r}", EXIT_NOT_FOUND)
        found = keys_from_file(keys_file)
    else:
        loaded = keys_from_env()
        if loaded is None:
            raise ValueError(
                "no keys: give --keys-file, or set PERDURE_KEYS or PERDURE_KEYS_FILE "
                "(see perdure rotate-keys --help)"
            )
        found = loaded
    keys, _ = found
    if to not in keys:
        raise ValueError(f"--to: key {to!r} is not among the keys ({sorted(keys)})")
    return AESGCMCipher(keys=keys, active=to)
