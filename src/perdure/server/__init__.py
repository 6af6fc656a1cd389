"""``perdure serve``: a JSON API and a web page over a session store (SPEC §10).

Needs ``perdure[server]`` (Starlette and uvicorn)::

    from perdure.server import create_app
    app = create_app(open_store("sqlite:./perdure.db"), token="s3cret")

The routes answer what the ``perdure`` commands print with ``--json``: both call
:mod:`perdure.cli.ops`. Importing this package imports Starlette.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "perdure serve needs Starlette and uvicorn: pip install 'perdure[server]'"
    ) from exc

from perdure.server.app import MAX_BODY, create_app
from perdure.server.memory import MemoryBrowser
from perdure.server.security import check_bind

__all__ = ["MAX_BODY", "MemoryBrowser", "check_bind", "create_app"]
