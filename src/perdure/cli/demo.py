"""``perdure demo``: the gift-finder workflow, killed mid-way and resumed in a new process.

A scripted model (no network, no API key) drives a four-step workflow from seed 004:
collect the recipient's profile → generate candidates with a tool → filter them with
a tool → confirm the final choice (a tool that asks the human, via an interrupt).

The agent runs in a worker process with ``checkpointing=True`` on a session stored in
a local directory (``FileSessionStore``): the loop pauses after every model call that
asks for tools and after every batch of tools, and the worker saves the pause point
with the session. Half-way through, the demo kills the worker with SIGKILL, then
starts a fresh worker that resumes from the stored session and the last loop
checkpoint. A log of completed tool runs shows that no tool ran twice. Then the
memory part (:mod:`perdure.cli.demo_memory`) and a multi-agent graph killed between
two nodes and resumed (:mod:`perdure.cli.demo_graph`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from perdure._runtime.fs import append_all
from perdure.agent import Agent, Snapshot
from perdure.cli.demo_graph import run_graph_demo
from perdure.cli.demo_memory import run_memory_demo
from perdure.cli.style import Style
from perdure.cli.transcript import shorten, stream_transcript
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session
from perdure.tools import AgentTool, ToolContext, tool
from perdure.types import Message

SESSION_ID = "gift-finder"
KILL_AFTER_PAUSE = 5
"""The worker is killed right after it saved this pause (filter_candidates pending)."""
_RUN_LOG: Path | None = None


def _log_run(name: str, tool_use_id: str) -> None:
    """Record a completed tool run durably (the demo's proof that none runs twice)."""
    if _RUN_LOG is None:
        return
    fd = os.open(_RUN_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        append_all(fd, f"{name} {tool_use_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


# The "persistent" catalogue the tools read (seed 004: agents reach persistent data
# through tools; the session state keeps only ids).
CATALOGUE: dict[str, dict[str, Any]] = {
    "g1": {"name": "Board game: Azul", "price": 39, "tags": ["board games"]},
    "g2": {"name": "Coffee subscription (3 months)", "price": 45, "tags": ["coffee"]},
    "g3": {"name": "Espresso mug set", "price": 25, "tags": ["coffee", "mugs"]},
    "g4": {"name": "Notebook bundle", "price": 18, "tags": ["notebooks"]},
    "g5": {"name": "Board game: Wingspan", "price": 55, "tags": ["board games"]},
    "g6": {"name": "Cold-brew coffee kit", "price": 32, "tags": ["coffee"]},
}


@tool
def save_profile(
    recipient_type: str,
    interests: list[str],
    dislikes: list[str],
    budget: int,
    context: ToolContext,
) -> str:
    """Save the recipient's profile to the gift session.

    Args:
        recipient_type: who the gift is for, e.g. "colleague, developer".
        interests: what the recipient likes.
        dislikes: what the recipient does not want.
        budget: the most the user wants to spend, in dollars.
    """
    context.state.set(
        "gift_session",
        {
            "step": "profile_collected",
            "profile": {
                "recipient_type": recipient_type,
                "interests": interests,
                "dislikes": dislikes,
            },
            "budget": budget,
        },
    )
    _log_run("save_profile", context.tool_use["toolUseId"])
    return f"Profile saved: {recipient_type}, likes {', '.join(interests)}, budget ${budget}."


@tool
def generate_candidates(interests: list[str], context: ToolContext) -> str:
    """Find catalogue gifts matching the recipient's interests.

    Args:
        interests: tags to match against the catalogue.
    """
    ids = [gid for gid, g in CATALOGUE.items() if set(g["tags"]) & set(interests)]
    session = context.state.get("gift_session") or {}
    session.update(step="candidates_generated", candidate_ids=ids)
    context.state.set("gift_session", session)
    _log_run("generate_candidates", context.tool_use["toolUseId"])
    return json.dumps([{"id": gid, **CATALOGUE[gid]} for gid in ids])


@tool
def filter_candidates(max_price: int, exclude_tags: list[str], context: ToolContext) -> str:
    """Keep candidates within budget that carry none of the excluded tags.

    Args:
        max_price: the budget in dollars.
        exclude_tags: tags the recipient dislikes.
    """
    session = context.state.get("gift_session") or {}
    kept = [
        gid
        for gid in session.get("candidate_ids", [])
        if CATALOGUE[gid]["price"] <= max_price
        and not set(CATALOGUE[gid]["tags"]) & set(exclude_tags)
    ]
    session.update(step="filtered", candidate_ids=kept)
    context.state.set("gift_session", session)
    _log_run("filter_candidates", context.tool_use["toolUseId"])
    return json.dumps([{"id": gid, **CATALOGUE[gid]} for gid in kept])


@tool
def confirm_choice(gift_id: str, context: ToolContext) -> str:
    """Ask the user to confirm the chosen gift before it is recorded.

    Args:
        gift_id: the catalogue id of the proposed gift.
    """
    gift = CATALOGUE[gift_id]
    answer = context.interrupt(
        "confirm_gift",
        {"gift_id": gift_id, "question": f"Go with {gift['name']} (${gift['price']})?"},
    )
    session = context.state.get("gift_session") or {}
    if str(answer).lower().startswith("y"):
        session.update(step="final_choice_made", selected_gift_id=gift_id)
        context.state.set("gift_session", session)
        _log_run("confirm_choice", context.tool_use["toolUseId"])
        return f"Confirmed: {gift['name']}."
    return "The user declined; propose something else."


def _call(tool_use_id: str, name: str, **tool_input: Any) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"text": _NARRATION[name]},
            {"toolUse": {"toolUseId": tool_use_id, "name": name, "input": tool_input}},
        ],
    }


_NARRATION = {
    "save_profile": "Let me note down who the gift is for.",
    "generate_candidates": "Now I'll look for gifts matching their interests.",
    "filter_candidates": "Let me drop anything over budget or on the dislike list.",
    "confirm_choice": "The cold-brew kit fits best; I'll check with you first.",
}

PROMPT = (
    "I need a gift for a developer colleague, up to $50. He loves board games and "
    "coffee, hates mugs and already has plenty of notebooks."
)


def gift_finder_script() -> list[Any]:
    """The model's side of the demo conversation."""
    return [
        _call(
            "t1",
            "save_profile",
            recipient_type="colleague, developer",
            interests=["board games", "coffee"],
            dislikes=["mugs", "notebooks"],
            budget=50,
        ),
        _call("t2", "generate_candidates", interests=["board games", "coffee"]),
        _call("t3", "filter_candidates", max_price=50, exclude_tags=["mugs", "notebooks"]),
        _call("t4", "confirm_choice", gift_id="g6"),
        "Done! Your colleague gets the Cold-brew coffee kit ($32): it matches his love of "
        "coffee, stays under budget and is neither a mug nor a notebook. Runner-up: Azul ($39).",
        FOLLOW_UP_ANSWER,
    ]


GIFT_TOOLS: list[AgentTool] = [save_profile, generate_candidates, filter_candidates, confirm_choice]
SYSTEM_PROMPT = "You are GiftGenius. Work step by step: profile, candidates, filter, confirm."


def scripted_model() -> ScriptedModel:
    """A model that answers from the script by how far the conversation got.

    It counts the assistant messages in the request, so a fresh process resuming the
    stored conversation gets the next answer, not the first one again.
    """
    script = gift_finder_script()

    def respond(messages: list[Message]) -> Any:
        if messages and messages[0]["content"][0].get("text", "").startswith(
            ("Transcript:", "Instructions for this summary:")
        ):
            return SUMMARY  # a compaction asks for a summary of the transcript
        return script[sum(1 for m in messages if m["role"] == "assistant")]

    return ScriptedModel([respond] * len(script) * 2, record="none")


FOLLOW_UP = "Can you add gift wrapping?"
FOLLOW_UP_ANSWER = "Yes: the Cold-brew coffee kit will come gift-wrapped."
SUMMARY = (
    "GiftGenius helped the user pick a gift for a developer colleague: budget $50, "
    "likes board games and coffee, no mugs or notebooks. Candidates g1, g2 and g6 passed "
    "the filter; the user confirmed g6, the Cold-brew coffee kit ($32)."
)


def build_agent(session: Session | None = None) -> Agent:
    """The gift-finder agent, checkpointing at every pause point."""
    return Agent(
        model=scripted_model(),
        tools=GIFT_TOOLS,
        system_prompt=SYSTEM_PROMPT,
        checkpointing=True,
        session_manager=session,
    )


async def run_worker(data_dir: Path, out: TextIO, *, color: bool | None) -> None:
    """One worker process: open the stored session, resume from its last pause, go on.

    After every pause the worker stores the loop checkpoint in the agent's state and
    saves the session, prints ``SAVED <n>`` and waits for a line on stdin: the parent
    either lets it go on or kills it there.
    """
    global _RUN_LOG
    _RUN_LOG = data_dir / "tool-runs.log"
    s = Style.for_stream(out, color)
    store = FileSessionStore(data_dir / "store")
    session = await Session.open(store, SESSION_ID)
    agent = build_agent(session)
    await agent.initialize()  # inside a loop the constructor does not restore
    saved = agent.state.get("demo") or {}
    pauses = int(saved.get("pauses", 0))
    checkpoint = saved.get("checkpoint")
    interrupts = saved.get("interrupts") or []
    if interrupts:
        prompt: Any = [
            {"interruptResponse": {"interruptId": interrupts[0]["id"], "response": "yes"}}
        ]
        out.write(s("  user › ", "blue") + "yes\n")
        out.write(s("▶  resume with interruptResponse", "green") + "\n")
    elif checkpoint:
        prompt = [{"checkpointResume": {"checkpoint": checkpoint}}]
        out.write(
            s(
                f"▶  resume from {checkpoint['position']} (cycle {checkpoint['cycle_index']})",
                "green",
            )
            + s(f" — {len(agent.messages)} messages restored from the session", "dim")
            + "\n"
        )
    else:
        prompt = PROMPT
        out.write(s("  user › ", "blue") + PROMPT + "\n")
    out.flush()
    while True:
        result = await stream_transcript(agent, prompt, out, s)
        if result.stop_reason not in ("checkpoint", "interrupt"):
            break
        pauses += 1
        if result.stop_reason == "interrupt":
            interrupt = result.interrupts[0]
            out.write(
                s(f"⏸  interrupt #{pauses}: ", "yellow", "bold")
                + f"{interrupt.name} — {interrupt.reason['question']}\n"
            )
            state: dict[str, Any] = {"pauses": pauses, "interrupts": [interrupt.to_dict()]}
            prompt = [{"interruptResponse": {"interruptId": interrupt.id, "response": "yes"}}]
            resume_line = s("  user › ", "blue") + "yes\n"
            resume_line += s("▶  resume with interruptResponse", "green") + "\n"
        else:
            assert result.checkpoint is not None
            ckpt = result.checkpoint
            step = (agent.state.get("gift_session") or {}).get("step", "starting")
            out.write(
                s(f"⏸  checkpoint #{pauses}: ", "yellow", "bold")
                + f"{ckpt.position}, cycle {ckpt.cycle_index} "
                + s(f"(workflow step: {step}, {len(agent.messages)} messages)", "dim")
                + "\n"
            )
            state = {"pauses": pauses, "checkpoint": ckpt.to_dict()}
            prompt = [{"checkpointResume": {"checkpoint": ckpt.to_dict()}}]
            resume_line = s(f"▶  resume from {ckpt.position}", "green") + "\n"
        agent.state.set("demo", state)
        await session.save()
        out.write(f"SAVED {pauses}\n")
        out.flush()
        # Wait for the parent: it either lets us go on or kills us right here, so the
        # kill lands at the same pause point on every run, however loaded the machine.
        await asyncio.to_thread(sys.stdin.readline)
        out.write(resume_line)
    agent.state.set("demo", {"pauses": pauses, "done": True})
    await session.save()
    out.write(s(f"✔  finished: stop_reason={result.stop_reason}", "green", "bold") + "\n")
    out.flush()


def _start_worker(data_dir: Path, color: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perdure.cli.demo",
            "--worker",
            str(data_dir),
            "--color" if color else "--no-color",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _relay(
    worker: subprocess.Popen[str], out: TextIO, s: Style, label: str, kill_after: int | None
) -> bool:
    """Copy the worker's output; SIGKILL it once it saved pause ``kill_after``. True if killed."""
    assert worker.stdout is not None
    assert worker.stdin is not None
    with worker.stdout, worker.stdin:
        for line in worker.stdout:
            if line.startswith("SAVED "):
                if kill_after is not None and int(line.split()[1]) >= kill_after:
                    worker.send_signal(signal.SIGKILL)
                    worker.wait()
                    return True
                worker.stdin.write("go on\n")
                worker.stdin.flush()
                continue
            out.write(s(f"{label} {s.bar} ", "dim") + line)
            out.flush()
    worker.wait()
    return False


def _fresh_dir(path: Path) -> Path:
    path = path.resolve()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


async def run_demo(
    out: TextIO | None = None, *, color: bool | None = None, data_dir: Path | None = None
) -> Snapshot:
    """Run the demo (see the module docstring), writing a readable transcript to ``out``.

    Returns the final snapshot of the agent, rebuilt from the stored session.
    """
    out = out or sys.stdout
    s = Style.for_stream(out, color)
    data_dir = await asyncio.to_thread(_fresh_dir, Path(data_dir or "perdure-demo-data"))
    out.write(s("perdure demo — GiftGenius, checkpointing=True", "bold") + "\n")
    out.write(s(f"session {SESSION_ID!r} stored under {data_dir}", "dim") + "\n\n")
    first = _start_worker(data_dir, s.enabled)
    killed = await asyncio.to_thread(_relay, first, out, s, "worker 1", KILL_AFTER_PAUSE)
    if not killed:
        raise RuntimeError(
            f"the first worker ended before pause {KILL_AFTER_PAUSE} (exit {first.returncode})"
        )
    store = FileSessionStore(data_dir / "store")
    stored = await store.get(SESSION_ID)
    out.write(
        s(f"💥 killed worker 1 (pid {first.pid}) with SIGKILL", "red", "bold")
        + s(
            f" — the session on disk holds {stored.meta.message_count} messages "
            "and its last pause point",
            "dim",
        )
        + "\n\n"
    )
    second = _start_worker(data_dir, s.enabled)
    await asyncio.to_thread(_relay, second, out, s, "worker 2", None)
    if second.returncode != 0:
        raise RuntimeError(f"the second worker failed (exit {second.returncode})")
    runs = Counter(
        line.split()[0] for line in (data_dir / "tool-runs.log").read_text().splitlines()
    )
    out.write(s("\nCompleted tool runs across both processes", "bold") + "\n")
    for name in ("save_profile", "generate_candidates", "filter_candidates", "confirm_choice"):
        mark = s("✔", "green") if runs[name] == 1 else s("✘", "red")
        out.write(f"  {mark} {name.ljust(20)} {runs[name]}×\n")
    session = await Session.open(store, SESSION_ID, must_exist=True)
    agent = build_agent(session)
    await agent.initialize()
    await _time_travel(session, agent, out, s)
    snapshot = agent.take_snapshot(app_data={"demo": "gift-finder"})
    _print_snapshot(snapshot, agent, out, s)
    await run_memory_demo(out, s, data_dir / "memory")
    await run_graph_demo(out, s, data_dir / "graph")
    return snapshot


async def _time_travel(session: Session, agent: Agent, out: TextIO, s: Style) -> None:
    """Checkpoint, compact and restore the stored session, with a table of checkpoints."""
    out.write(s("\nTime travel on the stored session", "bold") + "\n")
    out.write(s("  user › ", "blue") + FOLLOW_UP + "\n")
    answer = await agent.invoke_async(FOLLOW_UP)
    out.write(s("  assistant › ", "magenta") + str(answer) + "\n")
    mark = await session.checkpoint("gift chosen")
    out.write(
        s("  ◆ checkpoint ", "cyan")
        + f"{mark.checkpoint_id} ({mark.label!r}, {mark.message_count} messages)\n"
    )
    before = len(agent.messages)
    compacted = await session.compact(instructions="keep the budget and the chosen gift")
    assert compacted.removed_range is not None
    out.write(
        s("  ◆ compact ", "cyan")
        + f"{compacted.status}: messages {compacted.removed_range[0]}–"
        + f"{compacted.removed_range[1] - 1} folded into one summary "
        + f"({before} → {len(agent.messages)} messages; pre_compaction checkpoint first)\n"
    )
    out.write(
        s("    ↳ ", "dim")
        + s(shorten(agent.messages[0]["content"][0]["text"].replace("\n", " ")), "dim")
        + "\n"
    )
    restored = await session.restore(mark.checkpoint_id)
    out.write(
        s("  ◆ restore ", "cyan")
        + f"{restored.status}: {restored.from_messages} → {restored.to_messages} messages "
        + "(the full history is back; a pre_restore checkpoint keeps the compacted one)\n"
    )
    rows = await session.list_checkpoints()
    out.write(
        s("\n  checkpoint id                trigger          label         messages", "bold") + "\n"
    )
    for meta in rows:
        out.write(
            f"  {meta.checkpoint_id}   {meta.trigger:<16} {meta.label or '—'!s:<13} "
            f"{meta.message_count:>8}\n"
        )


def _print_snapshot(snapshot: Snapshot, agent: Agent, out: TextIO, s: Style) -> None:
    session = snapshot.data["state"].get("gift_session", {})
    gift = CATALOGUE.get(session.get("selected_gift_id", ""), {})
    rows = [
        ("schema", f"{snapshot.schema_version} (scope {snapshot.scope})"),
        ("fields", ", ".join(sorted(snapshot.data))),
        ("messages", str(len(snapshot.data["messages"]))),
        ("workflow step", str(session.get("step"))),
        ("candidates", ", ".join(session.get("candidate_ids", []))),
        ("chosen gift", f"{gift.get('name')} (${gift.get('price')})"),
        ("size", f"{len(snapshot.to_json())} bytes of JSON"),
    ]
    out.write(s("\nSnapshot summary", "bold") + "\n")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.write(f"  {s(key.ljust(width), 'cyan')}  {value}\n")


def _worker_main(argv: list[str]) -> int:
    color = "--color" in argv
    args = [a for a in argv if not a.startswith("--")]
    asyncio.run(run_worker(Path(args[0]), sys.stdout, color=color))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[2:] if sys.argv[1:2] == ["--worker"] else sys.argv[1:]))
