"""The tables of the PostgreSQL session store, in their schema (version 1).

::

    perdure_sessions(sid bigint identity PRIMARY KEY, id text UNIQUE COLLATE "C",
                     created_at, updated_at,            -- ISO-8601 UTC text
                     message_count, head,               -- head: hash of the last row
                     writes, tail,                      -- commits that wrote; tail token
                     state, state_hash,                 -- agent state JSON; its hash
                     touched_at)                        -- server time of the last use (TTL)
    perdure_messages(sid REFERENCES perdure_sessions, idx,  -- PRIMARY KEY (sid, idx)
                     body, hash,                        -- message JSON; chain hash
                     redacted, redacted_hash)           -- replacement JSON; its hash
    perdure_leases(session_id PRIMARY KEY, owner, token,    -- the writer's lease:
                   expires_at, holder_pid, holder_start)    -- fencing token, expiry, holder
    perdure_checkpoints(session_id, checkpoint_id,      -- PRIMARY KEY (both)
                        meta,                           -- CheckpointMeta as JSON (ASCII)
                        body bytea, hash)               -- the sealed record; its hash

A message row's key is its session's number and its index, so a session's history
is one range of the primary key's B-tree: a page reads only its rows. Ids sort by
code point (``COLLATE "C"``), as ``sorted`` sorts them in Python. Lease tokens come
from one sequence, so a token is never given twice, even after a lease row is
deleted. Message rows reference their session row: a session row cannot be deleted
from under its messages (which would make a session with rows read as not found).
"""

from __future__ import annotations

from collections.abc import Sequence

from perdure._runtime.postgres import SchemaPart

__all__ = ["SESSIONS", "SESSIONS_VERSION"]

SESSIONS_VERSION = 1


def _statements(q: str) -> Sequence[str]:
    return (
        f"""CREATE TABLE IF NOT EXISTS {q}.perdure_sessions (
            sid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text COLLATE "C" NOT NULL UNIQUE,
            created_at text NOT NULL,
            updated_at text NOT NULL,
            message_count bigint NOT NULL,
            head text NOT NULL,
            writes bigint NOT NULL,
            tail text NOT NULL,
            state text,
            state_hash text,
            touched_at timestamptz NOT NULL DEFAULT now()
        )""",
        f"""CREATE TABLE IF NOT EXISTS {q}.perdure_messages (
            sid bigint NOT NULL REFERENCES {q}.perdure_sessions (sid),
            idx bigint NOT NULL,
            body text NOT NULL,
            hash text NOT NULL,
            redacted text,
            redacted_hash text,
            PRIMARY KEY (sid, idx)
        )""",
        f"CREATE SEQUENCE IF NOT EXISTS {q}.perdure_lease_tokens",
        f"""CREATE TABLE IF NOT EXISTS {q}.perdure_leases (
            session_id text COLLATE "C" PRIMARY KEY,
            owner text NOT NULL,
            token bigint NOT NULL,
            expires_at timestamptz NOT NULL,
            holder_pid integer,
            holder_start timestamptz
        )""",
        f"""CREATE TABLE IF NOT EXISTS {q}.perdure_checkpoints (
            session_id text COLLATE "C" NOT NULL,
            checkpoint_id text COLLATE "C" NOT NULL,
            meta text NOT NULL,
            body bytea NOT NULL,
            hash text NOT NULL,
            PRIMARY KEY (session_id, checkpoint_id)
        )""",
    )


SESSIONS = SchemaPart(
    component="sessions",
    version=SESSIONS_VERSION,
    tables={
        "perdure_sessions": (
            "sid", "id", "created_at", "updated_at", "message_count", "head", "writes",
            "tail", "state", "state_hash", "touched_at",
        ),
        "perdure_messages": ("sid", "idx", "body", "hash", "redacted", "redacted_hash"),
        "perdure_leases": (
            "session_id", "owner", "token", "expires_at", "holder_pid", "holder_start",
        ),
        "perdure_checkpoints": ("session_id", "checkpoint_id", "meta", "body", "hash"),
    },
    statements=_statements,
)  # fmt: skip
"""The session store's tables (sessions, messages, leases, checkpoints)."""
