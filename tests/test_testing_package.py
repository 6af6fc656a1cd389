"""perdure.testing itself: the docs show the third-party example verbatim, and
``import perdure`` never loads the suites (nor pytest or hypothesis)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_docs_show_this_example_verbatim() -> None:
    here = Path(__file__).parent
    doc = (here.parent / "docs" / "testing.md").read_text(encoding="utf-8")
    fence = "`" * 3  # the doc's fences
    blocks = re.findall(rf"^{fence}python\n(.*?)^{fence}$", doc, flags=re.S | re.M)
    assert blocks[0] == (here / "test_third_party_backend.py").read_text(encoding="utf-8")
    assert blocks[1] == (here / "toy_backends.py").read_text(encoding="utf-8")


def test_importing_perdure_never_imports_the_suites() -> None:
    code = (
        "import sys, perdure, perdure.session, perdure.storage, perdure.memory\n"
        "assert 'perdure.testing' not in sys.modules, 'perdure.testing was imported'\n"
        "assert 'pytest' not in sys.modules and 'hypothesis' not in sys.modules\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
