"""schemathesis against ``/openapi.json``: no 500, no answer the document contradicts.

Cases are generated from the document itself (bounded examples per operation) and
sent through the ASGI app over a file store holding real sessions and a checkpoint.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from server_support import conversation, fill

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis (dev)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from perdure.cli import ops  # noqa: E402
from perdure.server import MemoryBrowser, create_app  # noqa: E402
from perdure.session import open_store  # noqa: E402

TOKEN = "schemathesis-token"


def not_a_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """No 5xx at all: the store is clean, so nothing may answer 500."""
    assert response.status_code < 500, (response.status_code, response.text)
    return None


async def _fill(url: str, memory_path: Path) -> dict[str, Any]:
    """Real data for the fixed path parameters: a session, its checkpoint, a memory."""
    from perdure.memory import LocalMemoryStore

    store = open_store(url)
    await fill(store, "s1", conversation(3))
    checkpoint = await ops.create_checkpoint(store, "s1", "first")
    getattr(store, "close", lambda: None)()
    memory = LocalMemoryStore(memory_path, namespace="alice")
    for n in range(20):
        await memory.add(f"fact number {n}")
    memory.close()
    return {
        "session_id": "s1",
        "checkpoint_id": checkpoint.checkpoint_id,
        "namespace": "alice",
        "memory_id": 1,
    }


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root: Path = tmp_path_factory.mktemp("schemathesis")
    url = f"file:{root / 'store'}"
    known = asyncio.run(_fill(url, root / "memory.db"))
    store = open_store(url)
    memory = MemoryBrowser(f"sqlite:{root / 'memory.db'}")
    app = create_app(store, memory=memory, token=TOKEN)
    yield schemathesis.openapi.from_asgi("/openapi.json", app, headers=_auth()), known
    memory.close()
    getattr(store, "close", lambda: None)()


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
CHECKS.append(response_schema_conformance)


def test_every_answer_matches_the_document(api: Any) -> None:
    schema, known = api
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 16
    for operation in operations:
        # Once with every parameter generated (mostly unknown ids: 4xx answers), and
        # once more with the path naming real data, so the 2xx answers are checked too.
        run(operation, None)
        names = [p.name for p in operation.path_parameters]
        if names:
            run(operation, {name: known[name] for name in names if name in known})


def run(operation: Any, path_parameters: dict[str, Any] | None) -> None:
    """Up to 25 generated cases of ``operation``, each answer checked."""

    @given(case=operation.as_strategy(path_parameters=path_parameters))
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: Any) -> None:
        case.call_and_validate(headers=_auth(), checks=CHECKS)

    check()
