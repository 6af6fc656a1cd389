"""The documentation site stays true: every code block of every page runs, and it builds.

Each ``python`` block of ``docs/**/*.md`` runs on its own (as the README's do, with
the machinery of ``tests/doc_examples.py``); a block reading ``REDIS_URL`` or
``DATABASE_URL`` runs against the test servers. A page's ``bash`` blocks run in order
in one fresh directory, ``perdure`` being this checkout's. ``mkdocs build --strict``
must pass: a broken link, a missing page or a docstring mkdocstrings cannot render
fails it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import doc_examples
from perdure.cli._common import exit_code_for
from perdure.errors import PerdureError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
FENCES = {"python", "bash", "json", "text"}  # python and bash run, json parses, text shows


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


PYTHON = [
    (page, index, block)
    for page in PAGES
    for index, block in enumerate(doc_examples.blocks(page.read_text(encoding="utf-8"), "python"))
]
BASH_PAGES = [p for p in PAGES if doc_examples.blocks(p.read_text(encoding="utf-8"), "bash")]


def test_the_docs_have_the_promised_pages() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {
        "index.md",
        "concepts.md",
        "sessions.md",
        "stores.md",
        "checkpoints.md",
        "memory.md",
        "production.md",
        "recovery.md",
        "migrating.md",
        "reference/cli.md",
        "reference/errors.md",
        "reference/formats.md",
        "reference/api.md",
    } <= names


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_fence_names_a_known_language(page: Path) -> None:
    """A block in an unknown language would be skipped by the runner below: refuse it."""
    text = page.read_text(encoding="utf-8")
    opened = doc_examples.fence_languages(text)
    unknown = [lang for lang in opened if lang not in FENCES]
    assert not unknown, f"{_name(page)}: fences {unknown} (allowed: {sorted(FENCES)})"


@pytest.mark.parametrize(
    ("page", "index", "block"),
    PYTHON,
    ids=[f"{_name(p)}#{i + 1}" for p, i, _ in PYTHON],
)
def test_docs_python_block_runs(
    page: Path, index: int, block: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each block runs alone, in a fresh working directory (a relative path stays there)."""
    name = f"{_name(page)} example {index + 1}"
    monkeypatch.chdir(tmp_path)
    if doc_examples.needs_servers(block):
        with doc_examples.server_env(monkeypatch):
            doc_examples.run_python(block, name)
    else:
        doc_examples.run_python(block, name)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_docs_json_blocks_parse(page: Path) -> None:
    for block in doc_examples.blocks(page.read_text(encoding="utf-8"), "json"):
        json.loads(block)


@pytest.mark.parametrize("page", BASH_PAGES, ids=_name)
def test_docs_bash_blocks_run(page: Path, tmp_path: Path) -> None:
    blocks = doc_examples.blocks(page.read_text(encoding="utf-8"), "bash")
    doc_examples.run_bash(blocks, tmp_path, label=_name(page))


def _mkdocs() -> list[str]:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("MkDocs is not installed: pip install -e '.[docs]'")
    return [sys.executable, "-m", "mkdocs"]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [*_mkdocs(), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "perdure sessions list" in cli_page  # the CLI reference was generated
    api_page = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "FileSessionStore" in api_page  # from the docstrings
    assert "durability" in api_page


def _error_classes() -> list[type[PerdureError]]:
    found: list[type[PerdureError]] = []
    stack: list[type[PerdureError]] = [PerdureError]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return [c for c in found if c.__module__ == "perdure.errors"]


def test_the_errors_page_lists_every_code_with_its_exit_status() -> None:
    """Each ``perdure.errors`` class has its row, with the status the CLI exits with."""
    page = (DOCS / "reference" / "errors.md").read_text(encoding="utf-8")
    rows = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), int(cells[4]))
    for cls in _error_classes():
        assert cls.code in rows, f"docs/reference/errors.md has no row for {cls.code!r}"
        name, status = rows[cls.code]
        assert name == cls.__name__, f"{cls.code}: the page says {name}"
        error = cls.__new__(cls)
        assert status == exit_code_for(error), f"{cls.code}: the page says exit {status}"
    assert len(rows) == len(_error_classes())
