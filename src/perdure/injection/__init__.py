"""Ephemeral injection: just-in-time text for one model call, never kept in history.

Use :class:`ContextInjector` (or a :class:`~perdure.memory.MemoryManager`, which
injects what it finds in long-term memory). The pure helpers are public for
plugins that build their own middleware.
"""

from perdure.injection.escape import escape_xml_attr, escape_xml_text
from perdure.injection.fold import fold_into_last_user_message, is_user_turn, latest_text
from perdure.injection.injector import (
    TRIGGERS,
    ContextInjector,
    InjectionContext,
    RenderCallback,
    Trigger,
    check_trigger,
    injection_middleware,
)

__all__ = [
    "TRIGGERS",
    "ContextInjector",
    "InjectionContext",
    "RenderCallback",
    "Trigger",
    "check_trigger",
    "escape_xml_attr",
    "escape_xml_text",
    "fold_into_last_user_message",
    "injection_middleware",
    "is_user_turn",
    "latest_text",
]
