"""InterruptState: the agent's pending interrupts, part of its persisted internal state."""

from __future__ import annotations

import copy
from typing import Any

from perdure.errors import SnapshotError
from perdure.tools import Interrupt, InterruptException, interrupt_id
from perdure.types import ToolResult, ToolUse


class InterruptState:
    """Which interrupts are pending, their responses, and the tool results kept meanwhile.

    While ``activated``, the last assistant message holds tool calls of which some
    raised interrupts; ``completed_results`` are the results of the calls of that
    message that finished, so a resume runs only the others. ``version`` grows on
    every change, for persistence to notice.
    """

    def __init__(self) -> None:
        self.interrupts: dict[str, Interrupt] = {}
        self.completed_results: list[ToolResult] = []
        self.activated = False
        self.cycle_index = 0
        self._version = 0

    @property
    def version(self) -> int:
        """A counter that grows on every change."""
        return self._version

    @property
    def pending(self) -> list[Interrupt]:
        """The interrupts still waiting for a response, oldest first."""
        return [i for i in self.interrupts.values() if i.response is None]

    def raise_or_answer(self, tool_use: ToolUse, name: str, reason: Any) -> Any:
        """The body of ``ToolContext.interrupt``: return the response, or raise."""
        iid = interrupt_id(tool_use["toolUseId"], name)
        known = self.interrupts.get(iid)
        if known is not None and known.response is not None:
            return known.response
        interrupt = Interrupt(id=iid, name=name, reason=copy.deepcopy(reason))
        self.interrupts[iid] = interrupt
        self._version += 1
        raise InterruptException(interrupt)

    def activate(self, completed_results: list[ToolResult], cycle_index: int) -> None:
        """Enter the paused state, keeping the results of tool calls that finished."""
        self.activated = True
        self.cycle_index = cycle_index
        self.completed_results = copy.deepcopy(completed_results)
        self._version += 1

    def respond(self, responses: dict[str, Any]) -> None:
        """Record the caller's responses by interrupt id.

        Raises:
            ValueError: nothing is pending, or an id names no pending interrupt.
        """
        if not self.activated:
            raise ValueError("interruptResponse given but the agent has no pending interrupts")
        for iid in responses:
            if iid not in self.interrupts:
                known = ", ".join(sorted(self.interrupts)) or "none"
                raise ValueError(
                    f"interruptResponse names unknown interrupt id {iid!r} (pending: {known})"
                )
        for iid, response in responses.items():
            self.interrupts[iid].response = copy.deepcopy(response)
        self._version += 1

    def clear(self) -> None:
        """Leave the paused state and forget every interrupt."""
        if self.activated or self.interrupts or self.completed_results:
            self.interrupts.clear()
            self.completed_results = []
            self.activated = False
            self.cycle_index = 0
            self._version += 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible copy of the state."""
        return {
            "activated": self.activated,
            "cycle_index": self.cycle_index,
            "interrupts": {iid: i.to_dict() for iid, i in self.interrupts.items()},
            "completed_results": copy.deepcopy(self.completed_results),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InterruptState:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            SnapshotError: ``data`` is not of that shape.
        """
        if not isinstance(data, dict):
            raise SnapshotError(f"interrupt_state must be a dict, got {type(data).__name__}")
        state = cls()
        try:
            state.activated = bool(data.get("activated", False))
            cycle_index = data.get("cycle_index", 0)
            if isinstance(cycle_index, bool) or not isinstance(cycle_index, int) or cycle_index < 0:
                raise ValueError(f"'cycle_index' must be an int >= 0, got {cycle_index!r}")
            state.cycle_index = cycle_index
            interrupts = data.get("interrupts", {})
            if not isinstance(interrupts, dict):
                raise ValueError("'interrupts' must be a dict")
            state.interrupts = {iid: Interrupt.from_dict(i) for iid, i in interrupts.items()}
            results = data.get("completed_results", [])
            if not isinstance(results, list):
                raise ValueError("'completed_results' must be a list")
            state.completed_results = copy.deepcopy(results)
        except ValueError as exc:
            raise SnapshotError(f"interrupt_state is malformed: {exc}") from exc
        return state
