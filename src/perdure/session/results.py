"""What session operations return (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CompactStatus = Literal["compacted", "rejected", "failed"]
CompactReason = Literal[
    "turn_running",
    "empty_history",
    "not_configured",
    "hook_blocked",
    "nothing_to_compact",
    "summary_malformed",
    "model_error",
]
RestoreStatus = Literal["restored", "rejected"]
RestoreReason = Literal["turn_running", "store_not_wired"]


@dataclass(frozen=True)
class CompactResult:
    """The outcome of ``Session.compact``.

    ``compacted``: messages ``removed_range`` (indexes of the history before) were
    folded into one summary. ``rejected``: nothing happened (``reason`` says why).
    ``failed``: the compaction started but could not finish; the ``checkpoint_id``
    it wrote first, if any, is kept.
    """

    status: CompactStatus
    reason: CompactReason | None = None
    compaction_id: str | None = None
    removed_range: tuple[int, int] | None = None
    checkpoint_id: str | None = None


@dataclass(frozen=True)
class RestoreResult:
    """The outcome of ``Session.restore``: the history went from ``from_messages``
    messages to ``to_messages``, after a ``pre_restore`` checkpoint when asked."""

    status: RestoreStatus
    reason: RestoreReason | None = None
    from_messages: int = 0
    to_messages: int = 0
    pre_restore_checkpoint_id: str | None = None
