"""Escaping for untrusted text placed inside the XML-like blocks injected into a request.

Injected text is often derived from users (memories are), so a stray ``</entry>`` in
it must not be able to close the surrounding element: that would break the block's
structure and open a stored prompt-injection path.
"""

from __future__ import annotations

__all__ = ["escape_xml_attr", "escape_xml_text"]


def escape_xml_text(text: str) -> str:
    """Escape ``text`` for an element body: ``&``, ``<`` and ``>``.

    ``&`` is replaced first, so an existing entity (``&lt;``) is escaped once more
    instead of being mistaken for markup.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_xml_attr(value: str) -> str:
    """Escape ``value`` for a quoted attribute: what :func:`escape_xml_text` does, plus quotes.

    Both ``"`` (``&quot;``) and ``'`` (``&apos;``) are escaped, so the value is safe
    in either kind of quotes.

    Raises:
        TypeError: ``value`` is not a str.
    """
    if not isinstance(value, str):
        raise TypeError(f"value must be a str, got {type(value).__name__}")
    return escape_xml_text(value).replace('"', "&quot;").replace("'", "&apos;")
