"""Loop checkpoints: a bookmark of where the agent loop paused (seed 000 §6.1–6.2).

With ``checkpointing=True`` the agent loop stops at two pause points of a tool-use
cycle and returns a result with ``stop_reason == "checkpoint"`` and a
:class:`Checkpoint`::

    model call ──▶ [after_model]   the model returned tool_use; the tools have not run
                       │
                       ▼
                 tool execution ──▶ [after_tools]   the tools ran; the next model call
                                                    has not been made yet

* ``after_model`` is emitted only when the model stopped with ``tool_use``, and not again
  on the cycle that was just resumed from ``after_model``.
* ``after_tools`` is emitted only in tool-use cycles: a turn that ends with
  ``end_turn`` never reaches it.

Priorities when several reasons to stop meet at one boundary:

* interrupt beats checkpoint — an interrupt returns ``stop_reason == "interrupt"`` and
  skips ``after_tools``;
* cancel beats checkpoint — a cancel request returns ``"cancelled"`` at every boundary.

A checkpoint holds no conversation state, only the position: pair it with a session
manager to resume in another process. To resume, pass
``[{"checkpointResume": {"checkpoint": checkpoint.to_dict()}}]`` as the prompt;
resuming ``after_model`` runs the pending tools of the last assistant message,
resuming ``after_tools`` goes on with ``cycle_index + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

from perdure.errors import CheckpointError

__all__ = [
    "CHECKPOINT_POSITIONS",
    "CHECKPOINT_SCHEMA_VERSION",
    "Checkpoint",
    "CheckpointPosition",
]

CHECKPOINT_SCHEMA_VERSION = "1.0"
"""The version of the dict :meth:`Checkpoint.to_dict` writes; another one is refused."""

CheckpointPosition: TypeAlias = Literal["after_model", "after_tools"]

CHECKPOINT_POSITIONS: frozenset[str] = frozenset(get_args(CheckpointPosition))
"""The valid values of :attr:`Checkpoint.position`."""

_KEYS = ("position", "cycle_index", "schema_version")


@dataclass(frozen=True)
class Checkpoint:
    """Where the agent loop paused: a pause point and the 0-based cycle index.

    Construction validates every field, so a ``Checkpoint`` that exists is well formed.

    Raises:
        CheckpointError: ``position`` is not ``"after_model"``/``"after_tools"``,
            ``cycle_index`` is not a non-negative ``int`` (``bool`` is refused), or
            ``schema_version`` is not :data:`CHECKPOINT_SCHEMA_VERSION`.
    """

    position: CheckpointPosition
    cycle_index: int
    schema_version: str = CHECKPOINT_SCHEMA_VERSION

    def __post_init__(self) -> None:
        _check_schema_version(self.schema_version)
        if not isinstance(self.position, str) or self.position not in CHECKPOINT_POSITIONS:
            raise CheckpointError(
                f"checkpoint position must be one of {sorted(CHECKPOINT_POSITIONS)}, "
                f"got {self.position!r}"
            )
        if isinstance(self.cycle_index, bool) or not isinstance(self.cycle_index, int):
            raise CheckpointError(
                f"checkpoint cycle_index must be an int, got {type(self.cycle_index).__name__}"
            )
        if self.cycle_index < 0:
            raise CheckpointError(f"checkpoint cycle_index must be >= 0, got {self.cycle_index}")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-compatible form ``{"position", "cycle_index", "schema_version"}``."""
        return {
            "position": self.position,
            "cycle_index": self.cycle_index,
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Checkpoint:
        """Rebuild a checkpoint from :meth:`to_dict` output.

        The schema version is checked before anything else, so a checkpoint written by
        another version is reported as such rather than as a malformed field.

        Raises:
            CheckpointError: ``data`` is not a dict, lacks or adds a key, has a value of
                the wrong type, an unknown position, or another schema version (the
                message says which version was expected and which was found).
        """
        if not isinstance(data, dict):
            raise CheckpointError(f"checkpoint must be a dict, got {type(data).__name__}")
        missing = [key for key in _KEYS if key not in data]
        if missing:
            raise CheckpointError(f"checkpoint is missing key(s): {', '.join(missing)}")
        unknown = sorted(str(key) for key in data if key not in _KEYS)
        if unknown:
            raise CheckpointError(f"checkpoint has unknown key(s): {', '.join(unknown)}")
        _check_schema_version(data["schema_version"])
        return cls(
            position=data["position"],
            cycle_index=data["cycle_index"],
            schema_version=data["schema_version"],
        )


def _check_schema_version(version: object) -> None:
    if not isinstance(version, str):
        raise CheckpointError(
            f"checkpoint schema_version must be a string, got {type(version).__name__}"
        )
    if version != CHECKPOINT_SCHEMA_VERSION:
        raise CheckpointError(
            f"checkpoint schema_version mismatch: expected {CHECKPOINT_SCHEMA_VERSION!r}, "
            f"found {version!r}"
        )
