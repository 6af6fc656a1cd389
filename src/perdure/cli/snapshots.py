"""``perdure snapshots``: inspect and restore ``SnapshotSessionManager`` storage.

Every command goes through the manager's public async API: a snapshot is restored
into a scratch agent (never run; its model refuses to be called) and read from there,
so what the CLI shows is exactly what an agent would get; ``runs`` reads the runs of
graphs and swarms (:mod:`perdure.multiagent`) as a rebuilt orchestrator does. Damaged
data exits 4, an unknown snapshot, run or storage 3, a malformed id or cursor 2 (see
:mod:`perdure.cli._common`).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import click
from rich.text import Text

from perdure.agent import Agent, ConversationManager
from perdure.agent.conversation.base import SupportsMessages
from perdure.cli._common import (
    EXIT_CORRUPTED,
    EXIT_NOT_FOUND,
    console,
    echo_json,
    env_cipher,
    fail,
    handle_errors,
    json_option,
    run,
)
from perdure.cli.output import (
    field_table,
    format_time,
    new_table,
    note,
    output_format,
    plural,
    print_listing,
    print_table,
)
from perdure.cli.render import rich_message, shorten
from perdure.cli.runs import run_row, show_run
from perdure.errors import SessionCorruptedError, SnapshotError, StorageError
from perdure.models.stream import ModelStreamEvent
from perdure.multiagent.run import RunState, replay
from perdure.session import SnapshotSessionManager, validate_session_id
from perdure.session.ulid import is_ulid, ulid_timestamp_ms
from perdure.snapshots.io import list_all
from perdure.storage import Storage, open_storage, split_url
from perdure.types import Message, ToolSpec

__all__ = ["snapshots"]

DEFAULT_STORAGE = "file:.perdure/storage"
STORAGE_SCHEMES = ("file", "sqlite", "postgresql", "postgres", "redis", "rediss", "s3")
"""The storages the snapshot commands open (a memory: storage would hold nothing)."""


def strands_hint(url: str) -> str:
    """When ``url`` is a folder the Strands SDK wrote, how to import it (else ``""``).

    perdure's snapshots do not read Strands' layout (``session/<id>/scopes/…`` of a
    ``SnapshotSessionManager``, ``session_<id>/agents/…`` of a ``FileSessionManager``);
    ``perdure migrate strands`` converts both.
    """
    try:
        scheme, path = split_url(url, STORAGE_SCHEMES, "storage")
    except ValueError:
        return ""
    if scheme != "file" or path is None or not path.is_dir():
        return ""
    snapshot_layout = any((path / "session").glob("*/scopes/agent/*/snapshots"))
    log_layout = any(path.glob("session_*/agents/agent_*"))
    if not (snapshot_layout or log_layout):
        return ""
    return (
        f"; {str(path)!r} holds sessions written by the Strands Agents SDK: import them "
        f"with perdure migrate strands {path} --to STORE"
    )


@contextlib.contextmanager
def _opened(url: str) -> Iterator[Storage]:
    """Open ``--storage`` for a command: a bad URL exits 2, a missing one 3.

    A ``postgresql://`` schema without the storage's table is missing too, and so is
    an ``s3://`` bucket that does not exist: reading commands never make them.
    """
    try:
        scheme, path = split_url(url, STORAGE_SCHEMES, "storage")
        storage = open_storage(url, cipher=env_cipher())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--storage") from None
    try:
        if scheme in ("file", "sqlite") and path is not None and not path.exists():
            fail(f"no snapshot storage at {path} (--storage {url})", EXIT_NOT_FOUND)
        if scheme == "s3":
            try:
                run(storage.list("", limit=1))
            except StorageError as exc:
                if exc.details.get("kind") != "no_bucket":
                    raise
                fail(f"no snapshot storage at {url} (no such bucket)", EXIT_NOT_FOUND)
        schema_exists = getattr(storage, "schema_exists", None)  # a server storage
        if schema_exists is not None and not run(schema_exists()):
            fail(f"no snapshot storage at {url} (no perdure table in its schema)", EXIT_NOT_FOUND)
        yield storage
    finally:
        close = getattr(storage, "close", None)
        if callable(close):
            close()


class _InertModel:
    """The model of the scratch agents: the CLI moves snapshots, it never runs a turn."""

    async def stream(
        self,
        messages: list[Message],
        *,
        tool_specs: list[ToolSpec],
        system_prompt: str | None,
    ) -> AsyncIterator[ModelStreamEvent]:
        raise RuntimeError("the perdure CLI's scratch agent cannot call a model")
        yield  # pragma: no cover  # makes this an async generator


class _StoredManagerState(ConversationManager):
    """Takes whatever conversation-manager state a snapshot holds and gives it back.

    A scratch agent does not know which manager the real agent used; this one
    accepts any state (so restoring never fails on a manager name) and saves it back
    unchanged (so ``restore`` rewrites ``latest`` with the snapshot's own state).
    """

    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, Any] | None = None

    def apply_management(self, agent: SupportsMessages) -> None:
        """Never runs (the scratch agent runs no turn)."""

    def reduce_context(self, agent: SupportsMessages, exception: Exception | None = None) -> None:
        """Never runs (the scratch agent runs no turn)."""

    def get_state(self) -> dict[str, Any]:
        if self.state is None:
            return super().get_state()
        return copy.deepcopy(self.state)

    def restore_from_session(self, state: dict[str, Any]) -> list[Message] | None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        self.state = copy.deepcopy(state)
        count = state.get("removed_message_count", 0)
        self.removed_message_count = count if isinstance(count, int) else 0
        return None


def _scratch_agent(agent_id: str) -> Agent:
    return Agent(model=_InertModel(), agent_id=agent_id, conversation_manager=_StoredManagerState())


async def _load(
    manager: SnapshotSessionManager, agent_id: str, snapshot_id: str | None
) -> Agent | None:
    """The snapshot (``None``: ``latest``) restored into a scratch agent, or ``None``."""
    agent = _scratch_agent(agent_id)
    found = await manager.restore_snapshot(agent, snapshot_id=snapshot_id)
    return agent if found else None


def _created_at(snapshot_id: str) -> str:
    moment = _dt.datetime.fromtimestamp(ulid_timestamp_ms(snapshot_id) / 1000, _dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _damage(exc: SessionCorruptedError | SnapshotError) -> str:
    return f"{exc.message} [{exc.code}]"


# ----------------------------------------------------------------- commands

storage_option = click.option(
    "--storage",
    "storage_url",
    envvar="PERDURE_STORAGE",
    default=DEFAULT_STORAGE,
    show_default=True,
    metavar="URL",
    help=(
        "The snapshot storage: file:DIR, sqlite:PATH, "
        "postgresql://USER@HOST/DB[?schema=NAME&table=NAME], "
        "redis://HOST:PORT/DB[?prefix=PREFIX] or "
        "s3://BUCKET/PREFIX[?endpoint_url=URL&region=NAME] (credentials from the AWS_* "
        "environment) (env PERDURE_STORAGE)."
    ),
)
agent_option = click.option(
    "--agent",
    "agent_id",
    default="default",
    show_default=True,
    metavar="ID",
    help="The agent's id inside the session.",
)


def _session_argument(value: str) -> str:
    try:
        return validate_session_id(value, "SESSION")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SESSION") from None


def _snapshot_argument(value: str) -> str:
    if not is_ulid(value):
        raise click.BadParameter(
            f"{value!r} is not a snapshot id (a 26-character upper-case ULID) or 'latest'",
            param_hint="SNAPSHOT",
        )
    return value


@click.group()
def snapshots() -> None:
    """Inspect and restore SnapshotSessionManager snapshots (any --storage URL)."""


@snapshots.command("list")
@click.argument("session_id", metavar="SESSION")
@storage_option
@agent_option
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most N snapshots.")
@click.option("--after", "after", metavar="ULID", default=None, help="Start after this id.")
@json_option
@handle_errors
def list_command(
    session_id: str,
    storage_url: str,
    agent_id: str,
    limit: int | None,
    after: str | None,
    as_json: bool,
) -> None:
    """List a session's immutable snapshots, oldest first, with time and message count."""
    session_id = _session_argument(session_id)
    with _opened(storage_url) as storage:
        manager = SnapshotSessionManager(session_id, storage=storage)
        probe = _scratch_agent(agent_id)
        ids = run(manager.list_snapshot_ids(probe, limit=limit, start_after=after))
        rows: list[dict[str, Any]] = []
        damaged = False
        for snapshot_id in ids:
            row: dict[str, Any] = {
                "snapshot_id": snapshot_id,
                "created_at": _created_at(snapshot_id),
            }
            try:
                agent = run(_load(manager, agent_id, snapshot_id))
            except (SessionCorruptedError, SnapshotError) as exc:
                row["message_count"] = None
                row["error"] = _damage(exc)
                damaged = True
            else:
                row["message_count"] = None if agent is None else len(agent.messages)
            rows.append(row)
        latest: dict[str, Any] | None
        try:
            found = run(_load(manager, agent_id, None))
        except (SessionCorruptedError, SnapshotError) as exc:
            latest, damaged = {"message_count": None, "error": _damage(exc)}, True
        else:
            latest = None if found is None else {"message_count": len(found.messages)}
    if not rows and latest is None and after is None:
        fail(
            f"session {session_id!r} has no snapshots for agent {agent_id!r}"
            + strands_hint(storage_url),
            EXIT_NOT_FOUND,
        )
    full_page = bool(rows) and limit is not None and len(rows) == limit
    next_cursor = rows[-1]["snapshot_id"] if full_page else None
    if as_json:
        echo_json(
            {
                "session_id": session_id,
                "agent_id": agent_id,
                "snapshots": rows,
                "latest": latest,
                "next_cursor": next_cursor,
            }
        )
    else:
        table = new_table(title=f"snapshots of {session_id} (agent {agent_id})")
        for column in ("#", "snapshot id", "created", "messages"):
            table.add_column(column, justify="right" if column in ("#", "messages") else "left")
        for number, row in enumerate(rows, start=1):
            count = row.get("error") or str(row["message_count"])
            table.add_row(
                str(number),
                row["snapshot_id"],
                format_time(row["created_at"]),
                Text(count),
                end_section=False,
            )
        print_table(table)
        if latest is None:
            note("snapshot_latest: none")
        else:
            shown = latest.get("error") or plural(latest["message_count"], "message")
            note(f"snapshot_latest: {shown}")
        if next_cursor:
            note(f"more: --after {next_cursor}", "dim")
    if damaged:
        fail("some snapshots are damaged (see above)", EXIT_CORRUPTED)


@snapshots.command("show")
@click.argument("session_id", metavar="SESSION")
@click.argument("snapshot_id", metavar="[SNAPSHOT|latest]", default="latest")
@storage_option
@agent_option
@click.option(
    "--messages",
    "last",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many of the last messages to show.",
)
@json_option
@handle_errors
def show(
    session_id: str, snapshot_id: str, storage_url: str, agent_id: str, last: int, as_json: bool
) -> None:
    """Show one snapshot: its fields, state keys and last messages (images named, not dumped)."""
    session_id = _session_argument(session_id)
    wanted = None if snapshot_id == "latest" else _snapshot_argument(snapshot_id)
    with _opened(storage_url) as storage:
        manager = SnapshotSessionManager(session_id, storage=storage)
        agent = run(_load(manager, agent_id, wanted))
    if agent is None:
        fail(
            f"session {session_id!r} has no snapshot {snapshot_id!r} for agent {agent_id!r}",
            EXIT_NOT_FOUND,
        )
        return
    messages = agent.messages
    tail = messages[len(messages) - last :] if last else []
    manager_state = agent.conversation_manager.get_state()
    info: dict[str, Any] = {
        "session_id": session_id,
        "agent_id": agent_id,
        "snapshot_id": snapshot_id,
        "created_at": _created_at(wanted) if wanted else None,
        "message_count": len(messages),
        "state_keys": sorted(agent.state.get() or {}),
        "conversation_manager_state": manager_state,
        "pending_interrupts": len(agent.interrupt_state.pending),
        "interrupts_activated": agent.interrupt_state.activated,
        "model_state_keys": sorted(agent.model_state),
        "system_prompt": agent.system_prompt,
        "last_messages": tail,
    }
    if as_json:
        echo_json(info)
        return
    rows = [
        ("agent", agent_id),
        ("created", format_time(info["created_at"]) or "—"),
        ("messages", str(len(messages))),
        ("state keys", ", ".join(info["state_keys"]) or "—"),
        ("conversation manager", json.dumps(manager_state, ensure_ascii=False)),
        ("pending interrupts", str(info["pending_interrupts"])),
        ("model state keys", ", ".join(info["model_state_keys"]) or "—"),
    ]
    if agent.system_prompt is not None:
        rows.append(("system prompt", shorten(agent.system_prompt)))
    table = field_table(f"snapshot {snapshot_id} of {session_id}", rows)
    first = len(messages) - len(tail)
    if output_format() != "table":
        # Piped, the last messages are rows of the table (one line each): stdout stays
        # one table, and the content stays on it.
        for index, message in enumerate(tail, start=first):
            table.add_row(Text(f"message {index}"), rich_message(message, index))
        print_table(table)
        return
    print_table(table)
    if tail:
        note(f"last {len(tail)} of {plural(len(messages), 'message')}:")
        for index, message in enumerate(tail, start=first):
            note(rich_message(message, index))


@snapshots.command("restore")
@click.argument("session_id", metavar="SESSION")
@click.argument("snapshot_id", metavar="SNAPSHOT")
@storage_option
@agent_option
@click.option(
    "--no-backup",
    is_flag=True,
    help="Do not keep the current snapshot_latest as an immutable snapshot first.",
)
@json_option
@handle_errors
def restore(
    session_id: str,
    snapshot_id: str,
    storage_url: str,
    agent_id: str,
    no_backup: bool,
    as_json: bool,
) -> None:
    """Make an immutable snapshot the session's snapshot_latest (stop the agent first).

    The current snapshot_latest is first kept as a new immutable snapshot (unless
    --no-backup), so the restore can be undone with another restore.
    """
    session_id = _session_argument(session_id)
    with _opened(storage_url) as storage:
        manager = SnapshotSessionManager(session_id, storage=storage)
        _snapshot_argument(snapshot_id)  # before anything is written
        target = run(_load(manager, agent_id, snapshot_id))
        if target is None:
            fail(
                f"session {session_id!r} has no snapshot {snapshot_id!r} for agent {agent_id!r}",
                EXIT_NOT_FOUND,
            )
            return
        before = run(_load(manager, agent_id, None))
        backup = None
        if before is not None and not no_backup:
            backup = run(manager.save_snapshot(before, is_latest=False))
        run(manager.save_snapshot(target, is_latest=True))
    old_messages = [] if before is None else before.messages
    old_state: dict[str, Any] = {} if before is None else before.state.get() or {}
    new_state: dict[str, Any] = target.state.get() or {}
    kept = 0
    for old, new in zip(old_messages, target.messages, strict=False):
        if old != new:
            break
        kept += 1
    change: dict[str, Any] = {
        "session_id": session_id,
        "agent_id": agent_id,
        "restored": snapshot_id,
        "backup_snapshot_id": backup,
        "messages_before": len(old_messages),
        "messages_after": len(target.messages),
        "messages_unchanged": kept,
        "state_added": sorted(set(new_state) - set(old_state)),
        "state_removed": sorted(set(old_state) - set(new_state)),
        "state_changed": sorted(
            k for k in set(old_state) & set(new_state) if old_state[k] != new_state[k]
        ),
    }
    if as_json:
        echo_json(change)
        return
    out = console()
    lines = [
        f"snapshot_latest of {session_id} (agent {agent_id}) is now snapshot {snapshot_id}",
        f"messages: {change['messages_before']} → {change['messages_after']} "
        f"(first {kept} unchanged)",
    ]
    for key in ("added", "removed", "changed"):
        names = change[f"state_{key}"]
        if names:
            lines.append(f"state {key}: {', '.join(names)}")
    if backup:
        lines.append(f"the previous snapshot_latest was kept as snapshot {backup}")
    elif before is None:
        lines.append("there was no snapshot_latest before")
    for line in lines:
        out.print(line, markup=False)


# ------------------------------------------------------------------ runs


async def _run_ids(storage: Storage, session_id: str) -> list[str]:
    """The ids of the orchestrators with a run stored in the session, sorted."""
    prefix = f"sessions/{session_id}/multi_agents/"
    keys = await list_all(storage, prefix)
    return sorted(
        {key[len(prefix) : -len("/latest")] for key in keys if key.endswith("/latest")} - {""}
    )


@snapshots.command("runs")
@click.argument("session_id", metavar="SESSION")
@click.argument("run_id", metavar="[RUN]", required=False)
@storage_option
@json_option
@handle_errors
def runs(session_id: str, run_id: str | None, storage_url: str, as_json: bool) -> None:
    """List a session's graph and swarm runs, or show one: done, next, shared state.

    A run is what a Graph or Swarm saves after its nodes (its id: the graph_id or
    swarm_id); a rebuilt orchestrator resumes it at the nodes shown as next.
    """
    session_id = _session_argument(session_id)
    if run_id is not None:
        try:
            validate_session_id(run_id, "RUN")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="RUN") from None
    with _opened(storage_url) as storage:
        manager = SnapshotSessionManager(session_id, storage=storage)
        ids = [run_id] if run_id is not None else run(_run_ids(storage, session_id))
        found: list[tuple[str, RunState | SessionCorruptedError, list[dict[str, Any]]]] = []
        for one in ids:
            where = f"sessions/{session_id}/multi_agents/{one}/latest"
            try:
                records = run(manager.restore_multi_agent(one))
                if records is None:
                    continue
                found.append((one, replay(records, where), records))
            except SessionCorruptedError as exc:
                found.append((one, exc, []))
    if run_id is not None:
        if not found:
            fail(f"session {session_id!r} has no run {run_id!r}", EXIT_NOT_FOUND)
        _, state, records = found[0]
        if isinstance(state, SessionCorruptedError):
            raise state
        show_run(session_id, run_id, state, records, as_json)
        return
    damaged = False
    rows: list[dict[str, Any]] = []
    for one, state, _ in found:
        if isinstance(state, SessionCorruptedError):
            damaged = True
            rows.append({"run_id": one, "error": _damage(state), "damaged": True})
        else:
            rows.append(run_row(one, state))
    if as_json:
        echo_json({"session_id": session_id, "runs": rows})
    else:
        table = new_table(
            "run", "kind", "status", "done", "next", "task", title=f"runs of {session_id}"
        )
        for row in rows:
            if row.get("damaged"):
                table.add_row(row["run_id"], "", "damaged", "", "", Text(row["error"]))
                continue
            table.add_row(
                row["run_id"],
                row["kind"],
                row["status"],
                str(len(row["completed"])),
                ", ".join(row["pending"]) or "—",
                Text(shorten(row["task"])),
            )
        print_listing(table, f"session {session_id!r} has no graph or swarm runs")
    if damaged:
        fail("some runs are damaged (see above)", EXIT_CORRUPTED)
