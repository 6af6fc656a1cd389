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
from server_bytes import postgres_bytes, redis_bytes
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
    read = postgres_bytes if kind == "postgres" else redis_bytes
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
    before, _ = _run(store, [], postgres_bytes if kind == "postgres" else redis_bytes)
    for secret in SECRETS:
        assert_found(before, secret)
