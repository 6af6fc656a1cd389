"""The peers' virtual environment, shared by the benchmarks that set perdure beside them.

The peers' SDKs (Strands, OpenAI Agents, LangGraph and their savers) never go into
perdure's own environment: tests and CI need none of them. ``agent_path.py --peers``,
``postgres.py --peers``, ``redis_store.py --peers`` and ``concurrency.py --peers``
create ``benchmarks/.peers-venv`` (git-ignored) from the pins in
``benchmarks/peers-requirements.txt`` the first time (about a minute), then run their
peers' script (``peers.py``, ``peers_postgres.py``, ``peers_redis.py``,
``peers_concurrency.py``) with its interpreter as a subprocess and read the JSON result
it writes.

It imports nothing from perdure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
PEERS_REQUIREMENTS = BENCHMARKS / "peers-requirements.txt"
PEERS_VENV = BENCHMARKS / ".peers-venv"


def ensure_peers_venv(venv: Path) -> Path:
    """The peers' interpreter, once ``venv`` holds the pins of ``peers-requirements.txt``.

    Creates the venv and installs the pins the first time (and again when the pins
    change: the venv keeps a copy of those it was installed with).
    """
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    stamp = venv / "perdure-peers-requirements.txt"
    wanted = PEERS_REQUIREMENTS.read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing the peers' SDKs in {venv} (once) ...", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = [str(python), "-m", "pip", "install", "-q", "-r", str(PEERS_REQUIREMENTS)]
    subprocess.run(install, check=True)
    stamp.write_text(wanted)
    return python


def run_peers_script(python: Path, script: Path, args: list[str], out: Path) -> Any:
    """Run ``script`` with ``python`` (the peers' venv) and return the JSON it wrote to ``out``.

    ``args`` are the script's arguments but ``--out``, which this adds. A script that
    exits non-zero raises RuntimeError with the end of its stderr; a peer that failed
    inside a script that finished (its result has an ``error``) has that stderr
    printed, and its result returned as it is.
    """
    command = [str(python), str(script), *args, "--out", str(out)]
    # Nothing of perdure's environment leaks into the peers' interpreter.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(
            f"benchmarks/{script.name} exited {done.returncode}:\n{done.stderr[-4000:]}"
        )
    document = json.loads(out.read_text())
    peers = document.get("peers", {}) if isinstance(document, dict) else {}
    if isinstance(peers, dict) and any(
        isinstance(peer, dict) and "error" in peer for peer in peers.values()
    ):
        print(done.stderr[-4000:], file=sys.stderr)
    return document


def measured_peers(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each peer of a peers script's result that ran, by name (one with an ``error`` is
    left out: the table names it as failed).

    Raises:
        ValueError: the result has no ``peers`` object, or a peer is not an object.
    """
    peers = document.get("peers")
    if not isinstance(peers, dict):
        raise ValueError("the peers' result has no 'peers' object")
    for name, peer in peers.items():
        if not isinstance(peer, dict):
            raise ValueError(f"peer {name!r}: expected an object, got {peer!r}")
        if "error" not in peer:
            yield name, peer
