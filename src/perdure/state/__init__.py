"""Agent state (SPEC layer 2)."""

from perdure.state.agent_state import AgentState

__all__ = ["AgentState"]
