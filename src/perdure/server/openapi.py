"""The OpenAPI 3.1 document of ``perdure serve``, served at ``/openapi.json``.

Written by hand beside the routes (:mod:`perdure.server.app`); tests check that it
names every route and method, and schemathesis checks every answer against it.
"""

from __future__ import annotations

import copy
from typing import Any

from perdure import __version__

_NULLABLE_STR = {"type": ["string", "null"]}
_ID = {"type": "string", "minLength": 1, "maxLength": 200}
_ULID = {"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$"}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "SessionMeta": {
        "type": "object",
        "required": ["session_id", "created_at", "updated_at", "message_count"],
        "properties": {
            "session_id": {"type": "string"},
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "message_count": {"type": "integer", "minimum": 0},
            "damaged": _NULLABLE_STR,
            "expires_at": _NULLABLE_STR,
            "expires_in": {"type": ["number", "null"]},
        },
    },
    "SessionList": {
        "type": "object",
        "required": ["sessions", "next_after", "offset", "next_offset", "total", "as_of"],
        "properties": {
            "sessions": {"type": "array", "items": {"$ref": "#/components/schemas/SessionMeta"}},
            "as_of": {"type": "string", "description": "when the listing was read (UTC)"},
            "next_after": _NULLABLE_STR,
            "offset": {"type": ["integer", "null"]},
            "next_offset": {"type": ["integer", "null"]},
            "total": {"type": ["integer", "null"]},
        },
    },
    "Session": {
        "allOf": [{"$ref": "#/components/schemas/SessionMeta"}],
        "type": "object",
        "required": ["agent_state", "checkpoints", "damaged_checkpoints", "latest_checkpoint_id"],
        "properties": {
            "agent_state": {
                "type": "object",
                "required": ["state_keys", "interrupts"],
                "properties": {
                    "agent_id": {},
                    "state_keys": {"type": "array", "items": {"type": "string"}},
                    "conversation_manager": {},
                    "removed_message_count": {},
                    "interrupts": {"type": "integer"},
                },
            },
            "checkpoints": {"type": "integer", "minimum": 0},
            "damaged_checkpoints": {"type": "integer", "minimum": 0},
            "latest_checkpoint_id": _NULLABLE_STR,
        },
    },
    "HistoryPage": {
        "type": "object",
        "required": ["session_id", "messages", "offset", "next_offset", "total"],
        "properties": {
            "session_id": {"type": "string"},
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {
                        "role": {"type": "string"},
                        "content": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
            "offset": {"type": "integer", "minimum": 0},
            "next_offset": {"type": "integer", "minimum": 0},
            "total": {"type": "integer", "minimum": 0},
        },
    },
    "Checkpoint": {
        "type": "object",
        "required": [
            "checkpoint_id",
            "session_id",
            "trigger",
            "label",
            "message_count",
            "created_at",
        ],
        "properties": {
            "checkpoint_id": {"type": "string"},
            "session_id": {"type": "string"},
            "trigger": {"enum": ["manual", "pre_compaction", "pre_restore", "import"]},
            "label": _NULLABLE_STR,
            "message_count": {"type": "integer", "minimum": 0},
            "created_at": {"type": "string"},
        },
    },
    "ListedCheckpoint": {
        "type": "object",
        "required": ["checkpoint_id", "session_id", "damaged"],
        "properties": {
            "checkpoint_id": {"type": "string"},
            "session_id": {"type": "string"},
            "damaged": {"type": "boolean"},
            "trigger": {"type": "string"},
            "label": _NULLABLE_STR,
            "message_count": {"type": "integer"},
            "created_at": {"type": "string"},
            "kind": {"type": "string"},
            "error": {"type": "object"},
        },
    },
    "CheckpointList": {
        "type": "object",
        "required": ["session_id", "checkpoints"],
        "properties": {
            "session_id": {"type": "string"},
            "checkpoints": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/ListedCheckpoint"},
            },
        },
    },
    "Restored": {
        "type": "object",
        "required": [
            "session_id",
            "checkpoint_id",
            "status",
            "from_messages",
            "to_messages",
            "pre_restore_checkpoint_id",
        ],
        "properties": {
            "session_id": {"type": "string"},
            "checkpoint_id": {"type": "string"},
            "status": {"const": "restored"},
            "reason": {"type": "null"},
            "from_messages": {"type": "integer"},
            "to_messages": {"type": "integer"},
            "pre_restore_checkpoint_id": _NULLABLE_STR,
        },
    },
    "Forked": {
        "type": "object",
        "required": ["session_id", "source_session_id", "checkpoint_id"],
        "properties": {
            "session_id": {"type": "string"},
            "source_session_id": {"type": "string"},
            "checkpoint_id": {"type": "string"},
        },
    },
    "Export": {
        "type": "object",
        "description": "A perdure-checkpoint/1 export, self-contained and hashed.",
        "required": ["format"],
        "properties": {
            "format": {"type": "string"},
            "hmac_sha256": {"type": "string", "description": "the signature, when signed"},
        },
    },
    "VerifyReport": {
        "type": "object",
        "required": [
            "clean",
            "sessions_checked",
            "checkpoints_checked",
            "damaged_sessions",
            "damage",
            "missing",
        ],
        "properties": {
            "clean": {"type": "boolean"},
            "sessions_checked": {"type": "integer"},
            "checkpoints_checked": {"type": "integer"},
            "damaged_sessions": {"type": "array", "items": {"type": "string"}},
            "damage": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["session_id", "kind", "detail", "position"],
                    "properties": {
                        "session_id": _NULLABLE_STR,
                        "kind": {"type": "string"},
                        "detail": {"type": "string"},
                        "file": _NULLABLE_STR,
                        "offset": {"type": ["integer", "null"]},
                        "row": {"type": ["integer", "null"]},
                        "checkpoint_id": _NULLABLE_STR,
                        "position": {"type": "string"},
                    },
                },
            },
            "missing": {"type": "array", "items": {"type": "string"}},
        },
    },
    "VerifyRequest": {
        "type": "object",
        "properties": {"session_ids": {"type": ["array", "null"], "items": _ID}},
    },
    "Job": {
        "type": "object",
        "required": ["job_id", "kind", "state", "done", "total", "result", "error"],
        "properties": {
            "job_id": {"type": "string"},
            "kind": {"type": "string"},
            "state": {"enum": ["running", "done", "failed"]},
            "done": {"type": "integer"},
            "total": {"type": ["integer", "null"]},
            "phase": {
                "type": ["string", "null"],
                "description": "verifying, then (an import) writing",
            },
            "result": {},
            "error": {"type": ["object", "null"]},
            "started_at": {"type": "number"},
            "finished_at": {"type": ["number", "null"]},
        },
    },
    "MemoryPage": {
        "type": "object",
        "required": ["namespace", "total", "offset", "next_offset", "entries"],
        "properties": {
            "namespace": {"type": "string"},
            "total": {"type": "integer"},
            "offset": {"type": "integer"},
            "next_offset": {"type": ["integer", "null"]},
            "entries": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["memory_id", "content", "created_at", "score", "metadata"],
                    "properties": {
                        "memory_id": {"type": ["integer", "null"]},
                        "content": {"type": "string"},
                        "created_at": {},
                        "score": {"type": ["number", "null"]},
                        "metadata": {"type": "object"},
                    },
                },
            },
        },
    },
    "MemoryDeleted": {
        "type": "object",
        "required": ["namespace", "memory_id", "deleted"],
        "properties": {
            "namespace": {"type": "string"},
            "memory_id": {"type": "integer"},
            "deleted": {"const": True},
        },
    },
    "Info": {
        "type": "object",
        "required": ["version", "memory", "signing"],
        "properties": {
            "version": {"type": "string"},
            "memory": {"type": "boolean"},
            "signing": {
                "type": "boolean",
                "description": "a signing key is set: exports can be signed, imports must be",
            },
        },
    },
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


_ERRORS = {
    "400": "bad input (code bad_request, or the library's code)",
    "401": "a missing or wrong token (code unauthorized)",
    "403": "Host is not loopback on a server without a token (code forbidden_host)",
    "404": "no such session, checkpoint, job or memory",
    "409": "locked, conflicting, or refused while a turn runs",
    "413": "the request body passes the cap (code request_too_large)",
    "415": "a mutating request that is not application/json",
    "500": "stored data is corrupted (code session_store_corrupted) or the store failed",
    "503": "the store's server cannot be reached (code store_unavailable)",
}


def _op(
    summary: str,
    ok: tuple[str, str, str],
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    errors: tuple[str, ...] = ("400", "401", "403", "404", "500", "503"),
    mutating: bool = False,
) -> dict[str, Any]:
    status, schema, description = ok
    responses: dict[str, Any] = {status: _json(schema, description)}
    codes = set(errors) | ({"409", "413", "415"} if mutating else set())
    for code in sorted(codes):
        responses[code] = _json("Error", _ERRORS[code])
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        operation["parameters"] = params
    if body is not None:
        operation["requestBody"] = body
    return operation


def _path(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


_SESSION = _path("session_id", {**_ID, "pattern": "^[^./\\\\][^/\\\\]*$"})
_CHECKPOINT = _path("checkpoint_id", _ULID)
_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size")
_OFFSET = _query("offset", {"type": "integer", "minimum": 0}, "first item")
_EMPTY_JSON = {
    "required": False,
    "content": {"application/json": {"schema": {"type": "object"}}},
}
# Both import routes (at once, and as a job) take the same query and body.
_IMPORT_PARAMS = [_SESSION, _query("create", {"type": "boolean"}, "create the session if absent")]
_IMPORT_BODY = {"required": True, "content": {"application/json": {"schema": _ref("Export")}}}
# And both verify routes (at once, and as a job).
_VERIFY_BODY = {
    "required": False,
    "content": {"application/json": {"schema": _ref("VerifyRequest")}},
}


def openapi_document() -> dict[str, Any]:
    """The document (a fresh copy each call)."""
    paths: dict[str, Any] = {
        "/api/info": {
            "get": _op(
                "This server: version, memory view on or off",
                ("200", "Info", "info"),
                errors=("401", "403"),
            )
        },
        "/api/sessions": {
            "get": _op(
                "List sessions (metadata only): by id with after, or by update time / "
                "filtered by id with offset",
                ("200", "SessionList", "a page of sessions"),
                params=[
                    _LIMIT,
                    _query("after", {"type": "string"}, "id order: start after this id"),
                    _query("order", {"enum": ["id", "updated"]}, "sort order"),
                    _query("q", {"type": "string"}, "only ids containing this text"),
                    _OFFSET,
                ],
            )
        },
        "/api/sessions/{session_id}": {
            "get": _op(
                "A session: metadata, state summary, checkpoints",
                ("200", "Session", "the session"),
                params=[_SESSION],
            )
        },
        "/api/sessions/{session_id}/history": {
            "get": _op(
                "A page of history (tool calls kept with their results)",
                ("200", "HistoryPage", "the page"),
                params=[_SESSION, _OFFSET, _LIMIT],
            )
        },
        "/api/sessions/{session_id}/checkpoints": {
            "get": _op(
                "The session's checkpoints, oldest first",
                ("200", "CheckpointList", "the checkpoints"),
                params=[_SESSION],
            ),
            "post": _op(
                "Checkpoint the session now",
                ("201", "Checkpoint", "the new checkpoint"),
                params=[_SESSION],
                body={
                    "required": False,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"label": _NULLABLE_STR},
                            }
                        }
                    },
                },
                mutating=True,
            ),
        },
        "/api/sessions/{session_id}/checkpoints/import": {
            "post": _op(
                "Import an exported checkpoint (verified in full first; on a server with a "
                "signing key it must be signed with that key)",
                ("201", "Checkpoint", "the imported checkpoint"),
                params=_IMPORT_PARAMS,
                body=_IMPORT_BODY,
                mutating=True,
            )
        },
        "/api/sessions/{session_id}/checkpoints/{checkpoint_id}/restore": {
            "post": _op(
                "Restore the session to the checkpoint (a pre_restore checkpoint first)",
                ("200", "Restored", "the session was restored"),
                params=[_SESSION, _CHECKPOINT],
                body={
                    "required": False,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"checkpoint": {"type": "boolean"}},
                            }
                        }
                    },
                },
                mutating=True,
            )
        },
        "/api/sessions/{session_id}/checkpoints/{checkpoint_id}/fork": {
            "post": _op(
                "Start a new session from the checkpoint",
                ("201", "Forked", "the new session"),
                params=[_SESSION, _CHECKPOINT],
                body=_EMPTY_JSON,
                mutating=True,
            )
        },
        "/api/sessions/{session_id}/checkpoints/{checkpoint_id}/export": {
            "get": _op(
                "Download the checkpoint as a verifiable export; signed=true signs it with "
                "the server's key (400 signing_key_not_configured without one)",
                ("200", "Export", "the export (perdure-checkpoint/1)"),
                params=[
                    _SESSION,
                    _CHECKPOINT,
                    _query(
                        "signed",
                        {"type": "boolean"},
                        "sign with the server's key (HMAC-SHA256, field hmac_sha256)",
                    ),
                ],
            )
        },
        "/api/verify": {
            "post": _op(
                "Verify every session and checkpoint (or those named)",
                ("200", "VerifyReport", "the report"),
                body=_VERIFY_BODY,
                mutating=True,
            )
        },
        "/api/jobs/verify": {
            "post": _op(
                "Start verify as a job; poll /api/jobs/{job_id} for progress",
                ("202", "Job", "the job, running"),
                body=_VERIFY_BODY,
                mutating=True,
            )
        },
        "/api/jobs/import/{session_id}": {
            "post": _op(
                "Import an exported checkpoint as a job (verified in full first); poll "
                "/api/jobs/{job_id}: progress through the checks, then phase writing; the "
                "result is the checkpoint, a refused export fails the job with the error",
                ("202", "Job", "the job, running"),
                params=_IMPORT_PARAMS,
                body=_IMPORT_BODY,
                mutating=True,
            )
        },
        "/api/jobs/{job_id}": {
            "get": _op(
                "A job's state, progress and result",
                ("200", "Job", "the job"),
                params=[_path("job_id", {"type": "string"})],
            )
        },
        "/api/memory/{namespace}/entries": {
            "get": _op(
                "A namespace's memories (oldest first), or with q the best matches",
                ("200", "MemoryPage", "the memories"),
                params=[
                    _path("namespace", {"type": "string", "minLength": 1}),
                    _query("q", {"type": "string"}, "search text"),
                    _OFFSET,
                    _LIMIT,
                ],
            )
        },
        "/api/memory/{namespace}/entries/{memory_id}": {
            "delete": _op(
                "Delete one memory",
                ("200", "MemoryDeleted", "deleted"),
                params=[
                    _path("namespace", {"type": "string", "minLength": 1}),
                    _path("memory_id", {"type": "integer", "minimum": 0}),
                ],
                mutating=True,
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "perdure serve", "version": __version__},
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
        "paths": copy.deepcopy(paths),  # shares no object with this module
    }
