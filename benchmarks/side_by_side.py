"""The side-by-side table of a server benchmark: perdure's agent path against the peers'.

``benchmarks/postgres.py`` and ``benchmarks/redis_store.py`` each run their peers (in
``benchmarks/.peers-venv``) on the same server and print the same table: µs per
message through each system's full agent path, resume, a tail page of 50 and the bytes
a message takes, then each peer / perdure and a verdict. A :class:`Layout` holds what
differs between the two servers (names, the floor, what "size" counts); the rest is
here, once.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from peers_venv import measured_peers


@dataclass(frozen=True)
class Layout:
    """What one server's side-by-side says that the other's does not."""

    peers_script: str  # the peer script's file name in benchmarks/
    peers_format: str  # the "format" its result carries
    peer_rows: tuple[tuple[str, str], ...]  # (key in the script's result, name), in order
    size_key: str  # the bytes a system holds, in perdure's figures and the peers' results
    size_heading: str  # that column's heading, in MB
    size_meaning: str  # what those bytes are, for the footnote
    floor: str  # what the floor is
    peers_run: str  # "the peers' run" or "the peer's run"
    perdure_label: str
    perdure_note: str  # what perdure keeps, and how durably
    notes_heading: str
    not_measured: tuple[str, ...]  # the lines printed without --peers


# (column, its heading in the first table, in the ratio table, its format)
SIDE_COLUMNS = (
    ("turn", "us/msg", "us/msg", "{:.0f}"),
    ("resume", "resume ms", "resume", "{:.1f}"),
    ("page", "tail50 ms", "tail50", "{:.2f}"),
    ("size", "B/msg", "B/msg", "{:.0f}"),
)
PERDURE_FACES = {
    "async": "await agent.invoke_async(QUESTION)",
    "sync": "agent(QUESTION)",
}
PERDURE_HOW = (
    "Agent(model=instant, conversation_manager=NullConversationManager(), "
    "session_manager=Session.resume(store, id)) over the stored session, then one call a "
    "turn: {faces}; resume: store.get(id) on a store opened before the clock (the whole "
    "history, hash chain verified); tail page: read_history_page(store, id, offset=n-50, "
    "limit=50)"
)


def check_peers(layout: Layout, document: Any, size: int, turns: int) -> dict[str, Any]:
    """``document`` if it is a result of ``layout``'s peer script for these sizes.

    Raises:
        ValueError: it is not (the message says what is wrong).
    """
    if not isinstance(document, dict) or document.get("format") != layout.peers_format:
        raise ValueError(
            f"not a result of benchmarks/{layout.peers_script} (format {layout.peers_format!r})"
        )
    if (document.get("size"), document.get("turns")) != (size, turns):
        raise ValueError(
            f"the peers stored {document.get('size')} messages and ran {document.get('turns')} "
            f"turns; this run: {size} and {turns}"
        )
    for name, peer in measured_peers(document):
        if peer.get("face") not in PERDURE_FACES:
            raise ValueError(
                f"peer {name!r}: face must be 'sync' or 'async', got {peer.get('face')!r}"
            )
        for key in ("turn_us", "resume_ms", "page_ms", layout.size_key, "messages"):
            value = peer.get(key)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"peer {name!r}: {key} must be a positive number, got {value!r}")
    return document


def peer_figures(layout: Layout, peer: dict[str, Any]) -> dict[str, float | None]:
    """A peer's value per column (None: not reported)."""
    size = peer.get(layout.size_key)
    held = peer.get("messages")
    return {
        "turn": peer.get("turn_us"),
        "resume": peer.get("resume_ms"),
        "page": peer.get("page_ms"),
        "size": size / held if size is not None and held else None,
    }


def dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent + "    ")


def side_by_side(
    layout: Layout, perdure: dict[str, Any], size: int, document: dict[str, Any] | None
) -> list[str]:
    """The side-by-side table at ``size`` messages, the ratio table and the verdict."""
    turns = perdure["turns"]
    floors = f"perdure's run {perdure['floor_us']:.0f} us"
    if document is not None and isinstance(document.get("floor_us"), int | float):
        floors += f", {layout.peers_run} {document['floor_us']:.0f} us"
    lines = [
        f"side by side on the same server: {size} messages stored, then {turns} turns through "
        "each full agent path (us per message: median turn / 2)",
        f"floor ({layout.floor}), median: {floors}",
    ]
    width = 48
    header = (
        f"{'system':<{width}}{'face':>6}"
        + "".join(f"{heading:>11}" for _, heading, _, _ in SIDE_COLUMNS[:3])
        + f"{layout.size_heading:>10}{'B/msg':>8}{'msgs':>8}"
    )
    lines += [header, "-" * len(header)]
    mine: dict[str, dict[str, float]] = {}
    for face in ("async", "sync"):
        mine[face] = {
            "turn": perdure["faces"][face],
            "resume": perdure["resume_ms"],
            "page": perdure["page_ms"],
            "size": perdure[layout.size_key] / perdure["messages"],
        }
        lines.append(
            f"{layout.perdure_label:<{width}}{face:>6}{perdure['faces'][face]:>11.0f}"
            f"{perdure['resume_ms']:>11.1f}{perdure['page_ms']:>11.2f}"
            f"{perdure[layout.size_key] / 1e6:>10.1f}{mine[face]['size']:>8.0f}"
            f"{perdure['messages']:>8.0f}"
        )
    ratios: list[tuple[float, str]] = []
    missing: list[str] = []
    ratio_lines: list[str] = []
    how = [
        (
            "perdure",
            PERDURE_HOW.format(
                faces=", ".join(f"{face}: {call}" for face, call in PERDURE_FACES.items())
            ),
        )
    ]
    notes = [("perdure", layout.perdure_note)]
    peers = document["peers"] if document is not None else {}
    for key, name in layout.peer_rows:
        result = peers.get(key)
        if result is None:
            missing.append(f"{name} not measured")
            lines.append(f"{name:<{width}}not measured")
            continue
        label = str(result.get("label", name + " {version}")).format(
            version=result.get("version", "?")
        )
        if "error" in result:
            missing.append(f"{name} failed")
            lines.append(f"{label:<{width}}failed: {result['error']}"[:200])
            continue
        face = result["face"]
        values = peer_figures(layout, result)
        total, held = result.get(layout.size_key), result.get("messages")
        shown = [
            *(dash(values[column], fmt) for column, _, _, fmt in SIDE_COLUMNS[:3]),
            dash(None if total is None else total / 1e6, "{:.1f}"),
            dash(values["size"], "{:.0f}"),
            dash(held, "{:.0f}"),
        ]
        lines.append(
            f"{label:<{width}}{face:>6}"
            + "".join(f"{cell:>{w}}" for cell, w in zip(shown, (11, 11, 11, 10, 8, 8), strict=True))
        )
        row = f"{name + ' / perdure ' + face:<{width}}"
        for column, _, heading, _ in SIDE_COLUMNS:
            value = values[column]
            if value is None:
                missing.append(f"{name} {heading}")
                row += f"{'-':>9}"
                continue
            ratio = value / mine[face][column]
            ratios.append((ratio, f"{name} {heading}"))
            row += f"{ratio:>8.2f}x"
        ratio_lines.append(row)
        how.append(
            (
                name,
                f"{result.get('turn_how', '?')}; resume: {result.get('resume_how', '?')}; "
                f"tail page: {result.get('page_how', '?')}",
            )
        )
        notes.append((name, str(result.get("note", ""))))
    lines.append("")
    if document is None:
        lines += list(layout.not_measured)
    else:
        ratio_header = f"{'peer / perdure':<{width}}" + "".join(
            f"{heading:>9}" for _, _, heading, _ in SIDE_COLUMNS
        )
        lines += [ratio_header, "-" * len(ratio_header), *ratio_lines]
        lines += wrapped(
            "above 1: perdure is faster (us/msg against perdure's row of the peer's face; resume, "
            f"tail50) or smaller (B/msg: {layout.size_meaning}, per message it holds)",
            "",
        )
    lines.append("how each system runs a turn, its resume and its tail page:")
    for name, text in how:
        lines += wrapped(f"{name}: {text}", "  ")
    lines.append(layout.notes_heading)
    for name, text in notes:
        lines += wrapped(f"{name}: {text}", "  ")
    slower = [f"{where} ({ratio:.2f}x)" for ratio, where in ratios if ratio <= 1]
    if missing:
        verdict = "not established: " + ", ".join(missing)
    elif slower:
        verdict = "no: perdure is not ahead on " + ", ".join(slower)
    else:
        ratio, where = min(ratios)
        verdict = f"yes (closest: {where}, {ratio:.2f}x)"
    lines.append(f"perdure ahead on every column (faster; B/msg: smaller): {verdict}")
    return lines
