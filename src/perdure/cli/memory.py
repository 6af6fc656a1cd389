"""``perdure memory``: inspect and erase the long-term memories of one user.

::

    perdure memory list   --store sqlite:./memory.sqlite --user alice
    perdure memory search "train" --store sqlite:./memory.sqlite --user alice
    perdure memory show 3 --store sqlite:./memory.sqlite --user alice
    perdure memory export --store sqlite:./memory.sqlite --user alice -o alice.jsonl
    perdure memory delete --all --yes --store sqlite:./memory.sqlite --user alice

``--store`` names a memory store: ``sqlite:PATH`` (a :class:`~perdure.memory.LocalMemoryStore`
file) or ``postgresql://USER@HOST/DB?schema=NAME`` (a
:class:`~perdure.memory.PostgresMemoryStore`); ``--user`` is the namespace the
memories were stored under. Every command sees that user's memories only.
``delete --all`` is a user's right to be forgotten in one command: it deletes every
memory of the user and prints how many went and how many are left (0).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from perdure.cli._common import (
    EXIT_NOT_FOUND,
    echo_json,
    env_cipher,
    fail,
    given_store,
    handle_errors,
    json_option,
    reads_remembered_store,
    run,
)
from perdure.cli.output import format_time, new_table, note, plural, print_listing, print_table
from perdure.cli.render import shorten
from perdure.crypto import Cipher
from perdure.memory import MemoryEntry
from perdure.memory.urls import open_memory_store

PAGE = 500
"""Memories read per store call when a command must see them all."""


@reads_remembered_store
def _resolve_memory_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    found = given_store(ctx, param, value)
    if found is None:
        raise click.UsageError(
            "--store: name the memory store (sqlite:PATH or postgresql://USER@HOST/DB?schema=NAME)"
        )
    return found


memory_store_option = click.option(
    "--store",
    "-s",
    "store_url",
    envvar="PERDURE_MEMORY_STORE",
    default=None,
    metavar="URL",
    callback=_resolve_memory_store,
    help=(
        "The memory store: sqlite:PATH or postgresql://USER@HOST/DB[?schema=NAME] "
        "(env PERDURE_MEMORY_STORE); may also come before the command."
    ),
)
user_option = click.option(
    "--user", "-u", required=True, metavar="USER", help="Whose memories (the store's namespace)."
)


@contextlib.contextmanager
def memory_store(url: str, user: str, *, cipher: Cipher | None = None) -> Iterator[Any]:
    """Open the memory store ``url`` for ``user``'s namespace, and close it afterwards.

    Every ``perdure memory`` command reads (or deletes from) a store that is there:
    one that is not — a ``sqlite:`` path with no file, or a file or ``postgresql://``
    schema without perdure's memory tables — is reported (exit 3, as ``--store`` of
    the session commands), and nothing is created. The store is opened with
    ``cipher``, else with the keys in the environment (:func:`env_cipher`), so an
    encrypted store reads as every other command's does.

    Raises:
        ValueError: an unknown scheme, or a path missing.
    """
    try:
        store = open_memory_store(
            url, namespace=user, cipher=cipher if cipher is not None else env_cipher()
        )
    except ValueError as exc:
        raise ValueError(
            f"--store: {url!r} is not a memory store URL ({exc}); use sqlite:PATH or "
            "postgresql://USER@HOST/DB?schema=NAME"
        ) from None
    try:
        if not run(store.schema_exists()):
            path = getattr(store, "path", None)
            missing = isinstance(path, Path) and not path.exists()
            where = str(path) if isinstance(path, Path) else url
            found = "no such file" if missing else "no perdure memory tables in it"
            fail(f"no memory store at {where} ({found})", EXIT_NOT_FOUND)
        yield store
    finally:
        store.close()


def require_memory_store(url: str) -> None:
    """Exit 3 (``no memory store at …``) unless ``url`` names a memory store that is
    there (``perdure serve --memory``); creates nothing."""
    with memory_store(url, "perdure"):  # any namespace: only the tables are looked for
        pass


async def all_memories(store: Any) -> list[MemoryEntry]:
    """Every memory of the store's namespace, oldest first."""
    found: list[MemoryEntry] = []
    while True:
        page = await store.list(limit=PAGE, offset=len(found))
        found.extend(page)
        if len(page) < PAGE:
            return found


def memory_id(entry: MemoryEntry) -> int | None:
    """The store's id of ``entry`` (``metadata["memory_id"]``)."""
    value = (entry.metadata or {}).get("memory_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def memory_json(entry: MemoryEntry) -> dict[str, Any]:
    """``entry`` as JSON for scripts and exports: id, content, created, metadata, score."""
    metadata = dict(entry.metadata or {})
    created = metadata.pop("created_at", None)
    metadata.pop("memory_id", None)
    return {
        "memory_id": memory_id(entry),
        "content": entry.content,
        "created_at": _iso(created),
        "metadata": metadata,
        **({"score": entry.score} if entry.score is not None else {}),
    }


def _iso(created: Any) -> str | None:
    if isinstance(created, int | float) and not isinstance(created, bool):
        return format_time(_dt.datetime.fromtimestamp(created, _dt.UTC).isoformat())
    return created if isinstance(created, str) else None


def _table(entries: list[MemoryEntry], nothing: str, *, scored: bool = False) -> None:
    table = new_table("id", "created", "content")
    if scored:
        table.add_column("score", justify="right")
    for entry in entries:
        data = memory_json(entry)
        score = [f"{entry.score:.3f}" if entry.score is not None else "-"] if scored else []
        table.add_row(
            str(data["memory_id"]), data["created_at"] or "-", shorten(entry.content), *score
        )
    print_listing(table, nothing)


@click.group()
def memory() -> None:
    """Inspect, export and erase the long-term memories of one user.

    --store must name a memory store that is there: a path with no file, or a
    file or PostgreSQL schema without perdure's memory tables, is an error (exit
    3), and nothing is created.
    """


@memory.command("list")
@memory_store_option
@user_option
@click.option("--limit", type=int, default=100, show_default=True, help="Show at most this many.")
@click.option("--offset", type=int, default=0, show_default=True, help="Skip this many first.")
@json_option
@handle_errors
def list_memories(store_url: str, user: str, limit: int, offset: int, as_json: bool) -> None:
    """List a user's memories, oldest first: id, creation time (UTC), content."""
    with memory_store(store_url, user) as store:
        entries = run(store.list(limit=limit, offset=offset))
        total = run(store.count())
    if as_json:
        echo_json({"user": user, "total": total, "memories": [memory_json(e) for e in entries]})
        return
    _table(entries, f"no memories for user {user!r}" + (f" from offset {offset}" if offset else ""))
    if offset + len(entries) < total:
        more = offset + len(entries)
        note(f"{plural(total, 'memory', 'memories')} in all: more with --offset {more}")


@memory.command("search")
@click.argument("query")
@memory_store_option
@user_option
@click.option("--limit", type=int, default=10, show_default=True, help="Return at most this many.")
@json_option
@handle_errors
def search_memories(query: str, store_url: str, user: str, limit: int, as_json: bool) -> None:
    """Search a user's memories as the agent would (best first)."""
    with memory_store(store_url, user) as store:
        entries = run(store.search(query, limit=limit))
    if as_json:
        echo_json({"user": user, "query": query, "memories": [memory_json(e) for e in entries]})
        return
    _table(entries, f"no memories of user {user!r} match {query!r}", scored=True)


@memory.command("show")
@click.argument("memory_ids", metavar="ID", type=int)
@memory_store_option
@user_option
@json_option
@handle_errors
def show_memory(memory_ids: int, store_url: str, user: str, as_json: bool) -> None:
    """Show one memory whole: its content and metadata."""
    with memory_store(store_url, user) as store:
        entries = run(all_memories(store))
    found = next((e for e in entries if memory_id(e) == memory_ids), None)
    if found is None:
        fail(f"user {user!r} has no memory {memory_ids}", EXIT_NOT_FOUND)
    data = memory_json(found)
    if as_json:
        echo_json(data)
        return
    table = new_table(show_header=False)
    table.add_column()
    table.add_column()
    table.add_row("id", str(data["memory_id"]))
    table.add_row("created", data["created_at"] or "-")
    for key, value in sorted(data["metadata"].items()):
        table.add_row(key, json.dumps(value, ensure_ascii=False))
    table.add_row("content", found.content)
    print_table(table)


@memory.command("export")
@memory_store_option
@user_option
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file (default: standard output).",
)
@handle_errors
def export_memories(store_url: str, user: str, output: Path | None) -> None:
    """Export a user's memories as JSON lines (one memory a line, oldest first)."""
    with memory_store(store_url, user) as store:
        entries = run(all_memories(store))
    text = "".join(json.dumps(memory_json(e), ensure_ascii=False) + "\n" for e in entries)
    if output is None:
        click.echo(text, nl=False)
        return
    from perdure._runtime.fs import atomic_write

    atomic_write(output, text.encode())
    click.echo(
        f"exported {plural(len(entries), 'memory', 'memories')} of user {user!r} to {output}",
        err=True,
    )


@memory.command("delete")
@click.argument("memory_ids", metavar="[ID]...", type=int, nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Delete every memory of the user.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@memory_store_option
@user_option
@json_option
@handle_errors
def delete_memories(
    memory_ids: tuple[int, ...],
    everything: bool,
    yes: bool,
    store_url: str,
    user: str,
    as_json: bool,
) -> None:
    """Delete memories by id, or --all of a user's (the right to be forgotten).

    Prints how many were deleted and how many the user has left.
    """
    if everything == bool(memory_ids):
        raise ValueError("name memory ids to delete, or --all (not both)")
    with memory_store(store_url, user) as store:
        if not yes:
            held = plural(run(store.count()), "memory", "memories")
            what = (
                f"every memory of user {user!r} ({held})"
                if everything
                else f"{plural(len(memory_ids), 'memory', 'memories')} of user {user!r}"
            )
            click.confirm(f"delete {what}?", abort=True, err=True)
        deleted = run(store.clear()) if everything else run(store.delete(list(memory_ids)))
        left = run(store.count())
    if as_json:
        echo_json({"user": user, "deleted": deleted, "remaining": left})
        return
    click.echo(
        f"deleted {plural(deleted, 'memory', 'memories')} of user {user!r}; "
        f"{plural(left, 'memory', 'memories')} left"
    )
