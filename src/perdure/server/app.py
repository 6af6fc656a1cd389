"""The ASGI app of ``perdure serve``: the JSON API of SPEC §10 and the web page.

Every route is a thin face over :mod:`perdure.cli.ops` (the operations the CLI
runs), :func:`perdure.session.read_history_page` and
:func:`perdure.maintenance.verify_store`: no rule is written twice. The routes, their
bodies and statuses are listed in :mod:`perdure.server.openapi`, served at
``/openapi.json``; a test holds the two together.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from perdure import __version__
from perdure.checkpoints.export import check_key
from perdure.checkpoints.store import check_checkpoint_id
from perdure.cli import ops
from perdure.maintenance import verify_store
from perdure.server.errors import ApiError, error_body, error_response, json_response
from perdure.server.jobs import Job, Jobs
from perdure.server.listing import SessionIndex
from perdure.server.memory import MemoryBrowser
from perdure.server.openapi import openapi_document
from perdure.server.security import Guard, read_body
from perdure.session.ids import validate_session_id
from perdure.session.session import read_history_page
from perdure.session.store import SessionStore
from perdure.types.json import encode_bytes_values

MAX_BODY = 64 * 1024 * 1024
"""Largest request body by default (an import carries its images inline)."""

MAX_PAGE = 1000
"""Most sessions or messages one request may ask for."""

Handler = Callable[[Request], Awaitable[Response]]


class Inspector:
    """The state the routes share: the store, the memory store, the index, the jobs."""

    def __init__(
        self, store: SessionStore, memory: MemoryBrowser | None, signing_key: bytes | None
    ) -> None:
        self.store = store
        self.memory = memory
        self.signing_key = signing_key  # signs exports on request, verifies every import
        self.index = SessionIndex(store)
        self.jobs = Jobs()


def _api(handler: Callable[[Inspector, Request], Awaitable[Response]]) -> Handler:
    """A route: any exception becomes the one error body, never a traceback."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request.app.state.inspector, request)
        except Exception as exc:
            return error_response(exc)

    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


def int_param(request: Request, name: str, default: int, *, low: int, high: int) -> int:
    """Query parameter ``name`` as an int within [low, high].

    Raises:
        ValueError: not an integer or out of range (the message names the parameter).
    """
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"[+-]?\d{1,19}", raw.strip()):
        raise ValueError(f"{name} must be an integer, got {raw!r}")
    value = int(raw)
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def bool_param(request: Request, name: str) -> bool:
    """Query parameter ``name`` as a boolean (``true``/``false``, ``1``/``0``); absent is false."""
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise ValueError(f"{name} must be true or false, got {raw!r}")
    return raw in ("true", "1")


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}``."""
    body = await read_body(request)
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"the body must be a JSON object, got {type(value).__name__}")
    return value


def session_id_of(request: Request) -> str:
    return validate_session_id(request.path_params["session_id"], "session id")


def checkpoint_id_of(request: Request) -> str:
    checkpoint_id: str = request.path_params["checkpoint_id"]
    check_checkpoint_id(checkpoint_id)
    return checkpoint_id


# ------------------------------------------------------------------------- sessions


def _iso(epoch: float) -> str:
    """``epoch`` as ISO-8601 UTC with ``Z``, as the stores write times."""
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


@_api
async def list_sessions(app: Inspector, request: Request) -> Response:
    """Sessions, metadata only, a page of the server's listing (:mod:`.listing`): by id
    from ``after`` or ``offset``, or by update time (newest first) from ``offset``;
    ``q`` keeps the ids that contain it."""
    limit = int_param(request, "limit", 50, low=1, high=MAX_PAGE)
    order = request.query_params.get("order", "id")
    if order not in ("id", "updated"):
        raise ValueError(f"order must be id or updated, got {order!r}")
    contains = request.query_params.get("q") or None
    after = request.query_params.get("after") or None
    offset = int_param(request, "offset", 0, low=0, high=10**9)
    page, start, total, read_at = await app.index.page(
        order=order, contains=contains, after=after, offset=offset, limit=limit
    )
    end = start + len(page)
    more = end < total
    now = time.time()
    return json_response(
        {
            "sessions": [ops.session_dict(m, now) for m in page],
            "next_after": page[-1].session_id if more and order == "id" and not contains else None,
            "offset": start,
            "next_offset": end if more else None,
            "total": total,
            "as_of": _iso(read_at),
        }
    )


@_api
async def show_session(app: Inspector, request: Request) -> Response:
    """One session: ``SessionMeta``'s fields, a summary of its state, its checkpoints."""
    session_id = session_id_of(request)
    return json_response(await ops.describe_session(app.store, session_id, verify_history=False))


@_api
async def history(app: Inspector, request: Request) -> Response:
    """A page of the history; a tool call and its result are never split."""
    session_id = session_id_of(request)
    offset = int_param(request, "offset", 0, low=0, high=10**12)
    limit = int_param(request, "limit", 50, low=1, high=MAX_PAGE)
    page = await read_history_page(app.store, session_id, offset=offset, limit=limit)
    return json_response(
        {
            "session_id": session_id,
            "messages": encode_bytes_values(page.messages),
            "offset": page.offset,
            "next_offset": page.next_offset,
            "total": page.total,
        }
    )


# ---------------------------------------------------------------------- checkpoints


@_api
async def list_checkpoints(app: Inspector, request: Request) -> Response:
    """The session's checkpoints, oldest first, damaged ones marked."""
    session_id = session_id_of(request)
    found = await ops.list_checkpoints(app.store, session_id)
    return json_response(
        {"session_id": session_id, "checkpoints": [ops.checkpoint_dict(c) for c in found]}
    )


@_api
async def create_checkpoint(app: Inspector, request: Request) -> Response:
    """Checkpoint the session now; 201 with the checkpoint."""
    session_id = session_id_of(request)
    body = await json_object(request)
    label = body.get("label")
    if label is not None and not isinstance(label, str):
        raise ValueError(f"label must be a string or null, got {type(label).__name__}")
    meta = await ops.create_checkpoint(app.store, session_id, label)
    app.index.invalidate()
    return json_response(meta.to_dict(), 201)


@_api
async def restore_checkpoint(app: Inspector, request: Request) -> Response:
    """Roll the session back to the checkpoint (a ``pre_restore`` checkpoint first)."""
    session_id, checkpoint_id = session_id_of(request), checkpoint_id_of(request)
    body = await json_object(request)
    keep = body.get("checkpoint", True)
    if not isinstance(keep, bool):
        raise ValueError(f"checkpoint must be true or false, got {keep!r}")
    result = await ops.restore_checkpoint(app.store, session_id, checkpoint_id, checkpoint=keep)
    app.index.invalidate()
    if result.status != "restored":
        reason = result.reason or "rejected"
        raise ApiError(409, reason, f"restore of session {session_id!r} rejected: {reason}")
    return json_response({"session_id": session_id, "checkpoint_id": checkpoint_id, **vars(result)})


@_api
async def fork_checkpoint(app: Inspector, request: Request) -> Response:
    """A new session from the checkpoint; 201 with its id."""
    session_id, checkpoint_id = session_id_of(request), checkpoint_id_of(request)
    await json_object(request)
    new_id = await ops.fork_checkpoint(app.store, session_id, checkpoint_id)
    app.index.invalidate()
    return json_response(
        {"session_id": new_id, "source_session_id": session_id, "checkpoint_id": checkpoint_id},
        201,
    )


@_api
async def export_checkpoint(app: Inspector, request: Request) -> Response:
    """The checkpoint as a verifiable export (``perdure-checkpoint/1``), as a download;
    with ``signed=true``, signed with the server's key (400 when it has none)."""
    session_id, checkpoint_id = session_id_of(request), checkpoint_id_of(request)
    key = None
    if bool_param(request, "signed"):
        if app.signing_key is None:
            raise ApiError(
                400,
                "signing_key_not_configured",
                "this server has no signing key: start it with --signing-key-file FILE",
            )
        key = app.signing_key
    data = await ops.export_checkpoint(app.store, session_id, checkpoint_id, key)
    name = f"{checkpoint_id}.checkpoint.json"
    return Response(
        data,
        200,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
        media_type="application/json",
    )


@_api
async def import_checkpoint(app: Inspector, request: Request) -> Response:
    """Add an exported checkpoint (the body) to the session; 201 with the checkpoint.
    A server with a signing key refuses an export not signed with it."""
    session_id = session_id_of(request)
    create = bool_param(request, "create")
    data = await read_body(request)
    meta = await ops.import_checkpoint(app.store, session_id, data, create, app.signing_key)
    app.index.invalidate()
    return json_response(meta.to_dict(), 201)


# --------------------------------------------------------------------- verify, jobs


async def _session_ids(request: Request) -> list[str] | None:
    body = await json_object(request)
    ids = body.get("session_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("session_ids must be a list of session ids")
    return [validate_session_id(i, "session_ids") for i in ids]


@_api
async def verify(app: Inspector, request: Request) -> Response:
    """Verify the store (or the sessions named); answers with the report."""
    report = await verify_store(app.store, session_ids=await _session_ids(request))
    return json_response(report.to_dict())


@_api
async def start_verify(app: Inspector, request: Request) -> Response:
    """Verify as a job; 202 with the job, polled at ``/api/jobs/{job_id}``."""
    ids = await _session_ids(request)

    async def work(job: Any) -> dict[str, Any]:
        report = await verify_store(app.store, session_ids=ids, progress=job.progress)
        return report.to_dict()

    return json_response(app.jobs.start("verify", work, phase="verifying").to_dict(), 202)


@_api
async def start_import(app: Inspector, request: Request) -> Response:
    """Import an export (the body) as a job; 202 with the job, whose result is the
    checkpoint. Its progress follows the checks (phase ``verifying``), then the
    write (phase ``writing``)."""
    session_id = session_id_of(request)
    create = bool_param(request, "create")
    data = await read_body(request)

    async def work(job: Job) -> dict[str, Any]:
        def progress(done: int, total: int) -> None:
            job.progress(done, total)
            if done == total:
                job.phase = "writing"

        meta = await ops.import_checkpoint(
            app.store, session_id, data, create, app.signing_key, progress
        )
        app.index.invalidate()
        return meta.to_dict()

    return json_response(app.jobs.start("import", work, phase="verifying").to_dict(), 202)


@_api
async def get_job(app: Inspector, request: Request) -> Response:
    """A job's state, progress and (when done) result or error."""
    job_id = request.path_params["job_id"]
    job = app.jobs.get(job_id)
    if job is None:
        raise ApiError(
            404, "job_not_found", f"no job {job_id!r} (jobs live until the server stops)"
        )
    return json_response(job.to_dict())


# ---------------------------------------------------------------------------- memory


def _memory(app: Inspector) -> MemoryBrowser:
    if app.memory is None:
        raise ApiError(404, "memory_not_configured", "no memory store: start with --memory URL")
    return app.memory


@_api
async def memory_entries(app: Inspector, request: Request) -> Response:
    """A namespace's memories, oldest first, or (``q``) the best matches."""
    browser = _memory(app)
    return json_response(
        await browser.entries(
            request.path_params["namespace"],
            query=request.query_params.get("q") or None,
            offset=int_param(request, "offset", 0, low=0, high=10**12),
            limit=int_param(request, "limit", 50, low=1, high=MAX_PAGE),
        )
    )


@_api
async def delete_memory(app: Inspector, request: Request) -> Response:
    """Delete one memory; 404 ``memory_not_found`` when the namespace holds no such id."""
    browser = _memory(app)
    namespace = request.path_params["namespace"]
    raw = request.path_params["memory_id"]
    if not re.fullmatch(r"\d{1,18}", raw):
        raise ValueError(f"memory id must be a positive integer, got {raw!r}")
    if not await browser.delete(namespace, int(raw)):
        raise ApiError(404, "memory_not_found", f"no memory {raw} in namespace {namespace!r}")
    return json_response({"namespace": namespace, "memory_id": int(raw), "deleted": True})


# ---------------------------------------------------------------------- info, page


@_api
async def info(app: Inspector, request: Request) -> Response:
    """What the page needs to know of this server."""
    return json_response(
        {
            "version": __version__,
            "memory": app.memory is not None,
            "signing": app.signing_key is not None,
        }
    )


async def openapi(request: Request) -> Response:
    return json_response(openapi_document())


_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def static(request: Request) -> Response:
    """The page's files, shipped inside the package (no build step)."""
    name = request.path_params.get("name", "index.html")
    if name not in _STATIC:
        return error_response(ApiError(404, "not_found", f"no file {name!r}"))
    data = resources.files("perdure.server").joinpath("static", name).read_bytes()
    return Response(data, 200, headers=_PAGE_HEADERS, media_type=_STATIC[name])


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return json_response(
            error_body("method_not_allowed", f"{request.method} is not allowed here"), 405
        )
    return json_response(error_body("not_found", f"no route {request.url.path}"), 404)


ROUTES = [
    Route("/api/info", info, methods=["GET"]),
    Route("/api/sessions", list_sessions, methods=["GET"]),
    Route("/api/sessions/{session_id}", show_session, methods=["GET"]),
    Route("/api/sessions/{session_id}/history", history, methods=["GET"]),
    Route("/api/sessions/{session_id}/checkpoints", list_checkpoints, methods=["GET"]),
    Route("/api/sessions/{session_id}/checkpoints", create_checkpoint, methods=["POST"]),
    Route("/api/sessions/{session_id}/checkpoints/import", import_checkpoint, methods=["POST"]),
    Route(
        "/api/sessions/{session_id}/checkpoints/{checkpoint_id}/restore",
        restore_checkpoint,
        methods=["POST"],
    ),
    Route(
        "/api/sessions/{session_id}/checkpoints/{checkpoint_id}/fork",
        fork_checkpoint,
        methods=["POST"],
    ),
    Route(
        "/api/sessions/{session_id}/checkpoints/{checkpoint_id}/export",
        export_checkpoint,
        methods=["GET"],
    ),
    Route("/api/verify", verify, methods=["POST"]),
    Route("/api/jobs/verify", start_verify, methods=["POST"]),
    Route("/api/jobs/import/{session_id}", start_import, methods=["POST"]),
    Route("/api/jobs/{job_id}", get_job, methods=["GET"]),
    Route("/api/memory/{namespace}/entries", memory_entries, methods=["GET"]),
    Route("/api/memory/{namespace}/entries/{memory_id}", delete_memory, methods=["DELETE"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/", static, methods=["GET"]),
    Route("/static/{name}", static, methods=["GET"]),
]


def create_app(
    store: SessionStore,
    *,
    memory: MemoryBrowser | None = None,
    token: str | None = None,
    max_body: int = MAX_BODY,
    close_store: bool = False,
    signing_key: bytes | str | None = None,
) -> Starlette:
    """The ASGI app over ``store`` (and ``memory``, a namespace browser, when given).

    Args:
        store: the session store to serve.
        memory: the memory store to browse, or None (memory routes answer 404).
        token: when set, every ``/api/`` request needs ``Authorization: Bearer <token>``.
        max_body: the largest request body accepted, in bytes (413 past it).
        close_store: close ``store`` (and ``memory``) when the app shuts down.
        signing_key: an HMAC key (see :mod:`perdure.checkpoints.export`): exports are
            signed with it on request (``?signed=true``), and every import must be
            signed with it. Without one, ``?signed=true`` is 400
            ``signing_key_not_configured`` and imports are checked by their sha256.

    Raises:
        ValueError: ``max_body`` is not positive, or ``signing_key`` is empty.
        TypeError: ``signing_key`` is not bytes or str.
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body must be a positive int, got {max_body!r}")
    key = None if signing_key is None else check_key(signing_key, "signing_key")
    inspector = Inspector(store, memory, key)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        inspector.index.warm()
        try:
            yield
        finally:
            await inspector.jobs.close()
            await inspector.index.close()
            if close_store:
                if memory is not None:
                    memory.close()
                close = getattr(store, "close", None)
                if callable(close):
                    close()

    app = Starlette(
        routes=ROUTES,
        exception_handlers={404: _not_found, 405: _not_found},
        lifespan=lifespan,
    )
    app.state.inspector = inspector
    app.add_middleware(Guard, token=token, max_body=max_body)
    return app
