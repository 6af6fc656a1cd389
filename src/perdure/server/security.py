"""The guard in front of every route: token, host, media type and body size.

A pure ASGI middleware, so it runs before any route reads anything:

- with a token, every ``/api/`` request needs ``Authorization: Bearer <token>``
  (compared in constant time), else 401 ``unauthorized``;
- without a token (loopback only, :func:`check_bind`), the ``Host`` header must name
  loopback, so a web page on another site that rebinds its DNS name to 127.0.0.1
  cannot reach the API (403 ``forbidden_host``);
- a mutating request (POST, DELETE) must be ``Content-Type: application/json``: a
  cross-site HTML form cannot send that without a CORS preflight, which this server
  never answers (415 ``unsupported_media_type``);
- a request body past the cap is refused with 413 ``request_too_large``: at once
  when ``Content-Length`` says so, else when the bytes read pass it
  (:func:`read_body`).
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from perdure.server.errors import ApiError, error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    """True when ``host`` (a bind address or a ``Host`` name) is this machine only."""
    name = host.strip().lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on anything but loopback without a token.

    Raises:
        ValueError: ``host`` is not loopback and there is no token (names both options).
    """
    if not token and not is_loopback(host):
        raise ValueError(
            f"--host {host} is not loopback: give a token (--token or PERDURE_TOKEN) "
            "before serving the API to the network"
        )


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port."""
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """The ASGI middleware described in the module docstring."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body: int) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check(scope)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        scope.setdefault("state", {})["max_body"] = self.max_body
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> None:
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        path: str = scope["path"]
        if self.token is None:
            host = headers.get("host", b"").decode("latin-1")
            if host and not is_loopback(_host_name(host)):
                raise ApiError(403, "forbidden_host", f"Host {host!r} is not loopback")
        elif path.startswith("/api/"):
            given = headers.get("authorization", b"")
            scheme, _, credential = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credential.strip(), self.token
            ):
                raise ApiError(
                    401,
                    "unauthorized",
                    "missing or wrong token: send Authorization: Bearer <token>",
                    {"WWW-Authenticate": "Bearer"},
                )
        if scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
            kind = headers.get("content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                raise ApiError(
                    415,
                    "unsupported_media_type",
                    f"{scope['method']} needs Content-Type: application/json",
                )
        length = headers.get("content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                raise ApiError(400, "bad_request", "Content-Length is not a number") from None
            if size > self.max_body:
                raise ApiError(
                    413, "request_too_large", f"the body is {size} bytes; at most {self.max_body}"
                )


async def read_body(request: Request) -> bytes:
    """The request body, refused with 413 once it passes the cap (streamed bodies too)."""
    cap: int = request.scope.get("state", {}).get("max_body", 0)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise ApiError(413, "request_too_large", f"the body passes {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
