"""Bidirectional streaming agents, persisted per seed 003 (SPEC §8.1).

:class:`BidiAgent` talks to a :class:`BidiModel` (start, send, receive, stop) and is
restored before its connection starts and saved per the session manager's
``bidi_agent_save_latest_on``. :class:`ScriptedBidiModel` plays back canned events.
No provider adapter ships yet: a realtime API would implement :class:`BidiModel`.
"""

from perdure.bidi.agent import BidiAgent
from perdure.bidi.model import BidiEvent, BidiInput, BidiModel, ScriptedBidiModel

__all__ = ["BidiAgent", "BidiEvent", "BidiInput", "BidiModel", "ScriptedBidiModel"]
