"""The self-contained checkpoint export format ``perdure-checkpoint/1`` (pure).

An export is one UTF-8 JSON object, written in canonical form (sorted keys, no
whitespace)::

    {"format": "perdure-checkpoint/1",
     "checkpoint": {checkpoint meta},
     "messages": [... every bytes value replaced by {"__attachment__": sha256, "size": n},
                  marker-shaped dicts escaped as in perdure.types.json],
     "agent_state": {...},
     "attachments": {"<sha256>": "<base64>", ...},
     "sha256": "<sha256 of the canonical JSON of everything but this field>"}

Images and other binaries are inlined once each, named by their sha256. Import
verifies everything — the format, the schema, the document hash, the exact
canonical encoding, every attachment's hash and size, and the shape of every
message — and any failure is a ``CheckpointImportError``: a tampered byte anywhere
is rejected, and so is a value no store could keep (nesting deeper than 200, NaN).

The sha256 detects damage, not forgery: whoever edits an export can recompute it.
An export made with a ``signing_key`` carries one more field,
``"hmac_sha256": "<64 hex>"``, the HMAC-SHA256 under that key of the canonical JSON
of every other field (``sha256`` included), that is of the export's bytes without
that field. Importing with a ``verify_key`` refuses an export whose signature is
missing or does not match; without one the signature is not checked, and unsigned
exports (all those made before signatures existed) import as they always did. The
format stays ``perdure-checkpoint/1``: the field is optional (an older perdure,
which knows no such field, refuses a signed export rather than ignore it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perdure.checkpoints.store import CheckpointMeta, CheckpointRecord
from perdure.errors import CheckpointImportError
from perdure.session.attachments import (
    decode_with_attachments,
    extract_attachments,
    is_valid_digest,
)
from perdure.types import Message, validate_storable_message
from perdure.types.json import compact_json_bytes

EXPORT_FORMAT = "perdure-checkpoint/1"
ImportProgress = Callable[[int, int], None]
"""Called as ``progress(done, total)`` as an import's checks advance (see
:func:`import_checkpoint_bytes`)."""
_REPORT_EVERY = 64  # messages checked between two progress reports
_KEYS = {"format", "checkpoint", "messages", "agent_state", "attachments", "sha256"}
_SIGNATURE = "hmac_sha256"


def _canonical(obj: Any) -> bytes:
    return compact_json_bytes(obj, sort_keys=True)


def check_key(key: object, argument: str) -> bytes:
    """An HMAC key as bytes (a str is taken as UTF-8).

    Raises:
        TypeError: not bytes or str (the message names ``argument``).
        ValueError: empty.
    """
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError(f"{argument} must be bytes or str, got {type(key).__name__}")
    key = bytes(key)
    if not key:
        raise ValueError(f"{argument} must not be empty")
    return key


def _sign(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def export_checkpoint_bytes(
    record: CheckpointRecord, *, signing_key: bytes | str | None = None
) -> bytes:
    """Serialise ``record`` as a self-contained, hashed ``perdure-checkpoint/1`` export.

    With ``signing_key`` the export is signed (HMAC-SHA256, see the module docstring).

    Raises:
        TypeError, ValueError: ``signing_key`` is not a non-empty bytes or str.
    """
    key = None if signing_key is None else check_key(signing_key, "signing_key")
    found: dict[str, bytes] = {}
    messages = extract_attachments(record.messages, 1, found)
    state = extract_attachments(record.agent_state, 1, found)
    doc: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "checkpoint": record.meta.to_dict(),
        "messages": messages,
        "agent_state": state,
        "attachments": {
            digest: base64.b64encode(data).decode("ascii") for digest, data in sorted(found.items())
        },
    }
    doc["sha256"] = hashlib.sha256(_canonical(doc)).hexdigest()
    if key is not None:
        doc[_SIGNATURE] = _sign(key, _canonical(doc))
    return _canonical(doc)


@dataclass(frozen=True)
class ImportedCheckpoint:
    """A verified export: the original meta, the history and the agent state."""

    meta: CheckpointMeta
    messages: list[Message]
    agent_state: dict[str, Any]


def import_checkpoint_bytes(
    data: Any, *, verify_key: bytes | str | None = None, progress: ImportProgress | None = None
) -> ImportedCheckpoint:
    """Verify and decode an export.

    With ``verify_key`` the export must be signed with that key (see the module
    docstring): an unsigned export, or one whose signature does not match (a
    forgery, even with its sha256 recomputed, or another key), is refused.

    ``progress(done, total)`` is called as the checks advance, once the JSON is
    parsed (the total is known from then on): its steps are the parse, the hashes
    (sha256, canonical form, signature), each attachment, each message (reported
    every few dozen) and the agent state. The last call is ``(total, total)``; a
    refused export stops the calls where it failed.

    Raises:
        CheckpointImportError: anything at all is wrong (code
            ``checkpoint_import_invalid``); the message says what.
        TypeError, ValueError: ``verify_key`` is not a non-empty bytes or str.
    """
    key = None if verify_key is None else check_key(verify_key, "verify_key")
    try:
        return _import(data, key, progress)
    except CheckpointImportError:
        raise
    except (
        ValueError,
        TypeError,
        KeyError,
        UnicodeDecodeError,
        binascii.Error,
        RecursionError,  # JSON nested too deep for the parser (SPEC §7: never leaks)
    ) as exc:
        raise CheckpointImportError(f"checkpoint import is invalid: {exc}") from None


class _Steps:
    """An import's progress: steps done of a total known once the JSON is parsed."""

    def __init__(self, progress: ImportProgress | None, doc: dict[str, Any]) -> None:
        attachments, messages = doc.get("attachments"), doc.get("messages")
        self.progress = progress
        self.total = 3 + (len(attachments) if isinstance(attachments, dict) else 0)
        self.total += len(messages) if isinstance(messages, list) else 0
        self.done = 0

    def advance(self, steps: int = 1, *, report: bool = True) -> None:
        self.done = min(self.done + steps, self.total)
        if self.progress is not None and (report or self.done == self.total):
            self.progress(self.done, self.total)


def _import(data: Any, key: bytes | None, progress: ImportProgress | None) -> ImportedCheckpoint:
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CheckpointImportError(f"checkpoint import takes bytes, got {type(data).__name__}")
    raw = bytes(data)
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict):
        raise CheckpointImportError("checkpoint import is not a JSON object")
    if doc.get("format") != EXPORT_FORMAT:
        raise CheckpointImportError(
            f"unknown format {doc.get('format')!r}, expected {EXPORT_FORMAT!r}"
        )
    steps = _Steps(progress, doc)
    steps.advance()  # parsed
    signature = doc.pop(_SIGNATURE, None)
    if set(doc) != _KEYS:
        raise CheckpointImportError(f"export has fields {sorted(doc)}, expected {sorted(_KEYS)}")
    claimed = doc.pop("sha256")
    if not isinstance(claimed, str) or hashlib.sha256(_canonical(doc)).hexdigest() != claimed:
        raise CheckpointImportError("the export's sha256 does not match its content")
    doc["sha256"] = claimed
    signed = _canonical(doc)
    if signature is not None:
        doc[_SIGNATURE] = signature
    if _canonical(doc) != raw:
        raise CheckpointImportError("the export is not in canonical form (it was altered)")
    if key is not None:
        if signature is None:
            raise CheckpointImportError(
                "the export is not signed, and a verify_key was given: refusing it"
            )
        if not isinstance(signature, str) or not hmac.compare_digest(_sign(key, signed), signature):
            raise CheckpointImportError(
                "the export's signature does not match: it was altered, or signed with another key"
            )
    steps.advance()  # hashes, canonical form and signature checked
    meta = CheckpointMeta.from_dict(doc["checkpoint"])
    attachments = doc["attachments"]
    if not isinstance(attachments, dict):
        raise CheckpointImportError("attachments must be an object")
    blobs: dict[str, bytes] = {}
    for digest, encoded in attachments.items():
        if not is_valid_digest(digest) or not isinstance(encoded, str):
            raise CheckpointImportError("an attachment is malformed")
        blob = base64.b64decode(encoded.encode("ascii"), validate=True)
        if hashlib.sha256(blob).hexdigest() != digest:
            raise CheckpointImportError(f"attachment {digest[:12]}… does not match its sha256")
        blobs[digest] = blob
        steps.advance()

    def load(digest: str, size: int) -> bytes:
        blob = blobs.get(digest)
        if blob is None or len(blob) != size:
            raise CheckpointImportError(f"attachment {digest[:12]}… is missing or of another size")
        return blob

    if not isinstance(doc["messages"], list):
        raise CheckpointImportError("messages must be a list")
    messages: list[Message] = []
    for index, item in enumerate(doc["messages"]):
        message = decode_with_attachments(item, load)
        validate_storable_message(message, f"messages[{index}]")
        messages.append(message)
        steps.advance(report=(index + 1) % _REPORT_EVERY == 0)
    state = decode_with_attachments(doc["agent_state"], load)
    if not isinstance(state, dict):
        raise CheckpointImportError("agent_state must be an object")
    if meta.message_count != len(messages):
        raise CheckpointImportError(
            f"the checkpoint says {meta.message_count} messages but holds {len(messages)}"
        )
    steps.advance()  # the agent state
    return ImportedCheckpoint(meta, messages, state)
