"""A customer-support agent with long-term memory: each ticket is a session, the
customer's preferences follow them into the next one.

Two tickets from the same customer, each a session of its own in a SQLite store. In
the first, the agent looks an order up and remembers (with its ``add_memory`` tool)
that the customer wants updates by text message. The second ticket is a brand-new
conversation: the memory store is searched before the model is asked, and the
preference is in the request — though never in the ticket's stored history.

Run (a scripted model: no key, no network)::

    python examples/support_agent.py --data-dir ./support
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from perdure import Agent, tool
from perdure.memory import LocalMemoryStore, MemoryManager
from perdure.models import ScriptedModel
from perdure.session import Session, SQLiteSessionStore

ORDERS = {"A-100": "shipped on Monday, arriving Thursday", "A-200": "waiting for stock"}


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up in the order system.

    Args:
        order_id: the order number, like A-100.
    """
    return ORDERS.get(order_id, "no such order")


def _use(tool_use_id: str, name: str, **arguments: str) -> dict:
    use = {"toolUseId": tool_use_id, "name": name, "input": arguments}
    return {"role": "assistant", "content": [{"toolUse": use}]}


FIRST_TICKET = [
    _use("t1", "lookup_order", order_id="A-100"),
    _use("t2", "add_memory", content="Prefers order updates by text message, not email."),
    "Order A-100 shipped on Monday and arrives Thursday. I'll text you updates from now on.",
]
SECOND_TICKET = [
    _use("t3", "lookup_order", order_id="A-200"),
    "Order A-200 is waiting for stock; I'll send you a text message when it ships.",
]


def support_agent(data_dir: Path, customer: str, ticket: str, script: list) -> Agent:
    """The agent for one ticket: its session, the customer's memory, the order tool."""
    sessions = SQLiteSessionStore(data_dir / "tickets.db")
    memory = LocalMemoryStore(data_dir / "memory.db", namespace=customer)
    return Agent(
        model=ScriptedModel(script),
        system_prompt="You are a support agent. Remember what customers prefer.",
        tools=[lookup_order],
        session_manager=Session(sessions, ticket),
        memory_manager=MemoryManager([memory], add_tool_config=True),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("support-data"))
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)

    first = support_agent(args.data_dir, "cust-7", "ticket-1", FIRST_TICKET)
    question = "Where is order A-100? And please text me, I never read email."
    print(f"ticket-1 customer: {question}")
    print(f"ticket-1 agent:    {first(question)}")

    second = support_agent(args.data_dir, "cust-7", "ticket-2", SECOND_TICKET)
    print("ticket-2 customer: Any news on my order A-200?")
    print(f"ticket-2 agent:    {second('Any news on my order A-200?')}")

    request = second.model.requests[0]["messages"][-1]["content"][0]["text"]
    print(f"memory injected into ticket-2's first request: {request!r}")
    stored = asyncio.run(SQLiteSessionStore(args.data_dir / "tickets.db").get("ticket-2"))
    print(f"ticket-2's stored history mentions <memory>: {'<memory>' in str(stored.messages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
