"""How the CLI shows a graph's or a swarm's run (``snapshots runs``, ``sessions run``).

A run is read as a rebuilt orchestrator reads it: its records folded by
:func:`perdure.multiagent.run.replay` into where it stands.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from perdure.cli._common import echo_json
from perdure.cli.output import field_table, print_table
from perdure.cli.render import shorten
from perdure.multiagent.run import RunState

__all__ = ["run_details", "run_row", "show_run"]


def run_row(run_id: str | None, state: RunState) -> dict[str, Any]:
    """A run as one row of a listing (JSON-ready)."""
    return {
        "run_id": run_id,
        "kind": state.kind,
        "task": state.task,
        "status": state.status,
        "completed": list(state.order),
        "pending": list(state.pending),
        "error": state.error,
    }


def run_details(
    run_id: str | None, state: RunState, records: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """A run whole (JSON-ready): its row, each node's result, the shared state, the
    hand-offs, and the node agents whose state the run keeps."""
    held = sorted({r["agent"] for r in records if r.get("t") == "agent"})
    return {
        **run_row(run_id, state),
        "results": dict(state.results),
        "shared": state.shared,
        "handoffs": list(state.handoffs),
        "agents_in_run": held,
    }


def show_run(
    session_id: str,
    run_id: str | None,
    state: RunState,
    records: Sequence[dict[str, Any]],
    as_json: bool,
) -> None:
    """Print one run: JSON, or a table of its fields and completed nodes.

    ``run_id`` is ``None`` for the run a Session holds (the session is the run).
    """
    info = {"session_id": session_id, **run_details(run_id, state, records)}
    if as_json:
        echo_json(info)
        return
    rows = [
        ("task", shorten(state.task)),
        ("status", state.status + (f": {state.error}" if state.error else "")),
        ("next", ", ".join(state.pending) or "—"),
        ("shared", json.dumps(state.shared, ensure_ascii=False)),
    ]
    if info["agents_in_run"]:
        rows.append(("agents kept in the run", ", ".join(info["agents_in_run"])))
    for number, node in enumerate(state.order, start=1):
        rows.append((f"{number}. {node}", shorten(state.results.get(node, ""))))
    for handoff in state.handoffs:
        rows.append((f"handoff {handoff['from']} → {handoff['to']}", shorten(handoff["message"])))
    title = (
        f"{state.kind} run {run_id} of {session_id}" if run_id else f"{state.kind} run {session_id}"
    )
    print_table(field_table(title, rows))
