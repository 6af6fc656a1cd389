"""``perdure demo``: the gift-finder workflow, paused and resumed at every checkpoint.

A scripted model (no network, no API key) drives a four-step workflow from seed 004:
collect the recipient's profile → generate candidates with a tool → filter them with
a tool → confirm the final choice (a tool that asks the human, via an interrupt).
The agent runs with ``checkpointing=True``: the loop pauses after every model call
that asks for tools and after every batch of tools, and the demo resumes it — once
on a brand-new agent rebuilt from a snapshot, as a restarted process would.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from perdure.agent import Agent, AgentResult, Snapshot, TextDeltaEvent, ToolEndEvent, ToolStartEvent
from perdure.agent.events import ResultEvent
from perdure.cli.style import Style
from perdure.models import ScriptedModel
from perdure.tools import AgentTool, ToolContext, tool
from perdure.types import Message

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
    ]


GIFT_TOOLS: list[AgentTool] = [save_profile, generate_candidates, filter_candidates, confirm_choice]
SYSTEM_PROMPT = "You are GiftGenius. Work step by step: profile, candidates, filter, confirm."


def build_agent(model: ScriptedModel) -> Agent:
    """The gift-finder agent, checkpointing at every pause point."""
    return Agent(model=model, tools=GIFT_TOOLS, system_prompt=SYSTEM_PROMPT, checkpointing=True)


async def _run(agent: Agent, prompt: Any, out: TextIO, s: Style) -> AgentResult:
    result: AgentResult | None = None
    streaming = False
    async for event in agent.stream_async(prompt):
        if isinstance(event, TextDeltaEvent):
            if not streaming:
                out.write(s("  assistant › ", "magenta"))
                streaming = True
            out.write(event.text)
        elif isinstance(event, ToolStartEvent):
            if streaming:
                out.write("\n")
                streaming = False
            args = json.dumps(event.tool_use["input"], ensure_ascii=False)
            out.write(s(f"  ⚙ {event.tool_use['name']}", "cyan") + s(f"({args})", "dim") + "\n")
        elif isinstance(event, ToolEndEvent):
            text = " ".join(b.get("text", "") for b in event.result["content"])
            status = "green" if event.result["status"] == "success" else "red"
            out.write(s("    ↳ ", status) + s(_shorten(text), "dim") + "\n")
        elif isinstance(event, ResultEvent):
            result = event.result
    if streaming:
        out.write("\n")
    assert result is not None
    return result


def _shorten(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def run_demo(out: TextIO | None = None, *, color: bool | None = None) -> Snapshot:
    """Run the gift-finder demo, writing a readable transcript to ``out``.

    Returns the final snapshot (the tests check it).
    """
    out = out or sys.stdout
    s = Style.for_stream(out, color)
    model = ScriptedModel(gift_finder_script())
    agent = build_agent(model)
    out.write(s("perdure demo — GiftGenius, checkpointing=True", "bold") + "\n")
    out.write(s("  user › ", "blue") + PROMPT + "\n")
    result = await _run(agent, PROMPT, out, s)
    pauses = 0
    restarted = False
    while result.stop_reason in ("checkpoint", "interrupt"):
        pauses += 1
        if result.stop_reason == "interrupt":
            interrupt = result.interrupts[0]
            out.write(
                s(f"⏸  interrupt #{pauses}: ", "yellow", "bold")
                + f"{interrupt.name} — {interrupt.reason['question']}\n"
            )
            out.write(s("  user › ", "blue") + "yes\n")
            out.write(s("▶  resume with interruptResponse", "green") + "\n")
            prompt: Any = [{"interruptResponse": {"interruptId": interrupt.id, "response": "yes"}}]
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
            prompt = [{"checkpointResume": {"checkpoint": ckpt.to_dict()}}]
            if not restarted and ckpt.position == "after_model" and ckpt.cycle_index == 2:
                # Show that a pause point survives a restart: rebuild the agent from a
                # snapshot (as a new process would from its session) and resume there.
                saved = agent.take_snapshot().to_json()
                agent = build_agent(model)
                agent.load_snapshot(Snapshot.from_json(saved))
                restarted = True
                out.write(
                    s("↻  simulated restart: ", "magenta", "bold")
                    + f"new agent rebuilt from a {len(saved)}-byte snapshot, "
                    + "resuming from the checkpoint\n"
                )
            out.write(s(f"▶  resume from {ckpt.position}", "green") + "\n")
        result = await _run(agent, prompt, out, s)
    out.write(s(f"✔  finished: stop_reason={result.stop_reason}", "green", "bold") + "\n")
    snapshot = agent.take_snapshot(app_data={"demo": "gift-finder"})
    _print_snapshot(snapshot, agent, out, s)
    return snapshot


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
