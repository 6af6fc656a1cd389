"""Key names and error translation shared by the Redis stores."""

from __future__ import annotations

from typing import Any, NamedTuple

import redis.exceptions as rexc

from perdure._runtime.redis import UNAVAILABLE, where
from perdure.errors import SessionCorruptedError, StoreUnavailableError

__all__ = ["UNAVAILABLE", "Keys", "check_prefix", "keys_of", "translate", "where"]


class Keys(NamedTuple):
    """One session's keys, all with its ``{session_id}`` hash tag (one cluster slot)."""

    head: str  # hash: count, head, writes, tail, state, state_hash, created, updated
    messages: str  # list: one element per message, its 32-digit chain hash + JSON
    redactions: str  # hash: index -> redaction hash + replacement JSON
    tomb: str  # string: outlives the session's TTL, so expiry can be told from absence
    lease: str  # string: the writer lease's token (SET NX PX)
    cp_meta: str  # hash: checkpoint id -> meta JSON
    cp_body: str  # hash: checkpoint id -> blob_hash of the body + body

    @property
    def session(self) -> list[str]:
        """The keys the session's scripts take first (h m r t)."""
        return [self.head, self.messages, self.redactions, self.tomb]


def keys_of(prefix: str, session_id: str) -> Keys:
    base = f"{prefix}{{{session_id}}}:"
    return Keys(*(base + s for s in ("h", "m", "r", "t", "l", "cm", "cb")))


def check_prefix(prefix: Any) -> str:
    """``prefix`` checked: a str without braces (a brace would move the hash tag)."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if "{" in prefix or "}" in prefix:
        raise ValueError(f"prefix {prefix!r} must not contain '{{' or '}}' (hash tags)")
    return prefix


def translate(exc: BaseException, server: str, doing: str) -> Exception:
    """perdure's error for a driver error (the caller raises it ``from exc``)."""
    if isinstance(exc, UNAVAILABLE):
        return StoreUnavailableError(
            f"Redis store at {server}: {doing}: the server cannot be reached ({exc})",
            details={"server": server},
        )
    if isinstance(exc, rexc.ResponseError) and str(exc).startswith("WRONGTYPE"):
        return SessionCorruptedError(
            f"Redis store at {server}: {doing}: a key holds the wrong type of value ({exc})",
            details={"server": server, "kind": "bad_meta"},
        )
    return OSError(f"Redis store at {server}: {doing}: {exc}")
