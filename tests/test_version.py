"""The version lives in one place, and everything that shows it agrees.

``src/perdure/__init__.py`` holds ``__version__``; ``pyproject.toml`` reads it
(``dynamic = ["version"]``, ``[tool.hatch.version]``), so the installed package's
metadata, ``perdure.__version__`` and ``perdure --version`` say the same thing.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import perdure

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"], "a second copy of the version in pyproject"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "src/perdure/__init__.py"


def test_the_version_is_well_formed() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", perdure.__version__)


def test_metadata_package_and_command_agree() -> None:
    metadata = importlib.metadata.version("perdure")
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == f"perdure, version {perdure.__version__}"
    assert metadata == perdure.__version__


def test_the_changelog_names_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(perdure.__version__)}\b", changelog, flags=re.M)


def test_the_license_file_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a notice
