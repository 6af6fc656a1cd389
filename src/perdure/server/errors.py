"""How ``perdure serve`` answers a failure: one status per error code, one error body.

Every failed request answers ``{"error": {"code": …, "message": …}}`` (SPEC §10) and
never a stack trace: perdure errors keep their own ``code``, bad input is 400
``bad_request`` (never 422), anything unexpected is 500 ``internal_error`` with a
fixed message, its traceback logged on the server only.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.responses import Response

from perdure.errors import PerdureError

log = logging.getLogger("perdure.server")

STATUS_BY_CODE: dict[str, int] = {
    "session_not_found": 404,
    "checkpoint_not_found": 404,
    "session_locked": 409,
    "session_conflict": 409,
    "turn_running": 409,
    "storage_locked": 409,
    "storage_conflict": 409,
    "memory_store_locked": 409,
    "store_not_wired": 409,
    "session_mismatch": 400,
    "checkpoint_import_invalid": 400,
    "store_unavailable": 503,
    "session_store_corrupted": 500,
}
"""The HTTP status of each perdure error code; any other code is 500."""


class ApiError(Exception):
    """A refusal the server itself decides (bad token, unknown route, body too large)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` as compact UTF-8 JSON."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return Response(data, status, headers=headers, media_type="application/json")


def error_body(code: str, message: str) -> dict[str, Any]:
    """The one error body of SPEC §10."""
    return {"error": {"code": code, "message": message}}


def error_response(exc: BaseException) -> Response:
    """The response for an exception a route raised; unexpected ones are logged here."""
    if isinstance(exc, ApiError):
        return json_response(error_body(exc.code, exc.message), exc.status, exc.headers)
    if isinstance(exc, PerdureError):
        status = STATUS_BY_CODE.get(exc.code, 500)
        return json_response(error_body(exc.code, exc.message), status)
    if isinstance(exc, ValueError | TypeError):
        return json_response(error_body("bad_request", str(exc)), 400)
    if isinstance(exc, OSError):
        log.error("store I/O failed", exc_info=exc)
        return json_response(error_body("store_error", f"the store failed: {exc}"), 500)
    log.error("unexpected error", exc_info=exc)
    return json_response(error_body("internal_error", "internal error; see the server log"), 500)
