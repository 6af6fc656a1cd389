"""Hygiene benchmark: what a :class:`~perdure.hygiene.PIIRedactor` costs per message.

Run: ``.venv/bin/python benchmarks/hygiene.py [--rounds N]``

Prints one table: the time to redact 2 KB of prose (a customer's message with a
date, amounts, a version and an order number, no personal data; the same with an
email, a phone number, a card, an IBAN and an IP address in it), 2 KB of a tool
result full of ids, hashes, timestamps and amounts (the worst case for the detectors
that look at digits), and a whole 2 KB message with personal data (a text block
and a tool result) through ``redact_message``. Each figure is the median over ``--rounds`` rounds
(default 2,000). The floor is ``str.replace`` of one absent word over the same text,
measured in the same run (a pass over 2 KB of text that finds nothing).

Target (issue 20): redacting a 2 KB message costs <= 50 µs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from perdure.hygiene import PIIRedactor

_PROSE = (
    "Thanks for getting back to me so quickly. I looked at the invoice you sent on "
    "2024-03-15 and the total of 1,249.99 EUR does not match the quote from last month, "
    "which said 1,180.00 EUR for the same three licences. Could you check whether the "
    "upgrade to version 4.2.1 was billed twice? Our account has been with you since 2019 "
    "and we have never had this problem before. The order reference is 88213. "
)
_PII = (
    "Write to alice.smith@example.com or call +44 20 7946 0958; card 4111 1111 1111 1111, "
    "IBAN DE89 3704 0044 0532 0130 00, from 192.168.1.10. "
)
# A tool result full of ids, hashes, timestamps and amounts: the worst case for the
# detectors that look at digits.
_DENSE = (
    '{"id": "01HGW2N7K3ZQ8Y4W5V6T7S8R9P", "sha": "9f86d081884c7d659a2feaa0c55ad015", '
    '"at": "2024-01-15T10:20:30Z", "amount": 1234.50, "order": 123456789, "v": "2.10.3"} '
)


def _text(*pieces: str) -> str:
    text = ""
    while len(text) < 2048:
        text += pieces[len(text) % len(pieces)] if len(pieces) > 1 else pieces[0]
    return text[:2048]


def _median_us(action: Callable[[], object], rounds: int) -> float:
    times: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2000)
    rounds = parser.parse_args().rounds
    redactor = PIIRedactor()
    clean, dirty, dense = _text(_PROSE), _text(_PROSE, _PROSE, _PII), _text(_DENSE)
    message = {
        "role": "user",
        "content": [
            {"text": dirty[:1024]},
            {"toolResult": {"toolUseId": "t1", "status": "success",
                            "content": [{"text": dirty[1024:]}]}},
        ],
    }  # fmt: skip
    cases: list[tuple[str, Callable[[], object]]] = [
        ("floor: str.replace over 2 KB", lambda: clean.replace("zzz", "")),
        ("redact 2 KB prose, no PII", lambda: redactor.redact(clean)),
        ("redact 2 KB prose with PII", lambda: redactor.redact(dirty)),
        ("redact 2 KB of ids and hashes", lambda: redactor.redact(dense)),
        ("redact_message, 2 KB with PII", lambda: redactor.redact_message(message)),
    ]
    rows = [(name, _median_us(action, rounds)) for name, action in cases]
    print(f"{'what':<34} {'median µs':>10}")
    for name, micros in rows:
        print(f"{name:<34} {micros:>10.1f}")
    print(f"target: a 2 KB message <= 50 µs; measured {rows[-1][1]:.1f} µs")


if __name__ == "__main__":
    main()
