"""Strands' ``S3SessionManager`` on an S3 endpoint, for ``snapshots.py --s3 --peers``.

This script runs in the peers' own virtual environment (``benchmarks/.peers-venv``,
made from ``peers-requirements.txt``; Strands brings boto3):

    VENV/bin/python benchmarks/peers_s3.py --endpoint URL --sizes 1000,10000 \\
        --saves N --restores N --out FILE

For each size it makes a bucket on the endpoint (moto's server on loopback, started by
``snapshots.py``: dummy credentials, no AWS account), gives a Strands ``Agent``
(``NullConversationManager``, the instant stub model of ``peers.py``) an
``S3SessionManager`` and stores that many messages through it, untimed, the way a
session grows: ``append_message`` per message, one object each. Then it times:

- ``save_ms``: one more message stored (``append_message``: what Strands does on every
  ``MessageAddedEvent``), the mean of ``--saves``;
- ``restore_ms``: a new ``Agent`` with a new ``S3SessionManager`` on the session (it
  lists the session's prefix and reads every message object), the median of
  ``--restores``; the messages restored are checked.

It writes ``{"format": ..., "sdk": ..., "sizes": {size: {"save_ms", "restore_ms"}}}``
as JSON to ``FILE``. It imports nothing from perdure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import ANSWER, QUESTION, strands_model

FORMAT = "perdure-peers-s3/1"


def message(i: int) -> dict[str, Any]:
    role = "user" if i % 2 == 0 else "assistant"
    return {"role": role, "content": [{"text": QUESTION if i % 2 == 0 else ANSWER}]}


def make_bucket(endpoint: str) -> str:
    bucket = f"strands-{uuid.uuid4().hex[:20]}"
    request = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=10):
        pass
    return bucket


def new_agent(endpoint: str, bucket: str) -> Any:
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager
    from strands.session import S3SessionManager

    manager = S3SessionManager(
        session_id="bench", bucket=bucket, region_name="us-east-1", endpoint_url=endpoint
    )
    agent = Agent(
        model=strands_model(),
        session_manager=manager,
        conversation_manager=NullConversationManager(),
        callback_handler=None,
    )
    return agent, manager


def measure(endpoint: str, size: int, saves: int, restores: int) -> dict[str, float]:
    bucket = make_bucket(endpoint)
    agent, manager = new_agent(endpoint, bucket)
    for i in range(size):
        msg = message(i)
        agent.messages.append(msg)
        manager.append_message(msg, agent)
    times = []
    for i in range(size, size + saves):
        msg = message(i)
        agent.messages.append(msg)
        start = time.perf_counter()
        manager.append_message(msg, agent)
        times.append(time.perf_counter() - start)
    stored = size + saves
    restore_times = []
    for _ in range(restores):
        start = time.perf_counter()
        fresh, _ = new_agent(endpoint, bucket)
        restore_times.append(time.perf_counter() - start)
        if len(fresh.messages) != stored:
            raise AssertionError(f"restored {len(fresh.messages)} messages, stored {stored}")
    return {
        "save_ms": statistics.fmean(times) * 1000,
        "restore_ms": statistics.median(restore_times) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--saves", type=int, default=100)
    parser.add_argument("--restores", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from importlib.metadata import version

    sizes = [int(s) for s in args.sizes.split(",") if s]
    result = {str(size): measure(args.endpoint, size, args.saves, args.restores) for size in sizes}
    document = {
        "format": FORMAT,
        "sdk": f"strands-agents {version('strands-agents')}",
        "sizes": result,
    }
    args.out.write_text(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
