"""Persistence filters on the server stores: no row of the schema, no key of the prefix,
holds what a filter removed (SPEC §9).

The run of ``tests/hygiene/test_filters.py`` — tool calls, state, a checkpoint, an
export, a compaction, an import — on a filtered ``Session`` over PostgreSQL and Redis,
then every row of every table of the test's schema (``SELECT *``) and every value of
every key under the test's prefix (read by type) is searched. Skipped without the
servers (failed under ``CI=true``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import session_stores
from session_stores import make_store

from perdure import Agent
from perdure.hygiene import PIIRedactor
from perdure.models import ScriptedModel
from perdure.session import Session, SessionStore
from pii import (
    CARD,
    EMAIL,
    FORBIDDEN,
    PHONE,
    SECRETS,
    assert_found,
    find_account,
    pii_script,
    run,
)


def _postgres_bytes() -> bytes:
    import psycopg

    from postgres_server import DSN

    (schema,) = session_stores.PG_SCHEMAS
    out: list[bytes] = []
    with psycopg.connect(DSN, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        assert tables
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                for value in row:
                    out.append(bytes(value) if isinstance(value, bytes | memoryview) else
                               str(value).encode())  # fmt: skip
    return b"\n".join(out)


def _redis_bytes() -> bytes:
    from redis_server import client

    (prefix,) = session_stores.REDIS_PREFIXES
    out: list[bytes] = []
    with client() as c:
        keys = list(c.scan_iter(match=prefix + "*", count=1000))
        assert keys
        for key in keys:
            kind = c.type(key).decode()
            out.append(key)
            if kind == "string":
                out.append(c.get(key))
            elif kind == "hash":
                for field, value in c.hgetall(key).items():
                    out.extend((field, value))
            elif kind == "list":
                out.extend(c.lrange(key, 0, -1))
            elif kind == "set":
                out.extend(c.smembers(key))
            elif kind == "zset":
                out.extend(member for member, _ in c.zrange(key, 0, -1, withscores=True))
            elif kind == "stream":
                for _, fields in c.xrange(key):
                    for field, value in fields.items():
                        out.extend((field, value))
            else:
                raise AssertionError(f"key {key!r} of type {kind} is not read by this test")
    return b"\n".join(out)


def _run(store: SessionStore, filters: list[Any], read: Any) -> tuple[bytes, bytes]:
    """The run; what the server held before the compaction (which rewrites the
    history), and the export."""
    session = Session(store, "s1", filters=filters)
    agent = Agent(model=ScriptedModel(pii_script()), tools=[find_account], session_manager=session)
    agent(f"Hi, I am {EMAIL}, phone {PHONE}. Which account does card {CARD} pay into?")
    agent.state.set("contact", {"email": EMAIL})
    run(session.save())
    mark = run(session.checkpoint())
    exported: bytes = run(session.export_checkpoint(mark.checkpoint_id))
    agent("Thanks!")
    before_compaction: bytes = read()
    assert run(session.compact()).status == "compacted"
    run(session.import_checkpoint(exported))
    return before_compaction, exported


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_a_filtered_session_leaves_no_pii_on_the_server(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    read = _postgres_bytes if kind == "postgres" else _redis_bytes
    before, exported = _run(store, [PIIRedactor()], read)
    written = read()
    for secret in SECRETS:
        for form in FORBIDDEN[secret]:
            assert form not in before, f"{secret!r} ({form!r}) stored in {kind}"
            assert form not in written, f"{secret!r} ({form!r}) stored in {kind}"
            assert form not in exported
    assert b"[email]" in written
    resumed = Agent(
        model=ScriptedModel([]),
        session_manager=Session.resume(store, "s1", filters=[PIIRedactor()]),
    )
    assert "[card]" in json.dumps(resumed.messages)


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_the_server_check_finds_what_an_unfiltered_session_stores(
    kind: str, tmp_path: Path
) -> None:
    store = make_store(kind, tmp_path)
    before, _ = _run(store, [], _postgres_bytes if kind == "postgres" else _redis_bytes)
    for secret in SECRETS:
        assert_found(before, secret)
