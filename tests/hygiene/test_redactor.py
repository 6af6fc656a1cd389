"""PIIRedactor: every valid card, IBAN, email and IP is caught; ids, dates, hashes are not."""

from __future__ import annotations

import copy
import hashlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.hygiene import (
    DEFAULT_KINDS,
    Detector,
    PatternDetector,
    PIIRedactor,
    iban_is_valid,
    luhn_is_valid,
)
from perdure.hygiene.detectors import IBAN_LENGTHS
from perdure.session.ulid import new_ulid

REDACTOR = PIIRedactor()
MARKERS = re.compile(r"\[(email|phone|card|iban|ip)\]")

# ------------------------------------------------------------------ generators


def _luhn_complete(body: str) -> str:
    """``body`` plus the check digit that makes it pass Luhn."""
    for digit in "0123456789":
        if luhn_is_valid(body + digit):
            return body + digit
    raise AssertionError("unreachable")


@st.composite
def cards(draw: st.DrawFn) -> str:
    prefix, length = draw(
        st.sampled_from([("4", 16), ("4", 19), ("51", 16), ("55", 16), ("2221", 16),
                         ("34", 15), ("37", 15), ("6011", 16), ("65", 19), ("35", 16), ("36", 14),
                         ("62", 17), ("6304", 16)])
    )  # fmt: skip
    rest = draw(st.text("0123456789", min_size=length - len(prefix) - 1,
                        max_size=length - len(prefix) - 1))  # fmt: skip
    number = _luhn_complete(prefix + rest)
    separator = draw(st.sampled_from(["", " ", "-"]))
    if prefix in ("34", "37") and draw(st.booleans()):
        return separator.join([number[:4], number[4:10], number[10:]])  # Amex's 4-6-5
    return separator.join(number[i : i + 4] for i in range(0, len(number), 4))


@st.composite
def ibans(draw: st.DrawFn) -> str:
    country = draw(st.sampled_from(sorted(IBAN_LENGTHS)))
    size = IBAN_LENGTHS[country] - 4
    bban = draw(st.text("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=size, max_size=size))
    numeric = "".join(str(int(char, 36)) for char in bban + country + "00")
    iban = f"{country}{98 - int(numeric) % 97:02d}{bban}"
    if draw(st.booleans()):
        iban = " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))
    return iban


@st.composite
def emails(draw: st.DrawFn) -> str:
    alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    local = draw(st.text(alnum, min_size=1, max_size=1)) + draw(
        st.text(alnum + "._+-'&!#$%*/=?^`{|}~", max_size=20)
    )
    labels = draw(st.lists(st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1,
                                   max_size=12), min_size=1, max_size=3))  # fmt: skip
    tld = draw(st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=6))
    return f"{local}@{'.'.join(labels)}.{tld}"


@pytest.mark.parametrize(
    "email", ["o'brien@example.ie", "d'angelo.marco@example.it", "a&b@example.com", "x!y#z@a.io"]
)
def test_an_email_with_any_character_a_local_part_may_hold_is_redacted_whole(email: str) -> None:
    assert REDACTOR.redact(f"mail {email} now") == "mail [email] now"


def _surrounded(value: str) -> list[str]:
    return [
        value,
        f"my number is {value}.",
        f"({value})",
        f"pay with {value}, thanks",
        f'{{"field": "{value}"}}',
        f"line one\n{value}\nline three",
    ]


def _only_marker(text: str, value: str, marker: str) -> None:
    for wrapped in _surrounded(value):
        out = REDACTOR.redact(wrapped)
        assert value not in out, (wrapped, out)
        assert out == wrapped.replace(value, marker), (wrapped, out)


# ------------------------------------------------------------------ no false negatives


@settings(max_examples=300)
@given(cards())
def test_every_luhn_valid_card_is_redacted(card: str) -> None:
    _only_marker(card, card, "[card]")


@settings(max_examples=300)
@given(ibans())
def test_every_valid_iban_is_redacted(iban: str) -> None:
    assert iban_is_valid(iban)
    _only_marker(iban, iban, "[iban]")


@settings(max_examples=300)
@given(emails())
def test_every_email_is_redacted(email: str) -> None:
    _only_marker(email, email, "[email]")


@settings(max_examples=200)
@given(st.ip_addresses(v=4))
def test_every_ipv4_address_is_redacted(address: Any) -> None:
    _only_marker(str(address), str(address), "[ip]")


@settings(max_examples=200)
@given(st.ip_addresses(v=6))
def test_every_ipv6_address_of_two_groups_or_more_is_redacted(address: Any) -> None:
    for text in (address.compressed, address.exploded):
        if sum(1 for group in text.split(":") if group) >= 2 and "." not in text:
            _only_marker(text, text, "[ip]")


@pytest.mark.parametrize(
    "phone",
    [
        "+44 20 7946 0958",
        "+1 (555) 123-4567",
        "+33 6 12 34 56 78",
        "+4915112345678",
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "06 12 34 56 78",
        "030 1234 5678",
    ],
)
def test_phone_numbers_are_redacted(phone: str) -> None:
    _only_marker(phone, phone, "[phone]")


def test_invalid_cards_and_ibans_are_left_alone() -> None:
    card = _luhn_complete("411111111111111")
    broken = card[:-1] + str((int(card[-1]) + 1) % 10)
    assert REDACTOR.redact(f"card {broken}") == f"card {broken}"
    assert REDACTOR.redact("GB82 WEST 1234 5698 7654 33") == "GB82 WEST 1234 5698 7654 33"


def test_a_greedy_match_does_not_hide_the_hit_after_it() -> None:
    out = REDACTOR.redact(
        "4111 1111 1111 1111 2 x; 123456 555-123-4567; DE89370400440532013000 AND"
    )
    assert out == "[card] 2 x; 123456 [phone]; [iban] AND"


# ------------------------------------------------------------------ no false positives


@st.composite
def innocent(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["date", "datetime", "ulid", "hash", "version", "uuid",
                                 "amount", "time", "id"]))  # fmt: skip
    if kind == "date":
        d = draw(st.dates())
        return draw(st.sampled_from([d.isoformat(), d.strftime("%d/%m/%Y"), d.strftime("%Y/%m/%d"),
                                     d.strftime("%d.%m.%Y")]))  # fmt: skip
    if kind == "datetime":
        return draw(st.datetimes()).isoformat() + draw(st.sampled_from(["", "Z", "+02:00"]))
    if kind == "ulid":
        return new_ulid()
    if kind == "hash":
        data = draw(st.binary())
        algo = draw(st.sampled_from(["sha256", "sha1", "md5"]))
        return hashlib.new(algo, data).hexdigest()
    if kind == "version":
        parts = draw(st.lists(st.integers(0, 99), min_size=2, max_size=3))
        return draw(st.sampled_from(["", "v"])) + ".".join(map(str, parts))
    if kind == "uuid":
        return str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1))))
    if kind == "amount":
        value = draw(st.integers(0, 10**9))
        return draw(st.sampled_from([f"{value:,}", f"{value:,}.{value % 100:02d}",
                                     f"{value}.{value % 100:02d}",
                                     f"{value:,}".replace(",", ".")]))  # fmt: skip
    if kind == "time":
        return draw(st.times()).isoformat()
    return str(draw(st.integers(0, 10**13)))


@settings(max_examples=500)
@given(innocent())
def test_ids_dates_hashes_versions_and_amounts_are_not_redacted(value: str) -> None:
    for text in (value, f"at {value} we", f"id={value}", f"[{value}]"):
        assert REDACTOR.redact(text) == text


@settings(max_examples=200)
@given(st.lists(innocent(), min_size=2, max_size=8))
def test_runs_of_innocent_values_are_not_redacted(values: list[str]) -> None:
    # Joined by ", ": numbers joined by single spaces may be a phone number for real
    # ("200 200 1000" is North America's 3-3-4 shape, which the detector takes).
    text = ", ".join(values)
    assert REDACTOR.redact(text) == text


# ------------------------------------------------------------------ structure


def _message() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"text": "mail bob@example.com"},
            {"reasoningContent": {"reasoningText": {"text": "card 4111111111111111",
                                                    "signature": "sig+44 20 7946 0958"}}},
            {"toolUse": {"toolUseId": "tooluse_4111111111111111", "name": "lookup",
                         "input": {"email": "bob@example.com", "nested": ["+44 20 7946 0958"],
                                   "bob@example.com": 1}}},
            {"toolResult": {"toolUseId": "t-1", "status": "success",
                            "content": [{"text": "IBAN DE89370400440532013000"},
                                        {"json": {"ip": "10.0.0.1", "n": 5}}]}},
            {"image": {"format": "png", "source": {"bytes": b"bob@example.com"}}},
        ],
    }  # fmt: skip


def test_redact_message_redacts_content_keeps_structure_and_never_mutates() -> None:
    message = _message()
    before = copy.deepcopy(message)
    out = REDACTOR.redact_message(message)
    assert message == before
    assert out == {
        "role": "assistant",
        "content": [
            {"text": "mail [email]"},
            {"reasoningContent": {"reasoningText": {"text": "card [card]",
                                                    "signature": "sig+44 20 7946 0958"}}},
            {"toolUse": {"toolUseId": "tooluse_4111111111111111", "name": "lookup",
                         "input": {"email": "[email]", "nested": ["[phone]"], "[email]": 1}}},
            {"toolResult": {"toolUseId": "t-1", "status": "success",
                            "content": [{"text": "IBAN [iban]"},
                                        {"json": {"ip": "[ip]", "n": 5}}]}},
            {"image": {"format": "png", "source": {"bytes": b"bob@example.com"}}},
        ],
    }  # fmt: skip


def test_redact_value_walks_state_recursively_without_mutating() -> None:
    state = {"user": {"contacts": ["a@b.example", ("+44 20 7946 0958", 3)]}, "n": 1.5, "b": b"x"}
    before = copy.deepcopy(state)
    out = REDACTOR.redact_value(state)
    assert state == before
    assert out == {"user": {"contacts": ["[email]", ("[phone]", 3)]}, "n": 1.5, "b": b"x"}


# ------------------------------------------------------------------ configuration


def test_kinds_choose_the_detectors() -> None:
    text = "bob@example.com +44 20 7946 0958"
    assert PIIRedactor(kinds=["email"]).redact(text) == "[email] +44 20 7946 0958"
    assert PIIRedactor(kinds=()).redact(text) == text
    assert PIIRedactor().kinds == ("email", "iban", "card", "ip", "phone")
    assert set(DEFAULT_KINDS) == set(PIIRedactor().kinds)


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'passport'"):
        PIIRedactor(kinds=("email", "passport"))
    with pytest.raises(TypeError, match="kinds"):
        PIIRedactor(kinds="email")
    with pytest.raises(TypeError, match="Detector"):
        PIIRedactor(detectors=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="'email'"):
        PIIRedactor(detectors=[PatternDetector("email", r"x")])
    with pytest.raises(ValueError, match="kind"):
        PatternDetector("Not A Name", r"x")


def test_pattern_detectors_plug_in() -> None:
    passport = PatternDetector("passport", r"\b[A-Z]{2}[0-9]{7}\b", check=lambda s: s[:2] != "XX")
    redactor = PIIRedactor(kinds=["email"], detectors=[passport])
    assert redactor.redact("AB1234567 XX1234567 a@b.example") == "[passport] XX1234567 [email]"
    with_group = PatternDetector("secret", r"token=(?P<hit>\w+)")
    assert PIIRedactor(kinds=(), detectors=[with_group]).redact("token=abc1!") == "token=[secret]!"


def test_any_object_with_kind_and_find_is_a_detector() -> None:
    class Names:
        kind = "name"

        def find(self, text: str) -> Iterator[tuple[int, int]]:
            at = text.find("Alice")
            if at >= 0:
                yield at, at + 5

    assert isinstance(Names(), Detector)
    assert PIIRedactor(detectors=[Names()]).redact("Alice at a@b.example") == "[name] at [email]"


def test_checksums() -> None:
    assert luhn_is_valid("4111111111111111")
    assert not luhn_is_valid("4111111111111112")
    assert iban_is_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_is_valid("GB82 WEST 1234 5698 7654 33")
    assert not iban_is_valid("GB82 WEST 1234 5698 7654")  # not Britain's length


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(cards(), ibans(), emails(), innocent(), st.text(max_size=20)), max_size=6
    ).map(" ".join)
)
def test_redaction_is_idempotent(text: str) -> None:
    """Filters see stored values again (checkpoints, rewrites): a second pass changes nothing."""
    once = REDACTOR.redact(text)
    assert REDACTOR.redact(once) == once
