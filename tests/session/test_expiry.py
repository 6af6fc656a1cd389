"""The TTL rules every store follows (perdure.session.expiry), and ``?ttl=`` in URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from perdure.errors import SessionNotFoundError
from perdure.session import open_store
from perdure.session.expiry import (
    TOMB_MIN_SECONDS,
    check_ttl,
    epoch_of,
    expires_at,
    id_status,
    is_expired,
    iso_time,
    not_found,
    tomb_seconds,
)


@pytest.mark.parametrize("bad", [0, -1, 0.0, "60", True, float("nan"), float("inf"), [1]])
def test_a_bad_ttl_is_a_value_error_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="ttl"):
        check_ttl(bad)


def test_a_ttl_is_none_or_seconds_as_a_float() -> None:
    assert check_ttl(None) is None
    assert check_ttl(2) == 2.0
    assert isinstance(check_ttl(2), float)


def test_a_session_expires_strictly_past_its_ttl() -> None:
    assert not is_expired(100.0, 10.0, 110.0)
    assert is_expired(100.0, 10.0, 110.001)
    assert not is_expired(0.0, None, 1e12)


def test_a_tombstone_lives_ten_ttls_and_a_week_at_least() -> None:
    assert tomb_seconds(60) == TOMB_MIN_SECONDS == 7 * 86400
    assert tomb_seconds(86400) == 10 * 86400


@pytest.mark.parametrize(
    ("exists", "used_at", "ttl", "now", "status"),
    [
        (True, 100.0, None, 1e9, "live"),
        (False, 100.0, None, 1e9, "unknown"),
        (True, None, 10.0, 1e9, "live"),  # no stamp (made before the ttl): live till used
        (False, None, 10.0, 1e9, "unknown"),
        (True, 100.0, 10.0, 105.0, "live"),
        (True, 100.0, 10.0, 111.0, "expired"),
        (False, 100.0, 10.0, 111.0, "expired"),  # gc deleted the data: the tombstone
        (False, 100.0, 10.0, 100.0 + TOMB_MIN_SECONDS + 1, "unknown"),  # tombstone over
        (True, 100.0, 10.0, 100.0 + TOMB_MIN_SECONDS + 1, "expired"),  # data still there
        (False, 100.0, 10.0, 105.0, "unknown"),  # deleted while live: never expired
    ],
)
def test_an_id_is_live_expired_or_unknown(
    exists: bool, used_at: float | None, ttl: float | None, now: float, status: str
) -> None:
    assert id_status(exists, used_at, ttl, now) == status


def test_not_found_says_why_in_its_details() -> None:
    gone = not_found("s", "here", expired=True, ttl=30)
    assert isinstance(gone, SessionNotFoundError)
    assert (gone.code, gone.details) == (
        "session_not_found",
        {"session_id": "s", "reason": "expired"},
    )
    assert "30 s" in gone.message
    never = not_found("s", "here", expired=False)
    assert never.details == {"session_id": "s", "reason": "unknown"}


def test_times_round_trip_and_expiry_is_last_use_plus_ttl() -> None:
    assert iso_time(0.5) == "1970-01-01T00:00:00.500000Z"
    assert epoch_of("1970-01-01T00:00:00.500000Z") == 0.5
    assert epoch_of("1970-01-01T00:00:01") == 1.0  # naive: UTC
    assert epoch_of("never") is None
    assert expires_at(10.0, 5.0) == iso_time(15.0)
    assert expires_at(10.0, None) is None
    assert expires_at(None, 5.0) is None


def test_local_store_urls_take_a_ttl(tmp_path: Path) -> None:
    sqlite = open_store(f"sqlite:{tmp_path / 'p.db'}?ttl=60&max_checkpoints=3")
    assert (sqlite.path, sqlite.ttl, sqlite.max_checkpoints) == (tmp_path / "p.db", 60, 3)  # type: ignore[attr-defined]
    file = open_store(f"file:{tmp_path / 'd'}?ttl=5&durability=none")
    assert (file.root, file.ttl, file.durability) == (tmp_path / "d", 5, "none")  # type: ignore[attr-defined]
    assert open_store("memory:?ttl=2").ttl == 2  # type: ignore[attr-defined]
    assert open_store("memory:").ttl is None  # type: ignore[attr-defined]
    assert not list(tmp_path.iterdir())  # opening does no I/O


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:{tmp}/p.db?ttl=0", "ttl must be None or a number of seconds > 0"),
        ("sqlite:{tmp}/p.db?ttl=soon", "ttl='soon' is not a number"),
        ("sqlite:{tmp}/p.db?tll=3", "tll= is not an option"),
        ("file:{tmp}/d?ttl=1&ttl=2", "gives ttl= twice"),
        ("memory:?durability=none", "durability= is not an option of a memory: store"),
    ],
)
def test_bad_ttl_options_in_a_url_are_value_errors(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url.format(tmp=tmp_path))


def test_an_option_in_the_url_and_as_a_keyword_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both give ttl"):
        open_store(f"sqlite:{tmp_path / 'p.db'}?ttl=3", ttl=4)
