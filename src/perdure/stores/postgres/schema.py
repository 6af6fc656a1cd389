"""The tables of the PostgreSQL session store, in their schema (version 2).

::

    perdure_sessions(sid bigint identity PRIMARY KEY, id text UNIQUE COLLATE "C",
                     created_at, updated_at,            -- ISO-8601 UTC text
                     message_count, head,               -- head: hash of the last row
                     writes, tail,                      -- commits that wrote; tail token
                     state, state_hash,                 -- agent state JSON; its hash
                     touched_at)                        -- server time of the last use (TTL)
    perdure_messages(sid, idx,                          -- PRIMARY KEY (sid, idx)
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
deleted. A session row cannot be deleted from under its messages (which would make
a session with rows read as not found): a trigger refuses it with
``foreign_key_violation``.

Version 1 made that a foreign key from the message rows. Its check ran on every
inserted row, a third of a commit's time on the server, though the one statement that
inserts rows takes their session number from the session row it has just updated.
Version 2 checks the one operation the key was there for, and only then: a session
row's delete. ``perdure migrate-schema`` upgrades version 1 (step 1 below).
"""

from __future__ import annotations

from collections.abc import Sequence

from perdure._runtime.postgres import SchemaPart

__all__ = ["SESSIONS", "SESSIONS_VERSION"]

SESSIONS_VERSION = 2


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
            sid bigint NOT NULL,
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
        *_keep_messages(q),
    )


def _keep_messages(q: str) -> Sequence[str]:
    """A trigger refusing to delete a session row while it has message rows."""
    return (
        f"""CREATE OR REPLACE FUNCTION {q}.perdure_keep_messages() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM {q}.perdure_messages WHERE sid = OLD.sid) THEN
                RAISE EXCEPTION 'session row % still has message rows', OLD.sid
                    USING ERRCODE = 'foreign_key_violation';
            END IF;
            RETURN OLD;
        END $$""",
        f"DROP TRIGGER IF EXISTS perdure_keep_messages ON {q}.perdure_sessions",
        f"CREATE TRIGGER perdure_keep_messages BEFORE DELETE ON {q}.perdure_sessions "
        f"FOR EACH ROW EXECUTE FUNCTION {q}.perdure_keep_messages()",
    )


def _from_version_1(q: str) -> Sequence[str]:
    """Version 1 to 2: the foreign key of the message rows becomes the delete trigger."""
    return (
        f"ALTER TABLE {q}.perdure_messages DROP CONSTRAINT IF EXISTS perdure_messages_sid_fkey",
        *_keep_messages(q),
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
    steps={1: _from_version_1},
)  # fmt: skip
"""The session store's tables (sessions, messages, leases, checkpoints)."""
