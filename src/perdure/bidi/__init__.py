"""Bidirectional streaming agents, persisted per seed 003 (SPEC §8.1).

:class:`BidiAgent` talks to a :class:`BidiModel` (start, send, receive, stop) and is
restored before its connection starts and saved per the session manager's
``bidi_agent_save_latest_on``. :class:`ScriptedBidiModel` plays back canned events;
:class:`OpenAIRealtimeModel` is OpenAI's Realtime API over a WebSocket (``websockets``,
from ``perdure[openai]``, imported only when it connects).
"""

from perdure.bidi.agent import BidiAgent
from perdure.bidi.model import BidiEvent, BidiInput, BidiModel, ScriptedBidiModel
from perdure.bidi.openai_realtime import OpenAIRealtimeModel

__all__ = [
    "BidiAgent",
    "BidiEvent",
    "BidiInput",
    "BidiModel",
    "OpenAIRealtimeModel",
    "ScriptedBidiModel",
]
