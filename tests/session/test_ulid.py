"""ULIDs for snapshot ids: Crockford base32, time-ordered, monotonic (pure module)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.session.ulid import (
    MonotonicUlid,
    decode_ulid,
    encode_ulid,
    is_ulid,
    new_ulid,
    ulid_timestamp_ms,
)

_TS = st.integers(min_value=0, max_value=(1 << 48) - 1)
_RAND = st.integers(min_value=0, max_value=(1 << 80) - 1)


def test_known_values() -> None:
    assert encode_ulid(0, 0) == "0" * 26
    assert encode_ulid((1 << 48) - 1, (1 << 80) - 1) == "7" + "Z" * 25
    assert encode_ulid(1469918176385, 0) == "01ARYZ6S41" + "0" * 16
    assert decode_ulid("01ARYZ6S410000000000000001") == (1469918176385, 1)


@given(_TS, _RAND)
def test_round_trip(timestamp: int, randomness: int) -> None:
    text = encode_ulid(timestamp, randomness)
    assert is_ulid(text)
    assert decode_ulid(text) == (timestamp, randomness)
    assert ulid_timestamp_ms(text) == timestamp


@given(_TS, _RAND, _TS, _RAND)
def test_string_order_is_time_then_randomness_order(t1: int, r1: int, t2: int, r2: int) -> None:
    a, b = encode_ulid(t1, r1), encode_ulid(t2, r2)
    assert (a < b) == ((t1, r1) < (t2, r2))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "01ARYZ6S41000000000000000",  # 25 characters
        "01ARYZ6S4100000000000000000",  # 27
        "01aryz6s410000000000000000",  # lower case is not canonical
        "01ARYZ6S41000000000000000I",  # I, L, O, U are not in the alphabet
        "01ARYZ6S41000000000000000U",
        "81ARYZ6S410000000000000000",  # more than 128 bits
        "01ARYZ6S41-000000000000000",
    ],
)
def test_invalid_ulids(text: str) -> None:
    assert not is_ulid(text)
    with pytest.raises(ValueError, match="not a ULID"):
        decode_ulid(text)


def test_is_ulid_of_non_strings() -> None:
    assert not is_ulid(None)
    assert not is_ulid(12)


def test_encode_checks_ranges() -> None:
    with pytest.raises(ValueError, match="timestamp_ms"):
        encode_ulid(1 << 48, 0)
    with pytest.raises(ValueError, match="randomness"):
        encode_ulid(0, -1)


def test_monotonic_within_one_millisecond() -> None:
    maker = MonotonicUlid(clock_ms=lambda: 1000, random_bits=lambda n: 5)
    ids = [maker.new() for _ in range(100)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 100
    assert [decode_ulid(i) for i in ids[:3]] == [(1000, 5), (1000, 6), (1000, 7)]


def test_monotonic_when_the_clock_steps_back() -> None:
    times = iter([2000, 1000, 1000, 2500])
    maker = MonotonicUlid(clock_ms=lambda: next(times), random_bits=lambda n: 10)
    ids = [maker.new() for _ in range(4)]
    assert ids == sorted(ids)
    assert [decode_ulid(i)[0] for i in ids] == [2000, 2000, 2000, 2500]


def test_randomness_overflow_moves_to_the_next_millisecond() -> None:
    maker = MonotonicUlid(clock_ms=lambda: 7, random_bits=lambda n: (1 << n) - 1)
    first, second = maker.new(), maker.new()
    assert decode_ulid(first) == (7, (1 << 80) - 1)
    assert decode_ulid(second)[0] == 8
    assert first < second


def test_observe_puts_later_ids_after_ids_made_elsewhere() -> None:
    maker = MonotonicUlid(clock_ms=lambda: 100, random_bits=lambda n: 0)
    future = encode_ulid(10_000, 42)
    maker.observe(future)
    assert maker.new() == encode_ulid(10_000, 43)
    maker.observe(encode_ulid(5, 5))  # older: ignored
    assert maker.new() == encode_ulid(10_000, 44)
    with pytest.raises(ValueError, match="not a ULID"):
        maker.observe("nope")


def test_real_clock_ids_are_unique_and_increasing_across_threads() -> None:
    results: list[list[str]] = []

    def work() -> None:
        results.append([new_ulid() for _ in range(500)])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [i for chunk in results for i in chunk]
    assert len(set(everything)) == len(everything)
    for chunk in results:
        assert chunk == sorted(chunk)
