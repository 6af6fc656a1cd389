"""Interrupts: a tool asks a human for input and the loop pauses until it gets it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

_INTERRUPT_NAMESPACE = uuid.UUID("6f1d3c55-1b8e-4c8e-9f57-5a3f2d0c9e11")


def interrupt_id(tool_use_id: str, name: str) -> str:
    """The stable id of the interrupt ``name`` raised by the tool call ``tool_use_id``.

    Stable so that a re-run of the same tool call (after the caller answered) finds the
    response to the interrupt it raised the first time.
    """
    return str(uuid.uuid5(_INTERRUPT_NAMESPACE, f"{tool_use_id}\x00{name}"))


@dataclass
class Interrupt:
    """One question a tool put to the caller; ``response`` is filled in on resume."""

    id: str
    name: str
    reason: Any = None
    response: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "reason": self.reason, "response": self.response}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interrupt:
        """Rebuild an interrupt from :meth:`to_dict` output.

        Raises:
            ValueError: ``data`` lacks ``id`` or ``name`` or they are not strings.
        """
        if not isinstance(data, dict):
            raise ValueError(f"interrupt must be a dict, got {type(data).__name__}")
        for key in ("id", "name"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"interrupt is missing string field {key!r}: {data!r}")
        return cls(
            id=data["id"],
            name=data["name"],
            reason=data.get("reason"),
            response=data.get("response"),
        )


class InterruptException(Exception):
    """Raised inside a tool by ``context.interrupt`` when no response exists yet.

    The tool executor catches it; it never reaches the caller of the agent.
    """

    def __init__(self, interrupt: Interrupt) -> None:
        super().__init__(f"tool raised interrupt {interrupt.name!r}")
        self.interrupt = interrupt
