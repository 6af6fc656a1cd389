"""Migration from LangGraph's ``SqliteSaver`` database into another checkpoint saver.

``perdure migrate langgraph --from sqlite:./lg.db --to URL`` copies every thread of a
``SqliteSaver`` file into :class:`~perdure.adapters.langgraph.PerdureSaver` on the
storage ``URL`` names; :func:`migrate_langgraph` does the work and takes any
LangGraph ``BaseCheckpointSaver`` as the target (the CLI builds the ``PerdureSaver``).

The source is opened read-only and read through LangGraph's own ``SqliteSaver`` (so
every format version it reads is read the same way). For each thread, oldest
checkpoint first, in every namespace: the checkpoint is put with its parent, its
metadata and all its channel versions, then its pending writes, task by task with
their ``task_path``. Then the thread is read back from the target, checkpoint by
checkpoint: the checkpoint (values, versions, versions seen, id, time), the metadata,
the parent and the pending writes must equal the source's — and a target that checks
what it reads (``PerdureSaver`` checks every hash) has checked them too. A thread
that fails is deleted from the target again and reported ``failed``, never left half
copied. A thread that already exists in the target is ``skipped`` unless
``overwrite`` (deleted, then copied: not atomic). Nothing is written to the source.

LangGraph is imported when a migration runs (``perdure[langgraph]`` and
``langgraph-checkpoint-sqlite``), not with this module.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perdure.errors import PerdureError
from perdure.migrate.report import (
    MigrationStatus,
    count_status,
    open_readonly_sqlite,
    sqlite_tables,
    status_counts,
)

__all__ = ["LangGraphMigrationReport", "ThreadMigration", "migrate_langgraph"]

_TaskPaths = dict[tuple[str, str, str, str], str]
"""(thread, namespace, checkpoint id, task id) -> the task's ``task_path``."""


@dataclass
class ThreadMigration:
    """What the migration did (or would do) with one LangGraph thread.

    Attributes:
        thread_id: The thread (the same in the source and the target).
        status: See :data:`~perdure.migrate.report.MigrationStatus`.
        reason: Why it was skipped or failed.
        checkpoints: Checkpoints read from the source (every namespace).
        writes: Pending writes read from the source.
        verified: The target was read back and equal to the source.
        notes: Other things worth knowing.
    """

    thread_id: str
    status: MigrationStatus = "imported"
    reason: str | None = None
    checkpoints: int = 0
    writes: int = 0
    verified: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class LangGraphMigrationReport:
    """What :func:`migrate_langgraph` did, thread by thread."""

    source: str
    dry_run: bool
    threads: list[ThreadMigration] = field(default_factory=list)

    def count(self, status: MigrationStatus) -> int:
        """How many threads ended with ``status``."""
        return count_status(self.threads, status)

    @property
    def ok(self) -> bool:
        """No thread failed (skipped threads are fine)."""
        return self.count("failed") == 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary plus every thread."""
        return {
            "source": self.source,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "counts": status_counts(self.threads),
            "threads": [asdict(entry) for entry in self.threads],
        }


def _read_source(
    path: Path,
) -> tuple[Any, sqlite3.Connection, list[str], _TaskPaths]:
    """The source saver, its connection, its thread ids and each task's path (blocking).

    Raises:
        ValueError: not a ``SqliteSaver`` database (the message says why).
        ImportError: LangGraph's SQLite saver is not installed.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = open_readonly_sqlite(path)
    try:
        tables = sqlite_tables(conn, path)
        if not {"checkpoints", "writes"} <= tables:
            raise ValueError(
                f"source {str(path)!r} has no 'checkpoints' and 'writes' tables: not a "
                f"LangGraph SqliteSaver database (tables: {', '.join(sorted(tables)) or 'none'})"
            )
        threads = [
            str(row[0])
            for row in conn.execute("SELECT DISTINCT thread_id FROM checkpoints ORDER BY 1")
        ]
        columns = {row[1] for row in conn.execute("PRAGMA table_info(writes)")}
        path_column = "task_path" if "task_path" in columns else "''"
        paths = {
            (str(t), str(ns), str(cid), str(task)): str(task_path)
            for t, ns, cid, task, task_path in conn.execute(
                f"SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, {path_column} "
                "FROM writes"
            )
        }
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise ValueError(f"source {str(path)!r} cannot be read: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return SqliteSaver(conn), conn, threads, paths


def _source_tuples(saver: Any, thread_id: str) -> list[Any]:
    """Every checkpoint of a thread, every namespace, oldest first (blocking)."""
    found = list(saver.list({"configurable": {"thread_id": thread_id}}))
    found.sort(key=lambda t: (t.config["configurable"]["checkpoint_ns"], t.checkpoint["id"]))
    return found


def _same(source: Any, copy: Any) -> str | None:
    """What differs between a source tuple and its copy read back (None: nothing)."""
    if copy is None:
        return "is missing"
    for name in ("v", "id", "ts", "channel_values", "channel_versions", "versions_seen"):
        if source.checkpoint.get(name) != copy.checkpoint.get(name):
            return f"differs in its checkpoint's {name}"
    if dict(source.metadata) != dict(copy.metadata):
        return "differs in its metadata"
    parent = (source.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    back = (copy.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    if parent != back:
        return "differs in its parent"
    if list(source.pending_writes or []) != list(copy.pending_writes or []):
        return "differs in its pending writes"
    return None


async def _exists(target: Any, thread_id: str) -> bool:
    async for _ in target.alist({"configurable": {"thread_id": thread_id}}, limit=1):
        return True
    return False


async def _copy_thread(
    target: Any, entry: ThreadMigration, tuples: list[Any], paths: _TaskPaths
) -> None:
    for item in tuples:
        conf = item.config["configurable"]
        config: dict[str, Any] = {
            "configurable": {"thread_id": entry.thread_id, "checkpoint_ns": conf["checkpoint_ns"]}
        }
        parent = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        if parent:
            config["configurable"]["checkpoint_id"] = parent
        stored = await target.aput(
            config, item.checkpoint, item.metadata, dict(item.checkpoint["channel_versions"])
        )
        tasks: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in item.pending_writes or []:
            tasks.setdefault(task_id, []).append((channel, value))
        for task_id, writes in tasks.items():
            path = paths.get(
                (entry.thread_id, conf["checkpoint_ns"], item.checkpoint["id"], task_id), ""
            )
            await target.aput_writes(stored, writes, task_id, path)
    for item in tuples:
        conf = item.config["configurable"]
        back = await target.aget_tuple(
            {
                "configurable": {
                    "thread_id": entry.thread_id,
                    "checkpoint_ns": conf["checkpoint_ns"],
                    "checkpoint_id": item.checkpoint["id"],
                }
            }
        )
        why = _same(item, back)
        if why is not None:
            raise _Mismatch(
                f"checkpoint {item.checkpoint['id']} (namespace {conf['checkpoint_ns']!r}) "
                f"read back from the target {why}"
            )
    entry.verified = True


class _Mismatch(Exception):
    """A copied checkpoint read back different from its source."""


async def migrate_langgraph(
    source: str | Path,
    target: Any,
    *,
    dry_run: bool = False,
    overwrite: bool = False,
    progress: Callable[[ThreadMigration, int, int], None] | None = None,
) -> LangGraphMigrationReport:
    """Copy every thread of a LangGraph ``SqliteSaver`` database into ``target``.

    See the module docstring for what is copied, how it is verified and what happens
    to a thread that fails.

    Args:
        source: The ``SqliteSaver`` database file.
        target: A LangGraph ``BaseCheckpointSaver`` with the async methods
            (``aput``, ``aput_writes``, ``aget_tuple``, ``alist``, ``adelete_thread``).
        dry_run: Read everything, write nothing (``would_import``).
        overwrite: Replace threads that exist in ``target`` instead of skipping them.
        progress: Called as ``progress(entry, done, total)`` after each thread.

    Returns:
        The report; ``report.ok`` is false when a thread could not be copied.

    Raises:
        ValueError: ``source`` is not a readable ``SqliteSaver`` database.
        ImportError: ``langgraph-checkpoint-sqlite`` is not installed.
    """
    path = Path(source)
    saver, conn, threads, paths = await asyncio.to_thread(_read_source, path)
    report = LangGraphMigrationReport(source=str(path), dry_run=dry_run)
    try:
        for done, thread_id in enumerate(threads, start=1):
            entry = ThreadMigration(thread_id)
            report.threads.append(entry)
            await _migrate_one(saver, target, entry, paths, dry_run=dry_run, overwrite=overwrite)
            if progress is not None:
                progress(entry, done, len(threads))
    finally:
        conn.close()
    return report


async def _migrate_one(
    saver: Any,
    target: Any,
    entry: ThreadMigration,
    paths: _TaskPaths,
    *,
    dry_run: bool,
    overwrite: bool,
) -> None:
    try:
        tuples = await asyncio.to_thread(_source_tuples, saver, entry.thread_id)
    except Exception as exc:  # the source's own decoding: any error it raises
        entry.status, entry.reason = "failed", f"the source could not be read: {exc}"
        return
    entry.checkpoints = len(tuples)
    entry.writes = sum(len(t.pending_writes or []) for t in tuples)
    try:
        exists = await _exists(target, entry.thread_id)
    except PerdureError as exc:
        entry.status, entry.reason = "failed", f"the target could not be read: {exc}"
        return
    if exists and not overwrite:
        entry.status = "skipped"
        entry.reason = "a thread with this id already exists in the target (use overwrite)"
        return
    if dry_run:
        entry.status = "would_import"
        if exists:
            entry.notes.append("would replace the existing thread")
        return
    try:
        if exists:
            await target.adelete_thread(entry.thread_id)
            entry.notes.append("replaced the existing thread")
        await _copy_thread(target, entry, tuples, paths)
    except (PerdureError, OSError, ValueError, TypeError, _Mismatch) as exc:
        entry.status, entry.reason = "failed", f"copying failed: {exc}"
        try:
            await target.adelete_thread(entry.thread_id)
        except (PerdureError, OSError):
            entry.notes.append("the partly copied thread could not be removed")
