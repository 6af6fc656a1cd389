"""``perdure sessions``: list, show, page through and delete stored sessions.

::

    perdure sessions list --store sqlite:./perdure.db
    perdure sessions show s1
    perdure sessions history s1 --offset 40 --limit 20
    perdure sessions delete s1 --yes

Listing reads metadata only, never content. History pages never split a tool call
from its result (the same rule as :func:`perdure.session.read_history_page`), and
show images and documents by kind and size, never their bytes. Every command takes
``--store URL`` (default ``file:.perdure``, or ``$PERDURE_STORE``) and ``--json``.

Reading commands never create a store: a ``file:`` directory or ``sqlite:`` file that
does not exist is reported (exit 3) instead of being made empty.
"""

from __future__ import annotations

import fnmatch
import json
import time

import click
from rich.table import Table
from rich.text import Text

from perdure.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_PROBLEM,
    console,
    echo_json,
    fail,
    handle_errors,
    json_option,
    run,
    session_store,
    store_option,
    to_jsonable,
)
from perdure.cli.gc import human_duration
from perdure.cli.ops import (
    describe_session,
    expires_in,
    message_count,
    read_history,
    session_checkpoints,
    session_dict,
    state_summary,
)
from perdure.cli.output import (
    new_table,
    note,
    plural,
    print_listing,
    print_table,
    terminal_safe,
)
from perdure.cli.render import format_time, rich_message
from perdure.cli.runs import show_run
from perdure.multiagent.persist import session_run_records
from perdure.multiagent.run import RUN_FORMAT, replay
from perdure.session import (
    DamagedCheckpoint,
    Session,
    SessionMeta,
    SessionStore,
)
from perdure.session.expiry import epoch_of
from perdure.types import Message

DEFAULT_PAGE = 20
"""Messages per history page unless ``--limit`` says otherwise."""

DEFAULT_LIST = 100
"""Sessions per listing unless ``--limit`` says otherwise."""

SORTS = ("id", "updated", "created")
"""The orders of ``sessions list --sort``."""

LIST_BATCH = 1000
"""Sessions read per store call when a listing must see them all (--sort, --match)."""


def check_positive(name: str, value: int) -> int:
    """Return ``value`` if it is at least 1, else raise ``ValueError`` naming the option."""
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


@click.group()
def sessions() -> None:
    """List, show, page through and delete sessions."""


@sessions.command("list")
@click.option(
    "--sort",
    type=click.Choice(SORTS),
    default="id",
    show_default=True,
    help="Order: by id, or newest first by last update or creation.",
)
@click.option(
    "--limit",
    type=int,
    default=DEFAULT_LIST,
    show_default=True,
    help="Show at most this many sessions.",
)
@click.option(
    "--after", metavar="ID", default=None, help="Start after this session id (in --sort order)."
)
@click.option("--match", metavar="GLOB", default=None, help="Only ids matching GLOB ('user-*').")
@store_option
@json_option
@handle_errors
def list_sessions(
    sort: str, limit: int, after: str | None, match: str | None, store_url: str, as_json: bool
) -> None:
    """List sessions: metadata only, never content.

    Shows id, created, updated (UTC) and message count; sorted by id unless --sort
    says otherwise; page with --after, filter ids with --match. A damaged session is
    listed too, marked damaged (`perdure verify` says how). In a store with a ttl
    (file:DIR?ttl=3600, …), the time left before each session expires unless used
    (JSON: "expires_at" and "expires_in" seconds); expired sessions are not listed.
    """
    check_positive("--limit", limit)
    with session_store(store_url) as store:
        if sort == "id" and match is None:
            found = run(store.list(limit=limit + 1, after=after))
        else:
            found = select_sessions(run(_list_all(store)), sort=sort, after=after, match=match)
    shown, more = found[:limit], len(found) > limit
    next_after = shown[-1].session_id if more else None
    if as_json:
        now = time.time()
        listed = [to_jsonable(session_dict(meta, now)) for meta in shown]
        echo_json({"sessions": listed, "next_after": next_after})
        return
    print_listing(_sessions_table(shown), "no sessions" + (f" after {after!r}" if after else ""))
    damaged = sum(1 for meta in shown if meta.damaged is not None)
    if damaged:
        note(
            f"{plural(damaged, 'session')} damaged: "
            f"perdure verify --store {store_url} tells what and where",
            "red",
        )
    if next_after is not None:
        again = "" if sort == "id" else f" --sort {sort}"
        note(f"more: --after {next_after}{again}", "dim")


def select_sessions(
    metas: list[SessionMeta], *, sort: str, after: str | None, match: str | None
) -> list[SessionMeta]:
    """``metas`` filtered by the glob ``match``, in ``sort`` order, from after id ``after``.

    ``id`` sorts ascending; ``updated`` and ``created`` newest first, ties by id. With
    an order other than ``id``, ``after`` must name a listed session (the position
    it names is that session's place in the order).

    Raises:
        ValueError: ``sort`` is unknown, or ``after`` is not in the listing.
    """
    if sort not in SORTS:
        raise ValueError(f"--sort must be one of {', '.join(SORTS)}, got {sort!r}")
    chosen = [m for m in metas if match is None or fnmatch.fnmatchcase(m.session_id, match)]
    if sort == "id":
        chosen.sort(key=lambda m: m.session_id)
        return [m for m in chosen if after is None or m.session_id > after]
    field = "updated_at" if sort == "updated" else "created_at"
    chosen.sort(key=lambda m: m.session_id)
    chosen.sort(key=lambda m: _epoch(getattr(m, field)), reverse=True)  # stable: ties by id
    if after is None:
        return chosen
    ids = [m.session_id for m in chosen]
    if after not in ids:
        raise ValueError(f"--after: no session {after!r} in this listing (--sort {sort})")
    return chosen[ids.index(after) + 1 :]


def _epoch(iso: str) -> float:
    """Seconds since the epoch of a stored time; an unreadable one sorts last."""
    at = epoch_of(iso) if iso else None
    return float("-inf") if at is None else at


async def _list_all(store: SessionStore) -> list[SessionMeta]:
    """Every session's metadata, read page by page (metadata only, never content)."""
    found: list[SessionMeta] = []
    after: str | None = None
    while True:
        page = await store.list(limit=LIST_BATCH, after=after)
        found.extend(page)
        if len(page) < LIST_BATCH:
            return found
        after = page[-1].session_id


@sessions.command("show")
@click.argument("session_id", metavar="ID")
@store_option
@json_option
@handle_errors
def show_session(session_id: str, store_url: str, as_json: bool) -> None:
    """Show a session: metadata, state, checkpoints.

    The agent state is summarised (key names and counts), never its values.
    """
    with session_store(store_url) as store:
        if as_json:
            echo_json(run(describe_session(store, session_id)))
            return
        record = run(store.get(session_id))
        checkpoints = run(session_checkpoints(Session(store, session_id)))
    damaged = sum(isinstance(c, DamagedCheckpoint) for c in checkpoints)
    meta = record.meta
    summary = state_summary(record.agent_state)
    table = new_table(show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("session", meta.session_id),
        ("created", format_time(meta.created_at)),
        ("updated", format_time(meta.updated_at)),
        ("messages", str(meta.message_count)),
    ]
    if record.agent_state:
        keys = summary["state_keys"]
        rows += [
            ("agent", str(summary["agent_id"])),
            ("state", plural(len(keys), "key") + (f": {', '.join(keys)}" if keys else "")),
            (
                "conversation",
                f"{summary['conversation_manager']}, "
                f"{plural(summary['removed_message_count'], 'message')} removed",
            ),
            ("interrupts", f"{summary['interrupts']} pending"),
        ]
    else:
        rows.append(("agent state", "none stored yet"))
    latest = f" (latest {checkpoints[-1].checkpoint_id})" if checkpoints else ""
    marked = f", {damaged} damaged" if damaged else ""
    rows.append(("checkpoints", f"{len(checkpoints)}{latest}{marked}"))
    for key, value in rows:
        table.add_row(Text(key), Text(value))
    print_table(table)


@sessions.command("history")
@click.argument("session_id", metavar="ID")
@click.option("--offset", type=int, default=0, show_default=True, help="First message index.")
@click.option(
    "--limit",
    type=int,
    default=DEFAULT_PAGE,
    show_default=True,
    help="Messages per page (a page may grow by one to keep a tool call with its result).",
)
@click.option("--all", "read_all", is_flag=True, help="Every message from --offset to the end.")
@store_option
@json_option
@handle_errors
def history(
    session_id: str, offset: int, limit: int, read_all: bool, store_url: str, as_json: bool
) -> None:
    """Page through a session's messages.

    Tool calls show as ⚙ name(args), results as ↳ …, images and documents
    by kind and size. A page never splits a tool call from its result.
    """
    check_positive("--limit", limit)
    with session_store(store_url) as store:
        page = run(read_history(store, session_id, offset, limit, read_all))
    if as_json:
        echo_json(
            {
                "session_id": session_id,
                "offset": page.offset,
                "next_offset": page.next_offset,
                "total": page.total,
                "messages": page.messages,
            }
        )
        return
    out = console()
    if not page.messages:
        click.echo(f"session {session_id}: no messages at offset {offset} of {page.total}")
        return
    last = page.offset + len(page.messages) - 1
    shown = terminal_safe(session_id, "")
    out.print(Text(f"session {shown}: messages {page.offset}–{last} of {page.total}", "bold"))
    for index, message in enumerate(page.messages, start=page.offset):
        out.print(rich_message(message, index), soft_wrap=True)
    if page.next_offset < page.total:
        out.print(Text(f"more: --offset {page.next_offset}", "dim"))


@sessions.command("run")
@click.argument("session_id", metavar="ID")
@store_option
@json_option
@handle_errors
def show_run_command(session_id: str, store_url: str, as_json: bool) -> None:
    """Show where the graph or swarm run a session holds stands: done, next, shared state.

    A Graph or Swarm given a Session keeps its run as that session's messages, one
    record each; they are read as a rebuilt orchestrator reads them.
    """
    with session_store(store_url) as store:
        record = run(store.get(session_id))
    messages = record.messages
    if not messages or not _starts_a_run(messages[0]):
        fail(
            f"session {session_id!r} holds no graph or swarm run (its first message is not "
            "a run's start record)",
            EXIT_NOT_FOUND,
        )
    records = session_run_records(messages, session_id)
    state = replay(records, f"session {session_id!r}")
    show_run(session_id, None, state, records, as_json)


def _starts_a_run(message: Message) -> bool:
    content = message.get("content")
    text = content[0].get("text") if isinstance(content, list) and content else None
    if not isinstance(text, str):
        return False
    try:
        first = json.loads(text)
    except ValueError:
        return False
    return isinstance(first, dict) and first.get("t") == "start" and first.get("v") == RUN_FORMAT


@sessions.command("delete")
@click.argument("session_id", metavar="ID")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_option
@json_option
@handle_errors
def delete(session_id: str, yes: bool, store_url: str, as_json: bool) -> None:
    """Delete a session with its checkpoints.

    Asks first unless --yes. Deleting a session that does not exist is fine.
    """
    with session_store(store_url) as store:
        count = run(message_count(store, session_id))
        if count is not None:
            if not yes:
                known = " (damaged)" if count < 0 else f" ({plural(count, 'message')})"
                try:
                    confirmed = click.confirm(
                        f"Delete session {session_id!r}{known} and its checkpoints?",
                        err=True,
                    )
                except click.Abort:
                    confirmed = False
                if not confirmed:
                    fail(
                        "not confirmed; nothing deleted (pass --yes to skip the question)",
                        EXIT_PROBLEM,
                    )
                    return
            run(store.delete(session_id))
    if as_json:
        echo_json({"session_id": session_id, "deleted": count is not None})
    elif count is None:
        click.echo(f"no session {session_id!r}; nothing to delete")
    else:
        click.echo(f"deleted session {session_id!r}")


def _sessions_table(metas: list[SessionMeta]) -> Table:
    table = new_table()
    table.add_column("id", no_wrap=True)
    table.add_column("created", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    table.add_column("messages", justify="right")
    with_ttl = any(meta.expires_at is not None for meta in metas)
    if with_ttl:
        table.add_column("expires in", justify="right", no_wrap=True)
    now = time.time()
    for meta in metas:
        if meta.damaged is not None:
            table.add_row(
                Text(meta.session_id),
                *(Text(format_time(t) or "-", "dim") for t in (meta.created_at, meta.updated_at)),
                Text("damaged", "red"),
                *([Text("-", "dim")] if with_ttl else []),
            )
            continue
        cells = (meta.session_id, format_time(meta.created_at), format_time(meta.updated_at))
        left = expires_in(meta, now)
        expiry = [Text("-" if left is None else human_duration(left))] if with_ttl else []
        table.add_row(*map(Text, cells), Text(str(meta.message_count)), *expiry)
    return table
