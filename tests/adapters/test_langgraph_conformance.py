"""PerdureSaver passes LangGraph's public conformance suite on every perdure storage.

``langgraph-checkpoint-conformance`` (PyPI) runs its own tests of each capability
against a saver: the base ones (``put``, ``put_writes``, ``get_tuple``, ``list``,
``delete_thread``) and the extended ones (``delete_for_runs``, ``copy_thread``,
``prune``), detected by which methods the saver overrides. Every capability must be
detected and pass, on each backend (server backends skip without a server, and fail
under CI=true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lg_support import STORAGE_KINDS, import_langgraph, storage_url

import_langgraph()

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import (  # noqa: E402
    ALL_CAPABILITIES,
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)

from perdure.adapters.langgraph import PerdureSaver  # noqa: E402


@pytest.mark.parametrize("kind", STORAGE_KINDS)
async def test_conformance_base_and_extended(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = storage_url(kind, tmp_path, request, monkeypatch)
    opened: list[PerdureSaver] = []

    @checkpointer_test(name=f"PerdureSaver[{kind}]")
    async def saver() -> AsyncIterator[PerdureSaver]:
        made = PerdureSaver(url) if kind != "memory" or not opened else opened[0]
        opened.append(made)
        yield made

    try:
        report = await validate(saver)
    finally:
        for made in opened:
            made.close()
    assert BASE_CAPABILITIES | EXTENDED_CAPABILITIES == ALL_CAPABILITIES
    failures = {name: result.failures for name, result in report.results.items() if result.failures}
    assert failures == {}
    for capability in ALL_CAPABILITIES:
        result = report.results[capability.value]
        assert result.detected, f"{capability.value} not detected"
        assert result.passed is True, f"{capability.value}: {result}"
        assert result.tests_passed > 0
    assert report.conformance_level() == "FULL"
