"""Content helpers both adapters share: media types, bytes, tool input, tool result text.

Pure functions; they never import a provider SDK.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from perdure.types import ContentBlock

_IMAGE_TYPES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}
_MEDIA_TO_FORMAT = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
TEXT_DOCUMENT_FORMATS = frozenset({"txt", "md", "csv", "html", "json", "xml"})
"""Document formats sent to the model as their text."""


def image_media_type(image: Any, where: str) -> str:
    """The MIME type of a perdure ``image`` block (``"png"`` → ``"image/png"``).

    Raises:
        ValueError: the format is not png, jpeg/jpg, gif or webp (names ``where``).
    """
    fmt = image.get("format") if isinstance(image, Mapping) else None
    media = _IMAGE_TYPES.get(str(fmt).lower()) if isinstance(fmt, str) else None
    if media is None:
        raise ValueError(
            f"{where}: image format must be one of {sorted(_IMAGE_TYPES)}, got {fmt!r}"
        )
    return media


def image_format(media_type: str) -> str:
    """Inverse of :func:`image_media_type`: ``"image/jpeg"`` → ``"jpeg"``.

    Raises:
        ValueError: an unknown media type.
    """
    fmt = _MEDIA_TO_FORMAT.get(media_type.lower())
    if fmt is None:
        raise ValueError(f"unsupported image media type {media_type!r}")
    return fmt


def source_bytes(block: Any, where: str) -> bytes:
    """The raw bytes of an image or document block (``{"source": {"bytes": b"..."}}``).

    Raises:
        TypeError: the source holds no bytes (names ``where``).
    """
    source = block.get("source") if isinstance(block, Mapping) else None
    data = source.get("bytes") if isinstance(source, Mapping) else None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(
            f"{where}: source must be {{'bytes': <bytes>}}, got {type(data).__name__} "
            "(decode stored messages with perdure.types.decode_bytes_values first)"
        )
    return bytes(data)


def b64(data: bytes) -> str:
    """Standard base64 text of ``data``."""
    return base64.b64encode(data).decode("ascii")


def document_text(document: Any, where: str) -> tuple[str, str]:
    """``(name, text)`` of a text-like ``document`` block (txt, md, csv, html, json, xml).

    Raises:
        ValueError: another format, or bytes that are not UTF-8 (names ``where``).
    """
    fmt = str(document.get("format", "")).lower()
    if fmt not in TEXT_DOCUMENT_FORMATS:
        raise ValueError(
            f"{where}: document format must be pdf or one of {sorted(TEXT_DOCUMENT_FORMATS)}, "
            f"got {fmt!r}"
        )
    try:
        text = source_bytes(document, where).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: a {fmt} document must be UTF-8 text: {exc}") from exc
    return str(document.get("name") or "document"), text


def parse_tool_input(raw: str) -> Any:
    """The tool input a model streamed as JSON text.

    Empty text means no arguments (``{}``). Text that is not valid JSON (a call cut
    off by ``max_tokens``, a model's typo) is kept as the raw string: the tool then
    answers with an error result the model can read, and the text goes back to the
    provider as it came.
    """
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def tool_input_json(value: Any) -> str:
    """The JSON text of a tool input (a raw string kept by :func:`parse_tool_input` as is)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def block_as_text(block: ContentBlock) -> str | None:
    """The text of a text or json block; ``None`` for other blocks."""
    if "text" in block:
        return block["text"]
    if "json" in block:
        return json.dumps(block["json"], ensure_ascii=False)
    return None
