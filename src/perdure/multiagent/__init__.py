"""Orchestrators whose runs resume after a crash: :class:`Graph` and :class:`Swarm` (SPEC §8.1).

Give either a :class:`~perdure.session.SnapshotSessionManager` (its
``multi_agent_save_latest_on`` decides when the run is saved) or a
:class:`~perdure.session.Session`; a rebuilt orchestrator with the same session id
resumes an unfinished run at its next node, without running a completed node again.
"""

from perdure.multiagent.graph import Graph, GraphBuilder, GraphResult, NodeFunction
from perdure.multiagent.run import RUN_FORMAT, RunState
from perdure.multiagent.swarm import HANDOFF_TOOL, Swarm, SwarmResult

__all__ = [
    "HANDOFF_TOOL",
    "RUN_FORMAT",
    "Graph",
    "GraphBuilder",
    "GraphResult",
    "NodeFunction",
    "RunState",
    "Swarm",
    "SwarmResult",
]
