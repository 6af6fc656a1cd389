"""TTL rules, written once for every session store: pure, no I/O (SPEC §7, §9).

A store with ``ttl=`` (seconds of inactivity) expires a session that nobody used
(committed to, or read with ``get``) for longer than that. These functions decide,
the same way in every store:

- :func:`check_ttl`: what ``ttl=`` accepts (``None``, or a number of seconds > 0);
- :func:`is_expired`: whether a session last used at ``used_at`` is expired at
  ``now`` (strictly more than ``ttl`` seconds idle);
- :func:`tomb_seconds`: how long a store keeps the tombstone of an expired session
  after its last use (``max(10 × ttl, 7 days)``): while it lives, the id reads as
  ``session_not_found`` with ``details["reason"] == "expired"``, after it
  ``"unknown"``, as an id that never existed;
- :func:`id_status`: ``"live"``, ``"expired"`` or ``"unknown"`` from whether the
  session's data is there and when it was last used;
- :func:`not_found`: the one :class:`~perdure.errors.SessionNotFoundError` every
  store raises, with ``details["reason"]``;
- :func:`expires_at`: when a live session expires, as ISO-8601 UTC (what
  :attr:`~perdure.session.store.SessionMeta.expires_at` shows).

Times are seconds since the epoch (``time.time()``, or the server's clock for a
server store).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Literal

from perdure.errors import SessionNotFoundError

__all__ = [
    "TOMB_MIN_SECONDS",
    "IdStatus",
    "check_ttl",
    "epoch_of",
    "expires_at",
    "id_status",
    "is_expired",
    "iso_time",
    "not_found",
    "tomb_seconds",
]

TOMB_MIN_SECONDS = 7 * 24 * 3600.0
"""Seconds a tombstone outlives its session's last use, at least."""

IdStatus = Literal["live", "expired", "unknown"]


def check_ttl(ttl: Any) -> float | None:
    """``ttl`` checked: ``None`` or a number of seconds > 0, as a float.

    Raises:
        ValueError: anything else (a bool, a string, 0, a negative number, NaN); the
            message names ``ttl``.
    """
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < float("inf"):
        raise ValueError(f"ttl must be None or a number of seconds > 0, got {ttl!r}")
    return float(ttl)


def tomb_seconds(ttl: float) -> float:
    """Seconds after its last use that an expired session's tombstone is kept."""
    return max(10 * ttl, TOMB_MIN_SECONDS)


def is_expired(used_at: float, ttl: float | None, now: float) -> bool:
    """Whether a session last used at ``used_at`` is expired at ``now``."""
    return ttl is not None and now - used_at > ttl


def id_status(exists: bool, used_at: float | None, ttl: float | None, now: float) -> IdStatus:
    """What an id is: a live session, an expired one (its tombstone lives), or unknown.

    Args:
        exists: the session's data is stored (an expired session's stays until gc).
        used_at: its last use, ``None`` when the store has no record of it (a
            session made before the store had a ttl counts as live until used).
        ttl: the store's ttl.
        now: the time to judge at.
    """
    if ttl is None or used_at is None:
        return "live" if exists else "unknown"
    if not is_expired(used_at, ttl, now):
        # A tombstone whose data is gone but whose last use is recent: the data was
        # deleted (``delete`` forgets the tombstone too) — as good as never existed.
        return "live" if exists else "unknown"
    return "expired" if exists or now - used_at <= tomb_seconds(ttl) else "unknown"


def not_found(session_id: str, where: str, *, expired: bool, ttl: float | None = None) -> Any:
    """The :class:`SessionNotFoundError` for ``session_id`` (``where``: the store).

    ``details``: ``session_id`` and ``reason``, ``"expired"`` or ``"unknown"``.
    """
    if expired:
        idle = f" for more than {ttl:g} s (ttl)" if ttl is not None else " (ttl)"
        return SessionNotFoundError(
            f"session {session_id!r} expired in {where}: it was not used{idle}",
            details={"session_id": session_id, "reason": "expired"},
        )
    return SessionNotFoundError(
        f"session {session_id!r} not found in {where}",
        details={"session_id": session_id, "reason": "unknown"},
    )


def iso_time(epoch: float) -> str:
    """Seconds since the epoch as ISO-8601 UTC with microseconds and ``Z``."""
    moment = _dt.datetime.fromtimestamp(epoch, _dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def epoch_of(iso: str) -> float | None:
    """An ISO-8601 time (naive: UTC) as seconds since the epoch; ``None`` if unreadable."""
    try:
        parsed = _dt.datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    if parsed.utcoffset() is None:
        parsed = parsed.replace(tzinfo=_dt.UTC)
    return parsed.timestamp()


def expires_at(used_at: float | None, ttl: float | None) -> str | None:
    """When a session last used at ``used_at`` expires (ISO-8601 UTC); ``None``
    without a ttl or a known last use."""
    if ttl is None or used_at is None:
        return None
    return iso_time(used_at + ttl)
