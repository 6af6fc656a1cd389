"""The package's map holds: imports only point down the layers (SPEC §1).

Read from the source with ``ast``, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import perdure

SRC = Path(perdure.__file__).parent

# SPEC §1, bottom to top. A package not listed here fails the test: place it first.
LAYERS: dict[str, int] = {
    "_runtime": 0,
    "types": 1,
    "errors": 1,
    "hygiene": 1,
    "state": 2,
    "storage": 3,
    "crypto": 3,
    "models": 4,
    "tools": 4,
    "hooks": 5,
    "agent": 5,
    "injection": 6,
    "memory": 6,
    "session": 7,
    "stores": 7,
    "checkpoints": 7,
    "snapshots": 7,
    "maintenance": 7,
    "rotation": 7,
    "migrate": 7,
    "multiagent": 7,
    "bidi": 7,
    "cli": 8,
    "server": 8,
    "adapters": 8,
    "testing": 8,
    "__main__": 8,
    "__init__": 8,
}

# Inside layer 7 the rules sit below the backends, and the backends below what uses them.
RULES = {
    f"session.{name}"
    for name in ("rules", "store", "ids", "paging", "ulid", "attachments", "results", "_locks")
}
SUBLAYERS: list[set[str]] = [
    RULES,
    {"checkpoints"},
    {"stores"},
    {"session.session", "session.open_store", "snapshots", "maintenance", "rotation", "migrate"},
    {"multiagent", "bidi"},
]


def _imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every perdure import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "perdure":
                yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "perdure":
                    yield node.lineno, alias.name, []


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        yield ".".join(rel.parts), path


def _sublayer(module: str) -> int | None:
    for level, names in enumerate(SUBLAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return level
    return None


def test_every_package_has_a_layer() -> None:
    tops = {module.split(".")[0] for module, _ in _modules()}
    assert tops <= set(LAYERS), f"place these packages in SPEC §1's layers: {tops - set(LAYERS)}"


def test_imports_only_point_down_the_layers() -> None:
    upward = []
    for module, path in _modules():
        here = LAYERS[module.split(".")[0]]
        for line, target, _ in _imports(path):
            parts = target.split(".")
            if len(parts) == 1:
                if here < 8:
                    upward.append(f"{module}:{line} imports the package face `perdure`")
                continue
            if LAYERS.get(parts[1], 99) > here:
                upward.append(f"{module}:{line} imports {target}")
    assert upward == []


def test_inside_the_session_layer_the_rules_sit_below_the_backends() -> None:
    upward = []
    for module, path in _modules():
        here = _sublayer(module)
        if here is None:
            continue
        for line, target, names in _imports(path):
            inner = target.removeprefix("perdure.")
            candidates = [inner] + [f"{inner}.{n}" for n in names]
            levels = [lvl for c in candidates if (lvl := _sublayer(c)) is not None]
            if levels and min(levels) > here:
                upward.append(f"{module}:{line} imports {target}")
    assert upward == []


def test_the_readme_map_names_only_places_that_exist() -> None:
    readme = (SRC.parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    named = {
        cell.strip("`")
        for row in rows
        for cell in row.split("`")[1::2]
        if cell.endswith(("/", ".py"))
    }
    assert len(named) > 15
    tops = {p.name for p in SRC.iterdir()}
    missing = sorted(
        name
        for name in named
        if not (SRC / name).exists()
        and not any((SRC / top / name).exists() for top in tops if (SRC / top).is_dir())
    )
    assert missing == []
