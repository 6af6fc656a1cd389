"""PII detectors: fast regular expressions, each hit checked before it counts (pure).

A :class:`Detector` names a ``kind`` (its hits are replaced by ``"[kind]"``) and
finds the spans of its hits in a string. :class:`PatternDetector` is one built from a
regular expression and an optional check of each match; the built-in detectors
(:data:`BUILTIN_DETECTORS`) are pattern detectors too:

- ``email``: ``local@domain.tld``;
- ``card``: 14–19 digits (single spaces or dashes between them allowed) that start
  as a card network's numbers do and have their length (Visa, Mastercard, American
  Express, Discover, JCB, Diners Club, UnionPay, Maestro) and pass the Luhn check;
- ``iban``: a country code, two check digits and the country's length of letters and
  digits (grouped by spaces or not) that pass the ISO 13616 mod-97 check;
- ``ip``: IPv4 dotted quads and IPv6 addresses (checked by :mod:`ipaddress`; ``::1``
  and other addresses of fewer than two groups are left alone);
- ``phone``: an international number (``+`` then 8–15 digits, separators allowed),
  or a national one of 7–15 digits in groups: opening with its trunk ``0``
  (``06 12 34 56 78``, ``020 7946 0958``), with its area code in parentheses
  (``(555) 123-4567``), in North America's 3-3-4 shape (``555-123-4567``), or in
  three groups or more joined by dashes or dots (one kind of separator). A bare run
  of digits is no phone number (ids, timestamps, amounts), and neither is what reads
  as a date (``2024-01-15``, ``15/01/2024``), a decimal or a thousands-grouped amount
  (``1234.56``, ``1.234.567``), a version (``1.2.3``), a list (``100 1000``) or a
  range (``1000-2000``). US local numbers (``555-1234``) are not caught.

Nothing here needs a model: a named-entity recogniser (spaCy and the like) can be
plugged in as a :class:`Detector` by whoever can install one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

__all__ = [
    "BUILTIN_DETECTORS",
    "Detector",
    "PatternDetector",
    "iban_is_valid",
    "luhn_is_valid",
]

_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")


@runtime_checkable
class Detector(Protocol):
    """Finds one kind of sensitive value in text.

    Attributes:
        kind: the name of what it finds (lower case, ``[a-z][a-z0-9_]*``); each hit
            is replaced by ``"[kind]"``.
    """

    kind: str

    def find(self, text: str) -> Iterable[tuple[int, int]]:
        """The ``(start, end)`` spans of the hits in ``text``, in order, not overlapping."""
        ...


class PatternDetector:
    """A :class:`Detector` made of a regular expression and an optional check.

    Args:
        kind: what it finds; hits become ``"[kind]"``.
        pattern: a regular expression (a string or compiled); each match is a
            candidate. With a group named ``hit``, only that group is replaced.
        check: called with each candidate's text; ``False`` drops it.
        needs: a quick test of the whole text (e.g. ``"@"`` for emails): when the
            text does not contain it the pattern is not run at all.

    Raises:
        ValueError: ``kind`` is not a lower-case name.
        TypeError: ``pattern`` is not a string or pattern, or ``check`` not callable.
    """

    def __init__(
        self,
        kind: str,
        pattern: str | re.Pattern[str],
        *,
        check: Callable[[str], bool] | None = None,
        needs: str | None = None,
    ) -> None:
        self.kind = check_kind_name(kind)
        if isinstance(pattern, str):
            pattern = re.compile(pattern)
        elif not isinstance(pattern, re.Pattern):
            raise TypeError(f"pattern must be a str or re.Pattern, got {type(pattern).__name__}")
        if check is not None and not callable(check):
            raise TypeError(f"check must be callable or None, got {type(check).__name__}")
        self.pattern: re.Pattern[str] = pattern
        self.check = check
        self.needs = needs
        self._group: str | int = "hit" if "hit" in pattern.groupindex else 0

    def __repr__(self) -> str:
        return f"PatternDetector({self.kind!r}, {self.pattern.pattern!r})"

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        """The spans of the matches that pass ``check``."""
        if self.needs is not None and self.needs not in text:
            return
        group, check = self._group, self.check
        for match in self.pattern.finditer(text):
            if check is None or check(match.group(group)):
                yield match.span(group)


def check_kind_name(kind: object) -> str:
    """``kind`` if it is a valid detector kind name.

    Raises:
        TypeError: not a str.
        ValueError: not a lower-case name of at most 32 characters.
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {type(kind).__name__}")
    if not _KIND.fullmatch(kind):
        raise ValueError(f"kind {kind!r} must be a lower-case name ([a-z][a-z0-9_]*)")
    return kind


# ----------------------------------------------------------------- checksums


def luhn_is_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (payment cards)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


# ISO 13616 lengths of the countries that issue IBANs (SWIFT's registry).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24,
    "DE": 22, "DJ": 27, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18,
    "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27,
    "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27,
    "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27,
    "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28,
    "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31,
    "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip


def iban_is_valid(iban: str) -> bool:
    """Whether ``iban`` (spaces allowed) has its country's length and passes mod-97."""
    compact = iban.replace(" ", "").upper()
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact.isalnum():
        return False
    if not compact[2:4].isdigit():
        return False
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(char, 36)) for char in rearranged)
    return int(number) % 97 == 1


# ----------------------------------------------------------------- the built-in ones
#
# Speed: Python's regex engine scans fast only for a pattern whose first item is a
# literal or a character set, so no built-in pattern starts with a lookbehind: the
# "not inside a word" test comes after the first character, as a lookbehind over it
# and the one before. Emails and IPv6 addresses are found from their ``@`` and ``:``.

# Every character RFC 5322 allows in an unquoted local part ("atext" and dots):
# o'brien@… and a&b@… are addresses, and a narrower set left their start behind.
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}\Z")
_EMAIL_DOMAIN = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])"
)


class _EmailDetector:
    """``local@domain.tld``, found from each ``@``."""

    kind = "email"

    def __repr__(self) -> str:
        return "EmailDetector()"

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        at = text.find("@")
        floor = 0  # where the previous hit ended
        while at >= 0:
            local = _EMAIL_LOCAL.search(text, max(floor, at - 64), at)
            domain = _EMAIL_DOMAIN.match(text, at + 1)
            if local is not None and domain is not None:
                start = local.start()
                while start < at and not text[start].isalnum():
                    start += 1  # a local part starts with a letter or digit
                if start < at:
                    yield start, domain.end()
                    floor = domain.end()
                    at = text.find("@", floor)
                    continue
            at = text.find("@", at + 1)


# Digits and what may sit between them in a card, a phone number or an IPv4
# address. The engine finds each long run once per text (most runs of digits in
# text are short), and the detailed patterns only look inside those runs: a regex
# attempt at every digit of the text, for each detector, would cost more than all
# the rest of a redaction.
_LONG_RUN = re.compile(r"[+(0-9][0-9 .()+-]{5,}[0-9]")
# The last text scanned and its runs: the card, IPv4 and phone detectors run one
# after the other over the same text (a tuple, replaced whole: safe across threads).
_last_runs: tuple[str, list[tuple[int, int]]] = ("", [])


def _long_runs(text: str) -> list[tuple[int, int]]:
    """The spans of ``_LONG_RUN`` in ``text`` (memoized for the last text)."""
    global _last_runs
    memo = _last_runs
    if memo[0] is text:
        return memo[1]
    runs = [match.span() for match in _LONG_RUN.finditer(text)]
    _last_runs = (text, runs)
    return runs


def _hits_in_runs(
    pattern: re.Pattern[str],
    text: str,
    shortest: int,
    check: Callable[[str], bool],
    skip: re.Pattern[str] | None = None,
    cut: Callable[[str], int] | None = None,
    longest: int | None = None,
) -> Iterator[tuple[int, int]]:
    """The spans of ``pattern``'s matches that pass ``check``, inside the long runs.

    Only runs of at least ``shortest`` characters are searched, and not one that
    ``skip`` matches whole (for phone numbers: a date, an amount, a bare number).
    After a match that fails ``check`` the search goes on from its second
    character, so a greedy match that took a number too many does not hide the
    hit after it; ``cut``, when given, first offers a shorter hit at the match's
    start (its length, or 0 for none). A failed match of more than ``longest``
    digits in groups joined by one kind of separator is passed over whole: such a
    run (an account number, a list of ids) holds no phone number, and no part of it
    is taken for one (which would also make a second redaction find what the first
    left). The pattern's lookbehinds see the text before a run, and its
    lookaheads two characters past it.
    """
    for start, end in _long_runs(text):
        if end - start < shortest or (skip is not None and skip.fullmatch(text, start, end)):
            continue
        stop = min(end + 2, len(text))
        pos = start
        while True:
            match = pattern.search(text, pos, stop)
            if match is None:
                break
            if check(match.group()):
                yield match.span()
                pos = match.end()
                continue
            length = cut(match.group()) if cut is not None else 0
            if longest is not None and _one_long_number(match.group(), longest):
                pos = match.end()
            elif length:
                yield match.start(), match.start() + length
                pos = match.start() + length
            else:
                pos = match.start() + 1


# 13-19 digits, single spaces or dashes allowed between them; not inside a word, a
# number (a decimal point or thousands separator next to it) or a longer run.
_CARD = re.compile(r"[2-6](?<![\w.,+-][2-6])(?:[ -]?[0-9]){12,18}(?![\w]|[.,-][0-9])")


def _card_check(candidate: str) -> bool:
    if " " in candidate and "-" in candidate:
        return False  # both kinds of separator: not how a card number is written
    digits = candidate.replace(" ", "").replace("-", "")
    if len(digits) != len(candidate) and not _card_groups_ok(candidate):
        return False  # "5062300969 107": two numbers, not one card
    return _issuer_length_ok(digits) and luhn_is_valid(digits)


def _card_groups_ok(candidate: str) -> bool:
    """Whether a card written with separators has a card's groups: fours (the last
    one shorter), or American Express's and Diners Club's 4-6-5 and 4-6-4."""
    sizes = [len(group) for group in re.split(r"[ -]", candidate)]
    if sizes[:2] == [4, 6] and len(sizes) == 3 and sizes[2] in (4, 5):
        return True
    return all(size == 4 for size in sizes[:-1]) and 1 <= sizes[-1] <= 4


# (first digits, lengths) of the card networks, from ISO/IEC 7812 issuer ranges.
_ISSUERS: tuple[tuple[tuple[str, ...], frozenset[int]], ...] = (
    (("4",), frozenset({16, 19})),  # Visa (its old 13-digit numbers look like any id)
    (("51", "52", "53", "54", "55", "22", "23", "24", "25", "26", "27"), frozenset({16})),
    (("34", "37"), frozenset({15})),  # American Express
    (("6011", "644", "645", "646", "647", "648", "649", "65"), frozenset(range(16, 20))),
    (("35",), frozenset(range(16, 20))),  # JCB
    (("36",), frozenset(range(14, 20))),  # Diners Club International
    (("300", "301", "302", "303", "304", "305", "38", "39"), frozenset(range(16, 20))),
    (("62",), frozenset(range(16, 20))),  # UnionPay
    (("50", "56", "57", "58", "6"), frozenset(range(16, 20))),  # Maestro (its 12-15: rare)
)


def _issuer_length_ok(digits: str) -> bool:
    """Whether ``digits`` starts as some network's cards do and has their length."""
    return any(
        len(digits) in lengths and digits.startswith(prefixes) for prefixes, lengths in _ISSUERS
    )


class _CardDetector:
    """Payment cards: an issuer's first digit, 13-19 digits, Luhn.

    A greedy match may have taken the next number too (``4111 1111 1111 1111 2``):
    when the whole fails, the match cut at each earlier separator is tried.
    """

    kind = "card"

    def __repr__(self) -> str:
        return "CardDetector()"

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        return _hits_in_runs(_CARD, text, 13, _card_check, cut=_card_cut)


def _card_cut(candidate: str) -> int:
    """The length of the longest valid card at the start of ``candidate`` (0: none)."""
    for end in range(len(candidate) - 1, 12, -1):
        if candidate[end] in " -" and _card_check(candidate[:end]):
            return end
    return 0


# A country code and check digits; the rest is taken by the country's length.
_IBAN = re.compile(
    r"[A-Z][A-Z](?<![A-Za-z0-9][A-Z][A-Z])[0-9]{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])"
)


class _IbanDetector:
    """IBANs: the country's exact length, then mod-97 (see :func:`iban_is_valid`).

    A greedy match may have taken a following word (``DE89 3704 … 00 AND``): the
    candidate is cut to the country's length, at a group boundary.
    """

    kind = "iban"

    def __repr__(self) -> str:
        return "IbanDetector()"

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        pos = 0
        while (match := _IBAN.search(text, pos)) is not None:
            # Go on from the second character, or from the end of a hit: the greedy
            # match may have taken the start of the next IBAN.
            pos = match.start() + 1
            candidate = match.group()
            length = IBAN_LENGTHS.get(candidate[:2])
            if length is None:
                continue
            seen = end = 0
            for index, char in enumerate(candidate):
                if char != " ":
                    seen += 1
                    if seen == length:
                        end = index + 1
                        break
            if not end or (end < len(candidate) and candidate[end] != " "):
                continue  # too short, or the number goes on past the country's length
            if iban_is_valid(candidate[:end]):
                yield match.start(), match.start() + end
                pos = match.start() + end


_IPV4 = re.compile(
    r"[0-9](?<![\w.][0-9])[0-9]{0,2}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?![\w]|\.[0-9])"
)
_IPV6_AROUND = re.compile(r":[0-9A-Fa-f]{0,4}:")
_HEX_COLON = frozenset("0123456789abcdefABCDEF:")
_IPV6_RIGHT = re.compile(r"[0-9A-Fa-f:]{0,45}")


def _ipv4_check(candidate: str) -> bool:
    return all(
        int(octet) <= 255 and (octet == "0" or not octet.startswith("0"))
        for octet in candidate.split(".")
    )


def _ipv6_check(candidate: str) -> bool:
    if "::" not in candidate and candidate.count(":") != 7:
        return False  # 10:20:30, a MAC address: not the shape of an IPv6 address
    if sum(1 for group in candidate.split(":") if group) < 2:
        return False  # "::", "::1", "a::": no one's address
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return True


class _IpDetector:
    """IPv4 and IPv6 addresses (IPv6 found from a ``:x:`` or ``::`` in the text)."""

    kind = "ip"

    def __repr__(self) -> str:
        return "IpDetector()"

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        spans = list(_hits_in_runs(_IPV4, text, 7, _ipv4_check))
        pos = 0
        while True:
            around = _IPV6_AROUND.search(text, pos)
            if around is None:
                break
            start = around.start()
            if around.end() - start == 2 or text.count(":", max(0, start - 40), start + 40) >= 7:
                pass  # a "::", or enough colons around for a full address
            else:
                pos = around.end() - 1
                continue  # 10:20:30, a MAC address: not an IPv6 address
            floor = max(0, start - 45)
            while start > floor and text[start - 1] in _HEX_COLON:
                start -= 1
            right = _IPV6_RIGHT.match(text, around.end())
            end = right.end() if right is not None else around.end()
            pos = end
            if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_.:"):
                continue
            if end < len(text) and (text[end].isalnum() or text[end] == "_"):
                continue
            if _ipv6_check(text[start:end]):
                spans.append((start, end))
        spans.sort()
        yield from spans


# Only searched inside long runs of digits, so it may start with a lookbehind. An
# opening parenthesis belongs to the number only when it closes around the prefix.
_PHONE = re.compile(
    r"(?<![\w.,:/+-])(?:\(\+?[0-9]{1,5}\) ?|\+)?[0-9][0-9 .()-]{4,22}[0-9](?![\w:/]|[.,-][0-9])"
)
# What a phone-shaped run of digits is when it is no phone number.
_NOT_A_PHONE = re.compile(
    r"[0-9]+"  # a bare run of digits: an id, a timestamp, an amount
    r"|[0-9]{4}[-/.][0-9]{1,2}[-/.][0-9]{1,2}"  # 2024-01-15
    r"|[0-9]{1,2}[-/.][0-9]{1,2}[-/.][0-9]{2,4}"  # 15/01/2024
    r"|[0-9]+\.[0-9]+"  # 1234.56
    r"|[0-9]{1,3}(?:\.[0-9]{3})+"  # 1.234.567
    r"|[0-9]{1,3}(?: [0-9]{3})+"  # 1 234 567
)
_NOT_A_PHONE_INSIDE = re.compile(r"[ .()-]{3}|[ .-]{2}|[0-9]{6}")  # odd separators; long groups
_NANP = re.compile(r"[2-9][0-9]{2}([ .-])[2-9][0-9]{2}\1[0-9]{4}")
_GROUPS = re.compile(r"[0-9]+")
_DIGITS = frozenset("0123456789")
_SEPARATORS = str.maketrans("", "", " .()+-")


def _phone_check(candidate: str) -> bool:
    digits = len(candidate.translate(_SEPARATORS))
    if candidate[0] == "+" or candidate.startswith("(+"):
        return 8 <= digits <= 15 and "+" not in candidate[2:]
    if not 7 <= digits <= 15 or _NOT_A_PHONE.fullmatch(candidate) is not None:
        return False
    if _NOT_A_PHONE_INSIDE.search(candidate) is not None:
        return False
    # Numbers next to each other ("100 1000", "pages 1000-2000") are lists and ranges:
    # a national number opens with its trunk 0, is written (555) 123-4567 or in
    # North America's 3-3-4 shape, or has at least three groups joined by dashes or dots.
    if candidate[0] == "(" or _NANP.fullmatch(candidate):
        return True
    if len(set(candidate) - _DIGITS) > 1:
        return False  # "01.01.999 2000-01-01": separators of two kinds, two values
    if candidate[0] == "0" and candidate[1:2].isdigit():
        return True
    return " " not in candidate and len(_GROUPS.findall(candidate)) >= 3


def _one_long_number(candidate: str, longest: int) -> bool:
    """More than ``longest`` digits, in groups joined by one kind of separator."""
    digits = candidate.translate(_SEPARATORS)
    return len(digits) > longest and len(set(candidate) - _DIGITS) <= 1


class _RunDetector:
    """A pattern detector that looks only inside runs of digits (see ``_RUN``)."""

    def __init__(
        self,
        kind: str,
        pattern: re.Pattern[str],
        check: Callable[[str], bool],
        shortest: int,
        skip: re.Pattern[str] | None = None,
        longest: int | None = None,
    ) -> None:
        self.kind = kind
        self._skip = skip
        self._longest = longest
        self._pattern = pattern
        self._check = check
        self._shortest = shortest

    def __repr__(self) -> str:
        return f"{self.kind.capitalize()}Detector()"

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        return _hits_in_runs(
            self._pattern, text, self._shortest, self._check, self._skip, longest=self._longest
        )


BUILTIN_DETECTORS: dict[str, Detector] = {
    "email": _EmailDetector(),
    "iban": _IbanDetector(),
    "card": _CardDetector(),
    "ip": _IpDetector(),
    "phone": _RunDetector("phone", _PHONE, _phone_check, 7, _NOT_A_PHONE, longest=15),
}
"""The built-in detectors by kind, in the order a redactor runs them: each later one
sees the text with the earlier ones' hits already replaced (an email's digits are
never taken for a phone number, nor an IBAN's for a card)."""
