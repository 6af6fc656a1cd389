"""The one parser of backend URLs (STYLE §8): ``scheme:path`` for every opener.

:func:`perdure.storage.open_storage` and :func:`perdure.session.open_store` both
split their URL here, so ``file:``, ``sqlite:`` and ``memory:`` mean the same in
each, and a server scheme that this version of perdure does not ship yet
(``postgresql://``, ``redis://``, ``s3://``) gets the same clear refusal that names
the backend, its extra and the issue that brings it — never "unknown scheme".

Pure (no I/O, no backend imported): it sits with :mod:`perdure.errors` in layer 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = ["LATER_SCHEMES", "LaterBackend", "split_url"]


class LaterBackend(NamedTuple):
    """A backend that joins perdure with a later issue."""

    name: str
    extra: str
    issue: int


LATER_SCHEMES: dict[str, LaterBackend] = {
    "postgresql": LaterBackend("PostgreSQL", "postgres", 17),
    "postgres": LaterBackend("PostgreSQL", "postgres", 17),
    "redis": LaterBackend("Redis", "redis", 18),
    "rediss": LaterBackend("Redis", "redis", 18),
    "s3": LaterBackend("S3", "s3", 19),
}
"""Server schemes this version refuses, with what will bring them."""

_NO_PATH = frozenset({"memory"})


def split_url(url: object, schemes: Sequence[str], what: str) -> tuple[str, Path | None]:
    """Split ``scheme:path`` into the scheme and its path (``None`` for ``memory:``).

    ``scheme://path`` is read as ``scheme:path`` (so ``sqlite:///abs/p.db`` names
    ``/abs/p.db``); ``~`` is expanded.

    Args:
        url: The URL to split.
        schemes: The schemes the caller opens.
        what: What the URL opens (``"store"``, ``"storage"``), for the messages.

    Raises:
        ValueError: not a string, no scheme, a scheme of a backend this version does
            not ship (the message names the backend, its extra and its issue), an
            unknown scheme, or no path where one is needed (the message names
            ``what`` and lists the known schemes).
    """
    known = ", ".join(f"{s}:" for s in schemes)
    if not isinstance(url, str) or ":" not in url:
        raise ValueError(f"{what} URL {url!r} has no scheme; use one of {known}")
    scheme, _, rest = url.partition(":")
    if scheme not in schemes:
        later = LATER_SCHEMES.get(scheme)
        if later is not None:
            raise ValueError(
                f"{what} URL {url!r}: the {later.name} backend is not in this version of "
                f"perdure (it comes with issue {later.issue}, as the extra "
                f"'perdure[{later.extra}]'); available: {known}"
            )
        raise ValueError(f"unknown {what} scheme {scheme!r} in {url!r}; known: {known}")
    if scheme in _NO_PATH:
        return scheme, None
    if rest.startswith("//"):
        rest = rest[2:]
    if not rest:
        raise ValueError(f"{what} URL {url!r} names no path")
    return scheme, Path(rest).expanduser()
