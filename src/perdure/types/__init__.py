"""Messages, content blocks and JSON helpers (SPEC layer 1)."""

from perdure.types.json import decode_bytes_values, encode_bytes_values, validate_storable
from perdure.types.messages import (
    CONTENT_BLOCK_KEYS,
    ContentBlock,
    Document,
    Image,
    ImageSource,
    Message,
    Role,
    StopReason,
    ToolResult,
    ToolResultStatus,
    ToolSpec,
    ToolSpecInputSchema,
    ToolUse,
    Usage,
)
from perdure.types.validation import (
    is_text_only,
    validate_content_block,
    validate_message,
    validate_storable_message,
)

__all__ = [
    "CONTENT_BLOCK_KEYS",
    "ContentBlock",
    "Document",
    "Image",
    "ImageSource",
    "Message",
    "Role",
    "StopReason",
    "ToolResult",
    "ToolResultStatus",
    "ToolSpec",
    "ToolSpecInputSchema",
    "ToolUse",
    "Usage",
    "decode_bytes_values",
    "encode_bytes_values",
    "is_text_only",
    "validate_content_block",
    "validate_message",
    "validate_storable",
    "validate_storable_message",
]
