"""The one parser of backend URLs (STYLE §8): ``scheme:path`` for every opener.

:func:`perdure.storage.open_storage` and :func:`perdure.session.open_store` both
split their URL here, so ``file:``, ``sqlite:``, ``memory:`` and ``postgresql://``
mean the same in each, and a server scheme that an opener does not ship yet
(``s3://``) gets the same clear refusal that names the backend, its
extra and the issue that brings it — never "unknown scheme".

A server URL (``postgresql://…``) names no path: :func:`split_url` gives ``None``
for it, and :func:`postgres_url` splits perdure's own options (``?schema=…``) from
what goes to the driver.

Pure (no I/O, no backend imported): it sits with :mod:`perdure.errors` in layer 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "LATER_SCHEMES",
    "POSTGRES_OPTIONS",
    "POSTGRES_STORAGE_OPTIONS",
    "REDIS_OPTIONS",
    "REDIS_STORAGE_OPTIONS",
    "LaterBackend",
    "local_options",
    "postgres_url",
    "s3_url",
    "split_url",
]


class LaterBackend(NamedTuple):
    """A backend that joins perdure with a later issue (or that only some openers open)."""

    name: str
    extra: str
    issue: int
    opened_by: str = ""  # the opener that does take it, if one does


LATER_SCHEMES: dict[str, LaterBackend] = {
    "s3": LaterBackend("S3", "s3", 19, opened_by="storage"),
}
"""Server schemes an opener refuses, with what brings them (``opened_by``: the
opener that takes them already; ``s3://`` is blob storage, not a session store)."""

_NO_PATH = frozenset({"memory", "postgresql", "postgres", "redis", "rediss"})

POSTGRES_OPTIONS: dict[str, type] = {
    "schema": str,
    "ttl": float,
    "lease": float,
    "max_checkpoints": int,
    "max_checkpoint_age": float,
    "durability": str,
}
"""perdure's options a ``postgresql://`` store URL may carry in its query, and their types."""

LOCAL_OPTIONS: dict[str, dict[str, type]] = {
    "file": {"ttl": float, "max_checkpoints": int, "durability": str},
    "sqlite": {"ttl": float, "max_checkpoints": int, "durability": str},
    "memory": {"ttl": float, "max_checkpoints": int},
}
"""perdure's options a ``file:``, ``sqlite:`` or ``memory:`` store URL may carry
after a ``?`` (``sqlite:./p.db?ttl=1800``), and their types."""

REDIS_OPTIONS: dict[str, type] = {
    "prefix": str,
    "ttl": float,
    "lease": float,
    "max_checkpoints": int,
    "max_checkpoint_age": float,
}
"""perdure's options a ``redis://`` store URL may carry in its query, and their types."""

POSTGRES_STORAGE_OPTIONS: dict[str, type] = {"schema": str, "table": str}
"""perdure's options a ``postgresql://`` blob storage URL may carry, and their types."""

REDIS_STORAGE_OPTIONS: dict[str, type] = {"prefix": str}
"""perdure's options a ``redis://`` blob storage URL may carry, and their types."""

S3_STORAGE_OPTIONS: dict[str, type] = {
    "endpoint_url": str,
    "region": str,
    "retry_timeout": float,
    "max_retries": int,
    "connect_timeout": float,
    "timeout": float,
}
"""The options an ``s3://bucket/prefix`` blob storage URL may carry, and their types."""

_PERDURE_OPTIONS = (
    frozenset(POSTGRES_OPTIONS)
    | frozenset(POSTGRES_STORAGE_OPTIONS)
    | frozenset(REDIS_OPTIONS)
    | frozenset(REDIS_STORAGE_OPTIONS)
)


def split_url(url: object, schemes: Sequence[str], what: str) -> tuple[str, Path | None]:
    """Split ``scheme:path`` into the scheme and its path (``None`` for ``memory:`` and
    a server URL).

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
        if later is not None and later.opened_by:
            raise ValueError(
                f"{what} URL {url!r}: perdure has no {later.name} {what}; issue "
                f"{later.issue} brought {later.name} as blob {later.opened_by} for snapshots "
                f"and checkpoints (open_{later.opened_by}, the extra 'perdure[{later.extra}]'); "
                f"available: {known}"
            )
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


def _take_option(
    found: dict[str, object], key: str, value: str, kind: type, url: str, what: str
) -> None:
    """Put option ``key`` into ``found``, converted to ``kind``; the one rule of every URL.

    Raises:
        ValueError: ``key`` given twice, or ``value`` not of its type.
    """
    if key in found:
        raise ValueError(f"{what} URL {url!r} gives {key}= twice")
    try:
        found[key] = kind(value)
    except ValueError:
        wanted = "an integer" if kind is int else "a number"
        raise ValueError(f"{what} URL {url!r}: {key}={value!r} is not {wanted}") from None


def local_options(url: str, scheme: str, what: str = "store") -> tuple[str, dict[str, object]]:
    """Split a ``file:``/``sqlite:``/``memory:`` store URL into the URL without its
    options and the options (:data:`LOCAL_OPTIONS`), converted to their types.

    ``sqlite:./p.db?ttl=60`` gives ``("sqlite:./p.db", {"ttl": 60.0})``. Only a
    ``?`` followed by ``name=value`` pairs starts options: a path with another ``?``
    in it stays a path.

    Raises:
        ValueError: an option this store does not take, given twice, or whose value is
            not of its type; the message names it.
    """
    from urllib.parse import parse_qsl

    head, mark, query = url.rpartition("?")
    if not mark or not query:
        return url, {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return url, {}
    options = LOCAL_OPTIONS[scheme]
    found: dict[str, object] = {}
    for key, value in pairs:
        kind = options.get(key)
        if kind is None:
            raise ValueError(
                f"{what} URL {url!r}: {key}= is not an option of a {scheme}: {what}; "
                f"its options are {', '.join(f'{o}=' for o in options)}"
            )
        _take_option(found, key, value, kind, url, what)
    return head, found


def postgres_url(
    url: str, options: Mapping[str, type] = POSTGRES_OPTIONS, what: str = "store"
) -> tuple[str, dict[str, object]]:
    """Split a server URL into the URL for the driver and perdure's options.

    Used for ``postgresql://`` and, with :data:`REDIS_OPTIONS`, ``redis://`` URLs.

    ``postgresql://user@host:5432/db?schema=app&ttl=1800&sslmode=require`` gives
    ``("postgresql://user@host:5432/db?sslmode=require", {"schema": "app", "ttl":
    1800.0})``: the ``options`` (:data:`POSTGRES_OPTIONS` for a session store,
    :data:`POSTGRES_STORAGE_OPTIONS` for blob storage) are taken out (libpq would
    refuse them), converted to their types; every other parameter stays byte for
    byte as written: libpq decodes ``%XX`` but not ``+``, so re-encoding a value
    (``options=-c%20statement_timeout%3D700``) could change what the driver reads.

    Raises:
        ValueError: an option given twice, whose value is not of its type, or that
            is another opener's (``table=`` in a store URL, say); the message names
            it and ``what`` the URL opens.
    """
    from urllib.parse import parse_qsl, urlsplit, urlunsplit

    parts = urlsplit(url)
    kept: list[str] = []  # the driver's parameters, as written in the URL
    found: dict[str, object] = {}
    for raw in parts.query.split("&"):
        pair = parse_qsl(raw, keep_blank_values=True)
        if not pair:
            continue  # an empty parameter (``&&``), as parse_qsl skips it
        key, value = pair[0]
        kind = options.get(key)
        if kind is None:
            if key in _PERDURE_OPTIONS:
                raise ValueError(
                    f"{what} URL {url!r}: {key}= is not an option of the {what}; "
                    f"its options are {', '.join(f'{o}=' for o in options)}"
                )
            kept.append(raw)
            continue
        _take_option(found, key, value, kind, url, what)
    return urlunsplit(parts._replace(query="&".join(kept))), found


def s3_url(url: str, what: str = "storage") -> tuple[str, str, dict[str, object]]:
    """Split ``s3://bucket/prefix?endpoint_url=…&region=…`` into the bucket, the prefix
    and the options (:data:`S3_STORAGE_OPTIONS`), converted to their types.

    Raises:
        ValueError: no bucket, an empty segment in the prefix, an unknown option, one
            given twice or not of its type; the message names it.
    """
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(url)
    bucket = parts.netloc
    if parts.scheme != "s3" or not bucket:
        raise ValueError(f"{what} URL {url!r} names no bucket: use s3://bucket/prefix")
    if "@" in bucket:
        raise ValueError(
            f"{what} URL {url!r}: credentials do not go in the URL; set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY in the environment"
        )
    prefix = unquote(parts.path).strip("/")
    found: dict[str, object] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        kind = S3_STORAGE_OPTIONS.get(key)
        if kind is None:
            raise ValueError(
                f"{what} URL {url!r}: {key}= is not an option of s3:// {what}; its options "
                f"are {', '.join(f'{o}=' for o in S3_STORAGE_OPTIONS)}"
            )
        _take_option(found, key, value, kind, url, what)
    return bucket, prefix, found
