"""A human-approval flow: a refund waits for a person, across processes.

The agent's ``refund`` tool asks a human before it pays (``context.interrupt``). The
first run stops there and exits: the pending question is stored with the session.
Any later process — a web hook, a shift later — answers it, and only the interrupted
tool runs again, now with the answer.

Run (a scripted model: no key, no network)::

    python examples/approval_flow.py --data-dir ./approvals ask
    python examples/approval_flow.py --data-dir ./approvals answer yes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perdure import Agent, ToolContext, tool
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session

SESSION_ID = "ticket-1017"
REFUND = {"toolUseId": "r1", "name": "refund", "input": {"order_id": "1017", "amount": 49}}
SCRIPT: list = [
    {"role": "assistant", "content": [{"toolUse": REFUND}]},
    "Your refund of $49 for order 1017 is on its way.",
]


@tool
def refund(order_id: str, amount: int, context: ToolContext) -> str:
    """Refund an order, once a human approved it.

    Args:
        order_id: the order to refund.
        amount: dollars to refund.
    """
    answer = context.interrupt("approve_refund", f"Refund ${amount} for order {order_id}?")
    if answer != "yes":
        return "the refund was declined by a supervisor"
    context.state.set("refunded", {"order_id": order_id, "amount": amount})
    return f"refunded ${amount}"


def build_agent(data_dir: Path, *, new: bool) -> Agent:
    """The support agent on its stored session; the model resumes where the history is."""
    store = FileSessionStore(data_dir)
    session = Session(store, SESSION_ID) if new else Session.resume(store, SESSION_ID)
    agent = Agent(model=ScriptedModel([]), tools=[refund], session_manager=session)
    answered = sum(1 for m in agent.messages if m["role"] == "assistant")
    agent.model = ScriptedModel(SCRIPT[answered:])
    return agent


def ask(data_dir: Path) -> int:
    agent = build_agent(data_dir, new=True)
    result = agent("Order 1017 arrived broken, I want my $49 back.")
    if result.stop_reason != "interrupt":
        print(f"unexpected stop: {result.stop_reason}", file=sys.stderr)
        return 1
    for question in result.interrupts:
        print(f"waiting for a human: {question.reason} (interrupt {question.id})")
    return 0


def answer(data_dir: Path, response: str) -> int:
    agent = build_agent(data_dir, new=False)
    pending = agent.interrupt_state.pending
    if not pending:
        print("nothing is waiting for an answer", file=sys.stderr)
        return 1
    prompt = [{"interruptResponse": {"interruptId": q.id, "response": response}} for q in pending]
    result = agent(prompt)
    print(f"agent: {result}")
    print(f"state: refunded={agent.state.get('refunded')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("approval-data"))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ask", help="the customer asks; the agent stops for approval")
    reply = sub.add_parser("answer", help="a human answers the pending question")
    reply.add_argument("response", choices=["yes", "no"])
    args = parser.parse_args(argv)
    if args.command == "ask":
        return ask(args.data_dir)
    return answer(args.data_dir, args.response)


if __name__ == "__main__":
    sys.exit(main())
