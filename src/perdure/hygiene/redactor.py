"""PIIRedactor: replaces emails, phone numbers, cards, IBANs and IP addresses (pure).

A redactor runs its detectors (:mod:`perdure.hygiene.detectors`) one after the
other over a string, each replacing its hits with ``"[kind]"``. It walks messages,
tool inputs and results, and agent state, redacting every string it finds and
returning a new value: its input is never changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from perdure.hygiene.detectors import BUILTIN_DETECTORS, Detector, check_kind_name
from perdure.hygiene.filters import PersistedItem

__all__ = ["DEFAULT_KINDS", "PIIRedactor"]

DEFAULT_KINDS: tuple[str, ...] = ("email", "phone", "card", "iban", "ip")
"""What a :class:`PIIRedactor` looks for unless told otherwise: every built-in kind."""

# Strings in a message that are structure, not content: never redacted.
_TOOL_USE_KEEP = frozenset({"toolUseId", "name"})
_TOOL_RESULT_KEEP = frozenset({"toolUseId", "status"})


class PIIRedactor:
    """Replace personal data in text with ``"[email]"``, ``"[phone]"``, ``"[card]"``…

    Args:
        kinds: the built-in detectors to run (``"email"``, ``"phone"``, ``"card"``,
            ``"iban"``, ``"ip"``; all of them by default). They run in a fixed order
            (email, iban, card, ip, phone), so an email's or IBAN's digits are never
            taken for a phone number.
        detectors: more :class:`~perdure.hygiene.Detector` objects (e.g.
            :class:`~perdure.hygiene.PatternDetector`), run after the built-in ones.

    Raises:
        ValueError: an unknown kind (the message names it), or two detectors of the
            same kind.
        TypeError: ``kinds`` is a single string, or a detector is not a ``Detector``.

    A redactor is also a persistence filter (:class:`~perdure.hygiene.PersistenceFilter`):
    pass it in ``filters=[...]`` to a ``Session``, ``SnapshotSessionManager`` or
    ``MemoryManager``.
    """

    def __init__(
        self,
        kinds: Iterable[str] = DEFAULT_KINDS,
        *,
        detectors: Iterable[Detector] = (),
    ) -> None:
        if isinstance(kinds, str):
            raise TypeError(f"kinds must be a sequence of kind names, not the str {kinds!r}")
        wanted: list[str] = []
        for kind in kinds:
            if not isinstance(kind, str):
                raise TypeError(f"kinds holds {kind!r}, not a kind name (a str)")
            if kind not in BUILTIN_DETECTORS:
                raise ValueError(
                    f"kinds names an unknown kind {kind!r}; the built-in kinds are "
                    f"{', '.join(repr(k) for k in BUILTIN_DETECTORS)} (pass a Detector "
                    "in detectors= for anything else)"
                )
            wanted.append(kind)
        chosen: list[Detector] = [d for k, d in BUILTIN_DETECTORS.items() if k in wanted]
        if isinstance(detectors, Detector):
            detectors = [detectors]
        for detector in detectors:
            if not isinstance(detector, Detector):
                raise TypeError(
                    "detectors must hold Detector objects (a kind and a find(text) "
                    f"method), got {type(detector).__name__}"
                )
            check_kind_name(detector.kind)
            chosen.append(detector)
        seen: set[str] = set()
        for detector in chosen:
            if detector.kind in seen:
                raise ValueError(f"two detectors of kind {detector.kind!r}")
            seen.add(detector.kind)
        self.kinds: tuple[str, ...] = tuple(d.kind for d in chosen)
        self._detectors = tuple((d, f"[{d.kind}]") for d in chosen)

    def __repr__(self) -> str:
        return f"PIIRedactor(kinds={self.kinds!r})"

    def __call__(self, item: PersistedItem) -> Any:
        """As a persistence filter: a message, agent state or memory entry, redacted."""
        if item.kind == "message":
            return self.redact_message(item.value)
        return self.redact_value(item.value)

    # ------------------------------------------------------------------ text

    def redact(self, text: str) -> str:
        """``text`` with every hit of every detector replaced by ``"[kind]"``."""
        for detector, replacement in self._detectors:
            spans = list(detector.find(text))
            if not spans:
                continue
            pieces: list[str] = []
            at = 0
            for start, end in spans:
                if start < at:
                    continue  # overlaps a span already replaced
                pieces.append(text[at:start])
                pieces.append(replacement)
                at = end
            pieces.append(text[at:])
            text = "".join(pieces)
        return text

    def redact_value(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string redacted, keys included.

        Dicts, lists and tuples are copied; strings redacted; anything else (numbers,
        bytes, ``None``) returned as it is. Two keys that redact to the same string
        keep the later one's value.
        """
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {
                self.redact(k) if isinstance(k, str) else k: self.redact_value(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.redact_value(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self.redact_value(item) for item in value)
        return value

    # ------------------------------------------------------------------ messages

    def redact_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of a message with its content redacted.

        Text, tool inputs, tool results (their text and JSON), reasoning text and
        any block of an unknown kind are redacted; what is structure stays: the
        role, tool-use ids, tool names, a result's status, formats, a reasoning
        block's signature, and bytes (images, documents).
        """
        copied = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            copied["content"] = [self._block(block) for block in content]
        return copied

    def _block(self, block: Any) -> Any:
        if not isinstance(block, Mapping):
            return self.redact_value(block)
        out: dict[str, Any] = {}
        for key, value in block.items():
            if key == "text":
                out[key] = self.redact(value) if isinstance(value, str) else value
            elif key == "json":
                out[key] = self.redact_value(value)
            elif key == "toolUse" and isinstance(value, Mapping):
                out[key] = {
                    k: v if k in _TOOL_USE_KEEP else self.redact_value(v) for k, v in value.items()
                }
            elif key == "toolResult" and isinstance(value, Mapping):
                out[key] = {
                    k: v
                    if k in _TOOL_RESULT_KEEP
                    else [self._block(b) for b in v]
                    if k == "content" and isinstance(v, list)
                    else self.redact_value(v)
                    for k, v in value.items()
                }
            elif key == "reasoningContent" and isinstance(value, Mapping):
                out[key] = self._reasoning(value)
            elif key in ("image", "document", "video") and isinstance(value, Mapping):
                out[key] = {
                    k: v if k in ("format", "source") else self.redact_value(v)
                    for k, v in value.items()
                }
            else:
                out[key] = self.redact_value(value)
        return out

    def _reasoning(self, value: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, inner in value.items():
            if key == "reasoningText" and isinstance(inner, Mapping):
                out[key] = {
                    k: v if k == "signature" else self.redact_value(v) for k, v in inner.items()
                }
            else:
                out[key] = (
                    inner if isinstance(inner, bytes | bytearray) else self.redact_value(inner)
                )
        return out
