"""The error tree (SPEC §10) and the public surface."""

from __future__ import annotations

import re

import pytest

import perdure
import perdure.errors as errors

EXPECTED_CODES = {
    "SessionNotFoundError": "session_not_found",
    "SessionCorruptedError": "session_store_corrupted",
    "SessionLockedError": "session_locked",
    "SessionConflictError": "session_conflict",
    "TurnRunningError": "turn_running",
    "SessionMismatchError": "session_mismatch",
    "StoreNotWiredError": "store_not_wired",
    "CheckpointNotFoundError": "checkpoint_not_found",
    "CheckpointImportError": "checkpoint_import_invalid",
    "CheckpointError": "checkpoint_error",
    "SnapshotError": "snapshot_error",
    "FilterFailedError": "filter_failed",
    "DecryptionError": "decryption",
    "ModelError": "model_error",
    "MemoryStoreError": "memory_store_error",
    "StorageError": "storage_error",
    "StorageConflictError": "storage_conflict",
    "StoreUnavailableError": "store_unavailable",
    "SchemaVersionError": "schema_version",
    "ContextWindowOverflowError": "context_window_overflow",
    "ModelAuthenticationError": "model_authentication",
    "ModelRateLimitError": "model_rate_limited",
    "ModelServerError": "model_server_error",
    "ModelConnectionError": "model_connection",
}


@pytest.mark.parametrize(("name", "code"), sorted(EXPECTED_CODES.items()))
def test_every_error_has_its_stable_code(name: str, code: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.PerdureError)
    err = cls("message")
    assert err.code == code
    assert str(err) == "message"
    assert code in repr(err)


def test_all_lists_every_error_and_the_docstring_draws_each() -> None:
    defined = {
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.PerdureError)
    }
    assert defined == set(errors.__all__)
    doc = errors.__doc__ or ""
    for name in defined:
        assert re.search(rf"\b{name}\b", doc), f"{name} missing from the tree in the docstring"


@pytest.mark.parametrize(
    "module",
    [
        "perdure",
        "perdure.agent",
        "perdure.tools",
        "perdure.hooks",
        "perdure.models",
        "perdure.types",
        "perdure.session",
        "perdure.injection",
        "perdure.memory",
    ],
)
def test_all_is_sorted_and_complete(module: str) -> None:
    mod = __import__(module, fromlist=["__all__"])
    names = mod.__all__
    assert names == sorted(names, key=lambda n: (not n.isupper(), n)) or names == sorted(names)
    for name in names:
        assert hasattr(mod, name), f"{module}.__all__ names missing {name}"


def test_importing_perdure_imports_no_optional_dependency() -> None:
    import subprocess
    import sys

    code = (
        "import sys, perdure, perdure.agent, perdure.tools, perdure.models;"
        "bad = [m for m in ('openai', 'anthropic', 'psycopg', 'redis', 'boto3', 'fastapi') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    assert perdure.__version__
