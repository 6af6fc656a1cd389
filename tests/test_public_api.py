"""The public surface (issue 15): ``__all__`` lists exactly the public names.

In the style of httpx's ``tests/test_exported_members.py``: every public attribute
of a public module is in its ``__all__`` (sorted, no duplicates) and every entry
resolves; the lazy faces stay lazy and are never shadowed by a submodule; the
everyday names come from ``perdure``; no declared extra is empty.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import perdure
import perdure.session

SRC = Path(perdure.__file__).parent
ROOT = SRC.parent.parent

PUBLIC_MODULES = [
    "perdure",
    "perdure.agent",
    "perdure.agent.conversation",
    "perdure.bidi",
    "perdure.crypto",
    "perdure.errors",
    "perdure.hooks",
    "perdure.hygiene",
    "perdure.injection",
    "perdure.memory",
    "perdure.models",
    "perdure.multiagent",
    "perdure.session",
    "perdure.state",
    "perdure.storage",
    "perdure.stores.file",
    "perdure.tools",
    "perdure.types",
]

# Reachable, but left out of __all__ so that ``from perdure.models import *`` needs
# no extra: each imports its provider's SDK.
NEEDS_AN_EXTRA = {"perdure.models": {"AnthropicModel", "OpenAIModel"}}

# Typing helpers a module uses for its own annotations are not its public names.
_TYPING_MODULES = {"typing", "typing_extensions", "collections.abc", "abc"}


def _is_own_public(module: types.ModuleType, name: str, value: object) -> bool:
    if name.startswith("_") or isinstance(value, types.ModuleType | __future__._Feature):
        return False
    return getattr(value, "__module__", None) not in _TYPING_MODULES


def _sorted(names: list[str]) -> bool:
    # Plain code-point order, or constants first (as several packages list them).
    return names in (sorted(names), sorted(names, key=lambda n: (not n.isupper(), n)))


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported: list[str] = list(module.__all__)
    assert _sorted(exported), f"{name}.__all__ is not sorted"
    assert len(exported) == len(set(exported)), f"{name}.__all__ has duplicates"
    extra = NEEDS_AN_EXTRA.get(name, set())
    # vars() holds what is defined or imported; dir() adds what a lazy face offers.
    public = {n for n, v in vars(module).items() if _is_own_public(module, n, v)}
    public |= {n for n in dir(module) if not n.startswith("_")} - set(vars(module))
    missing = public - set(exported) - extra
    assert not missing, f"{name} has public names missing from __all__: {sorted(missing)}"
    for entry in exported:
        value = getattr(module, entry)  # resolves (lazily, where the face is lazy)
        assert not isinstance(value, types.ModuleType), f"{name}.{entry} is a module"


def _import_every_submodule(package: str) -> None:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        importlib.import_module(info.name)


def test_no_submodule_shadows_a_name_of_a_lazy_face() -> None:
    """Importing a submodule binds it on its package: it must not hide a public name."""
    for package in ("perdure.session", "perdure.stores", "perdure.snapshots", "perdure.storage"):
        _import_every_submodule(package)
    for module in (perdure, perdure.session):
        for name in module.__all__:
            value = getattr(module, name)
            assert not isinstance(value, types.ModuleType), f"{module.__name__}.{name}"
    assert inspect.isfunction(perdure.session.open_store)
    assert inspect.isfunction(perdure.open_store)


EVERYDAY = [
    "FileSessionStore",
    "MemorySessionStore",
    "SQLiteSessionStore",
    "Session",
    "SnapshotSessionManager",
    "open_store",
]


def test_everyday_session_names_come_from_perdure_lazily() -> None:
    code = (
        "import sys, perdure\n"
        "heavy = [m for m in sys.modules if m.startswith(('perdure.session.', "
        "'perdure.stores', 'perdure.snapshots', 'perdure.checkpoints'))]\n"
        "assert not heavy, heavy\n"
        f"names = {EVERYDAY!r}\n"
        "from perdure import session\n"
        "for name in names:\n"
        "    assert getattr(perdure, name) is getattr(session, name), name\n"
        "    assert name in perdure.__all__ and name in dir(perdure), name\n"
        "import perdure.adapters\n"
        "bad = [m for m in ('openai', 'anthropic', 'psycopg', 'redis', 'boto3', 'numpy', "
        "'agents') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_every_store_is_importable_from_perdure_session() -> None:
    from perdure.session import (  # noqa: F401  (the import is the test)
        FileCheckpointStore,
        FileSessionStore,
        MemoryCheckpointStore,
        MemorySessionStore,
        Session,
        SnapshotSessionManager,
        SQLiteCheckpointStore,
        SQLiteSessionStore,
        StorageCheckpointStore,
        open_store,
        read_history_page,
    )


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchStore"):
        _ = perdure.NoSuchStore  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="NoSuchStore"):
        _ = perdure.session.NoSuchStore  # type: ignore[attr-defined]


def test_the_orchestrator_and_bidi_strategies_are_exported_and_validated() -> None:
    import perdure.snapshots.manager as manager

    for name in ("BidiAgentSaveLatestStrategy", "MultiAgentSaveLatestStrategy"):
        assert name in perdure.session.__all__
        assert name in manager.__all__
        assert getattr(perdure.session, name) is getattr(manager, name)
    with pytest.raises(ValueError, match="bidi_agent_save_latest_on"):
        perdure.session.SnapshotSessionManager("s", bidi_agent_save_latest_on="node")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multi_agent_save_latest_on"):
        perdure.session.SnapshotSessionManager("s", multi_agent_save_latest_on="stop")  # type: ignore[arg-type]


def test_session_operations_have_async_faces() -> None:
    """Session's redaction is a coroutine; the snapshot manager keeps seed 003's sync
    ``redact_latest_message`` and has the async twin beside it."""
    from perdure.session import Session, SnapshotSessionManager

    assert inspect.iscoroutinefunction(Session.redact_latest_message)
    assert inspect.iscoroutinefunction(SnapshotSessionManager.redact_latest_message_async)
    assert not inspect.iscoroutinefunction(SnapshotSessionManager.redact_latest_message)
    doc = SnapshotSessionManager.__doc__ or ""
    assert "redact_latest_message_async" in doc


def test_no_declared_extra_is_empty() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra, requirements in project["optional-dependencies"].items():
        assert requirements, f"the extra {extra!r} installs nothing"


def test_nothing_below_the_front_ends_imports_the_session_face() -> None:
    """``perdure.session`` is a face for users (and the CLI, a front end over the
    public API); the library's own modules import from where names are defined."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith("cli/") or relative == "session/__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "perdure.session":
                offenders.append(relative)
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "perdure"
                and any(alias.name == "session" for alias in node.names)
            ):
                offenders.append(relative)
            if isinstance(node, ast.Import) and any(
                alias.name == "perdure.session" for alias in node.names
            ):
                offenders.append(relative)
    assert not offenders


def test_each_store_comes_from_its_own_package_as_from_perdure() -> None:
    """``from perdure.stores.<backend> import <Store>`` works for every local backend, lazily."""
    code = (
        "import sys\n"
        "import perdure.stores.file as package\n"
        "import perdure.stores.file.journal\n"
        "assert 'perdure.stores.file.store' not in sys.modules\n"
        "from perdure.stores.file import FileSessionStore\n"
        "from perdure.stores.sqlite import SQLiteSessionStore\n"
        "from perdure.stores.memory import MemorySessionStore\n"
        "import perdure\n"
        "assert FileSessionStore is perdure.FileSessionStore\n"
        "assert SQLiteSessionStore is perdure.SQLiteSessionStore\n"
        "assert MemorySessionStore is perdure.MemorySessionStore\n"
        "assert 'FileSessionStore' in dir(package)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
