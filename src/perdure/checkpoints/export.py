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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
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
_KEYS = {"format", "checkpoint", "messages", "agent_state", "attachments", "sha256"}


def _canonical(obj: Any) -> bytes:
    return compact_json_bytes(obj, sort_keys=True)


def export_checkpoint_bytes(record: CheckpointRecord) -> bytes:
    """Serialise ``record`` as a self-contained, hashed ``perdure-checkpoint/1`` export."""
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
    return _canonical(doc)


@dataclass(frozen=True)
class ImportedCheckpoint:
    """A verified export: the original meta, the history and the agent state."""

    meta: CheckpointMeta
    messages: list[Message]
    agent_state: dict[str, Any]


def import_checkpoint_bytes(data: Any) -> ImportedCheckpoint:
    """Verify and decode an export.

    Raises:
        CheckpointImportError: anything at all is wrong (code
            ``checkpoint_import_invalid``); the message says what.
    """
    try:
        return _import(data)
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


def _import(data: Any) -> ImportedCheckpoint:
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
    if set(doc) != _KEYS:
        raise CheckpointImportError(f"export has fields {sorted(doc)}, expected {sorted(_KEYS)}")
    claimed = doc.pop("sha256")
    if not isinstance(claimed, str) or hashlib.sha256(_canonical(doc)).hexdigest() != claimed:
        raise CheckpointImportError("the export's sha256 does not match its content")
    doc["sha256"] = claimed
    if _canonical(doc) != raw:
        raise CheckpointImportError("the export is not in canonical form (it was altered)")
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

    def load(digest: str, size: int) -> bytes:
        blob = blobs.get(digest)
        if blob is None or len(blob) != size:
            raise CheckpointImportError(f"attachment {digest[:12]}… is missing or of another size")
        return blob

    messages = decode_with_attachments(doc["messages"], load)
    if not isinstance(messages, list):
        raise CheckpointImportError("messages must be a list")
    for index, message in enumerate(messages):
        validate_storable_message(message, f"messages[{index}]")
    state = decode_with_attachments(doc["agent_state"], load)
    if not isinstance(state, dict):
        raise CheckpointImportError("agent_state must be an object")
    if meta.message_count != len(messages):
        raise CheckpointImportError(
            f"the checkpoint says {meta.message_count} messages but holds {len(messages)}"
        )
    return ImportedCheckpoint(meta, messages, state)
