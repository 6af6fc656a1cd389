"""The rules every session store follows (perdure.session.rules), tested alone and
against the stores: what the rules decide is what the file, SQLite and memory
stores do."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import exit_code, fork_child
from perdure.checkpoints.storage import StorageCheckpointStore
from perdure.checkpoints.store import FileCheckpointStore, MemoryCheckpointStore
from perdure.errors import SessionConflictError
from perdure.session import SessionStore, rules
from perdure.session.paging import page_of, page_read_range
from perdure.session.rules import (
    ZERO_HASH,
    CommitRequest,
    PastOffset,
    chain_hash,
    check_extends,
    check_get_args,
    check_max_checkpoint_age,
    check_max_checkpoints,
    checkpoint_age_cutoff,
    commit_request,
    evicted_checkpoints,
    plan_commit,
    writes_anything,
)
from perdure.session.ulid import encode_ulid
from perdure.storage import MemoryStorage
from perdure.stores.file import journal
from perdure.stores.file.store import FileSessionStore
from perdure.stores.memory import MemorySessionStore
from perdure.stores.sqlite import SQLiteSessionStore

KINDS = ("file", "sqlite", "memory")


def msg(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": [{"text": text}]}


def request(
    messages: Sequence[Any],
    *,
    rewritten: bool = False,
    expected_tail: str | None = None,
    redactions: Mapping[Any, Any] | None = None,
    agent_state: Mapping[str, Any] | None = None,
) -> CommitRequest:
    return commit_request("s", messages, agent_state, rewritten, expected_tail, redactions)


def make(kind: str, root: Path) -> SessionStore:
    if kind == "file":
        return FileSessionStore(root / "files")
    if kind == "sqlite":
        return SQLiteSessionStore(root / "sessions.db")
    return MemorySessionStore()


def close(store: SessionStore) -> None:
    if isinstance(store, (FileSessionStore, SQLiteSessionStore)):
        store.close()


# ---------------------------------------------------------------- commit arguments


@pytest.mark.parametrize("key", [True, False])
def test_a_bool_is_no_redaction_index(key: bool) -> None:
    with pytest.raises(ValueError, match=f"redaction index {key!r} names no message"):
        request([msg("a"), msg("b")], redactions={key: msg("x")})


@pytest.mark.parametrize("key", [-1, 2, "0", 1.0, None])
def test_a_redaction_index_must_name_a_committed_message(key: Any) -> None:
    with pytest.raises(ValueError, match=r"names no message of session 's' \(it holds 2"):
        request([msg("a"), msg("b")], redactions={key: msg("x")})


def test_redactions_come_back_sorted_by_index() -> None:
    checked = request([msg("a"), msg("b"), msg("c")], redactions={2: msg("z"), 0: msg("y")})
    assert [index for index, _ in checked.redactions] == [0, 2]
    assert request([msg("a")], redactions={}).redactions == ()
    assert request([msg("a")]).redactions == ()


@pytest.mark.parametrize(
    ("arguments", "error", "names"),
    [
        (("s", "text", None, False, None, None), TypeError, "messages"),
        (("s", [], [], False, None, None), TypeError, "agent_state"),
        (("s", [], None, 1, None, None), TypeError, "rewritten"),
        (("s", [], None, False, 7, None), TypeError, "expected_tail"),
        (("s", [], None, False, None, [(0, {})]), TypeError, "redactions"),
        (("a/b", [], None, False, None, None), ValueError, "session"),
    ],
)
def test_commit_request_names_the_bad_argument(
    arguments: tuple[Any, ...], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        commit_request(*arguments)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_store_refuses_a_bool_redaction_index(kind: str, tmp_path: Path) -> None:
    """FileSessionStore once took ``{True: …}`` as index 1 and redacted message 1."""
    store = make(kind, tmp_path)
    try:
        await store.create("s")
        history = [msg("a"), msg("b", "assistant")]
        with pytest.raises(ValueError, match="redaction index True names no message"):
            await store.commit("s", history, redactions={True: msg("secret")})
        await store.commit("s", history)
        with pytest.raises(ValueError, match="redaction index True names no message"):
            await store.commit("s", history, redactions={True: msg("secret")})
        with pytest.raises(ValueError, match="redaction index True names no message"):
            await store.commit("s", history, rewritten=True, redactions={True: msg("secret")})
        assert (await store.get("s")).messages == history  # nothing redacted, nothing written
    finally:
        close(store)


# ---------------------------------------------------------------- planning

histories = st.lists(st.sampled_from("abcd"), max_size=6).map(lambda t: [msg(x) for x in t])


@given(stored=histories, new=histories)
def test_a_commit_of_stored_plus_new_appends_exactly_new(
    stored: list[dict[str, Any]], new: list[dict[str, Any]]
) -> None:
    commit = request(stored + new)
    plan = plan_commit(commit, len(stored), "tail")
    assert commit.messages[plan.start :] == new
    assert plan.compare_last == bool(stored)
    check_extends("s", commit.messages, len(stored), stored[-1:])  # no conflict
    assert writes_anything(commit, plan) == bool(new)


@given(stored=histories.filter(bool), new=histories, other=st.sampled_from("wxyz"))
def test_a_commit_that_diverges_at_the_stored_end_conflicts(
    stored: list[dict[str, Any]], new: list[dict[str, Any]], other: str
) -> None:
    diverged = [*stored[:-1], msg(other), *new]
    plan = plan_commit(request(diverged), len(stored), "tail")
    assert plan.compare_last
    with pytest.raises(SessionConflictError, match=f"different message at index {len(stored) - 1}"):
        check_extends("s", diverged, len(stored), stored[-1:])


@given(stored=histories.filter(bool), data=st.data())
def test_a_shorter_history_conflicts_unless_rewritten(
    stored: list[dict[str, Any]], data: st.DataObject
) -> None:
    shorter = stored[: data.draw(st.integers(0, len(stored) - 1))]
    with pytest.raises(SessionConflictError, match="a shorter history needs rewritten=True"):
        plan_commit(request(shorter), len(stored), "tail")
    plan = plan_commit(request(shorter, rewritten=True), len(stored), "tail")
    assert (plan.start, plan.compare_last) == (0, False)


@given(stored=histories, tail=st.text(max_size=8), expected=st.text(max_size=8))
def test_expected_tail_decides_alone(
    stored: list[dict[str, Any]], tail: str, expected: str
) -> None:
    commit = request([*stored, msg("n")], expected_tail=expected)
    if expected != tail:
        with pytest.raises(SessionConflictError, match="changed since this writer last saw it"):
            plan_commit(commit, len(stored), tail)
    else:
        plan = plan_commit(commit, len(stored), tail)
        assert (plan.start, plan.compare_last) == (len(stored), False)


def test_the_last_stored_message_as_redacted_also_extends() -> None:
    stored = [msg("a"), msg("secret")]
    check_extends("s", [msg("a"), msg("[redacted]"), msg("c")], 2, [stored[1], msg("[redacted]")])


# ---------------------------------------------------------------- chain hashing


@given(prev=st.text("0123456789abcdef", min_size=32, max_size=32), body=st.text())
def test_one_chain_hash_for_text_and_bytes(prev: str, body: str) -> None:
    try:
        data = body.encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate: never a stored body (encoders escape it)
    expected = hashlib.sha256((prev + body).encode("utf-8")).hexdigest()[:32]
    assert chain_hash(prev, body) == chain_hash(prev, data) == expected


@given(
    bodies=st.lists(
        st.dictionaries(st.sampled_from("tmsi"), st.text(max_size=5) | st.integers(), min_size=1),
        max_size=4,
    )
)
def test_the_journal_chains_records_with_the_same_hash(bodies: list[dict[str, Any]]) -> None:
    prev = journal.GENESIS
    assert prev == ZERO_HASH
    for body in bodies:
        line, digest = journal.encode_record(prev, body)
        assert digest == chain_hash(prev, b"{" + line[journal.BODY_AT :].rstrip(b"\n"))
        assert json.loads(line)["h"] == digest
        prev = digest


async def test_sqlite_rows_chain_with_the_same_hash(tmp_path: Path) -> None:
    import sqlite3

    store = SQLiteSessionStore(tmp_path / "db")
    try:
        await store.create("s")
        await store.commit("s", [msg("a"), msg("b")])
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "db") as conn:
        rows = conn.execute("SELECT body, hash FROM perdure_messages ORDER BY key").fetchall()
    conn.close()
    prev = ZERO_HASH
    for body, stored in rows:
        assert stored == chain_hash(prev, body) == chain_hash(prev, body.encode())
        prev = stored


# ---------------------------------------------------------------- retention


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.5, "3"])
def test_max_checkpoints_is_none_or_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_checkpoints must be None or an int >= 1"):
        check_max_checkpoints(bad)
    for store in (
        lambda: MemoryCheckpointStore(max_checkpoints=bad),
        lambda: FileCheckpointStore("unused", max_checkpoints=bad),
        lambda: StorageCheckpointStore(MemoryStorage(), max_checkpoints=bad),
        lambda: MemorySessionStore(max_checkpoints=bad),
        lambda: FileSessionStore("unused", max_checkpoints=bad),
        lambda: SQLiteSessionStore("unused.db", max_checkpoints=bad),
    ):
        with pytest.raises(ValueError, match="max_checkpoints must be None or an int >= 1"):
            store()
    assert check_max_checkpoints(None) is None
    assert check_max_checkpoints(3) == 3


@given(
    ids=st.lists(
        st.text("0123456789ABCDEFGHJKMNPQRSTVWXYZ", min_size=26, max_size=26), unique=True
    ),
    keep=st.none() | st.integers(1, 8),
)
def test_retention_evicts_the_oldest_past_the_limit(ids: list[str], keep: int | None) -> None:
    evicted = evicted_checkpoints(ids, keep)
    if keep is None:
        assert evicted == []
        return
    kept = sorted(set(ids) - set(evicted))
    assert len(kept) == min(keep, len(ids))
    assert all(old < new for old in evicted for new in kept)


@pytest.mark.parametrize("bad", [0, -1, -0.5, True, False, "60", float("nan"), float("inf"), [1]])
def test_max_checkpoint_age_is_none_or_positive_seconds(bad: Any) -> None:
    message = "max_checkpoint_age must be None or a number of seconds > 0"
    with pytest.raises(ValueError, match=message):
        check_max_checkpoint_age(bad)
    makers: list[Any] = [
        lambda: MemoryCheckpointStore(max_checkpoint_age=bad),
        lambda: FileCheckpointStore("unused", max_checkpoint_age=bad),
        lambda: StorageCheckpointStore(MemoryStorage(), max_checkpoint_age=bad),
        lambda: MemorySessionStore(max_checkpoint_age=bad),
        lambda: FileSessionStore("unused", max_checkpoint_age=bad),
        lambda: SQLiteSessionStore("unused.db", max_checkpoint_age=bad),
    ]
    with contextlib.suppress(ImportError):  # constructors do no I/O: no server needed
        from perdure.stores.postgres import PostgresCheckpointStore, PostgresSessionStore

        makers.append(lambda: PostgresSessionStore("postgresql://x/y", max_checkpoint_age=bad))
        makers.append(lambda: PostgresCheckpointStore("postgresql://x/y", max_checkpoint_age=bad))
    with contextlib.suppress(ImportError):
        from perdure.stores.redis import RedisSessionStore

        makers.append(lambda: RedisSessionStore("redis://x:1/0", max_checkpoint_age=bad))
    for make in makers:
        with pytest.raises(ValueError, match=message):
            make()
    assert check_max_checkpoint_age(None) is None
    assert check_max_checkpoint_age(90) == 90.0
    assert check_max_checkpoint_age(0.25) == 0.25


NOW_MS = 1_750_000_000_000


def test_age_retention_evicts_ids_made_before_the_cutoff() -> None:
    hour = 3_600_000
    made = [encode_ulid(NOW_MS - ms, 7) for ms in (3 * hour, hour + 1, hour, hour - 1, 0)]
    assert evicted_checkpoints(made, None, 3600, now_ms=NOW_MS) == made[:2]  # age > 1 h
    cutoff = checkpoint_age_cutoff(3600, NOW_MS)
    assert cutoff == encode_ulid(NOW_MS - hour, 0)
    assert [cid < cutoff for cid in made] == [True, True, False, False, False]
    assert checkpoint_age_cutoff(None, NOW_MS) is None
    assert checkpoint_age_cutoff(10**10, NOW_MS) == encode_ulid(0, 0)  # before 1970: nothing
    # With a count as well: the aged go first, then the oldest past the count.
    assert evicted_checkpoints(made, 2, 3600, now_ms=NOW_MS) == made[:3]
    assert evicted_checkpoints(made, 4, 3600, now_ms=NOW_MS) == made[:2]
    # An id that is no ULID has no age: only the count evicts it.
    odd = ["0-damaged", *made]  # sorts first
    assert evicted_checkpoints(odd, None, 3600, now_ms=NOW_MS) == made[:2]
    assert evicted_checkpoints(odd, 1, 3600, now_ms=NOW_MS) == ["0-damaged", *made[:4]]
    # The clock is the default now.
    assert evicted_checkpoints([encode_ulid(NOW_MS, 1)], None, 1) == [encode_ulid(NOW_MS, 1)]


@given(
    ages=st.lists(st.integers(0, 10 * 3_600_000), unique=True),
    keep=st.none() | st.integers(1, 8),
    limit=st.none() | st.integers(1, 10 * 3600),
)
def test_retention_keeps_the_newest_young_enough(
    ages: list[int], keep: int | None, limit: int | None
) -> None:
    made = [encode_ulid(NOW_MS - age, 3) for age in ages]
    evicted = evicted_checkpoints(made, keep, limit, now_ms=NOW_MS)
    young = [
        cid for cid, age in zip(made, ages, strict=True) if limit is None or age <= limit * 1000
    ]
    expected_kept = sorted(young)[-keep:] if keep is not None else sorted(young)
    assert sorted(set(made) - set(evicted)) == expected_kept
    assert evicted == sorted(evicted)


# ---------------------------------------------------------------- the stores agree


def model_outcome(
    stored: list[Any], redacted: dict[int, Any], tail_ok: bool | None, commit: dict[str, Any]
) -> tuple[str, Any]:
    """What the rules say a commit does to a session holding ``stored``/``redacted``."""
    try:
        checked = commit_request(
            "s",
            commit["messages"],
            None,
            commit["rewritten"],
            None if tail_ok is None else ("T" if tail_ok else "stale"),
            commit["redactions"],
        )
        plan = plan_commit(checked, len(stored), "T")
        if plan.compare_last:
            last = [
                stored[-1],
                *([redacted[len(stored) - 1]] if len(stored) - 1 in redacted else []),
            ]
            check_extends("s", checked.messages, len(stored), last)
    except (ValueError, TypeError, SessionConflictError) as exc:
        return type(exc).__name__, str(exc)
    after = (
        dict(checked.redactions) if checked.rewritten else {**redacted, **dict(checked.redactions)}
    )
    # The stored prefix is kept as it is (not compared): only what is new is written.
    history = (
        list(checked.messages)
        if checked.rewritten
        else stored + list(checked.messages[plan.start :])
    )
    view = [after.get(i, m) for i, m in enumerate(history)]
    return "ok", view


commits = st.fixed_dictionaries(
    {
        "shape": st.sampled_from(["extend", "diverge", "shorter", "same"]),
        "new": histories,
        "rewritten": st.booleans(),
        "tail": st.sampled_from([None, True, False]),
        "redactions": st.none()
        | st.dictionaries(
            st.integers(-1, 8) | st.booleans(), st.just(msg("[redacted]")), max_size=2
        ),
    }
)


def commit_of(stored: list[Any], spec: dict[str, Any]) -> dict[str, Any]:
    shape = spec["shape"]
    if shape == "extend":
        messages = stored + spec["new"]
    elif shape == "diverge":
        messages = [*stored[:-1], msg("other"), *spec["new"]]
    elif shape == "shorter":
        messages = stored[: max(0, len(stored) - 1)]
    else:
        messages = list(stored)
    return {
        "messages": messages,
        "rewritten": spec["rewritten"],
        "redactions": spec["redactions"],
        "tail": spec["tail"],
    }


async def store_outcome(
    store: SessionStore, first: list[Any], first_redactions: dict[int, Any], commit: dict[str, Any]
) -> tuple[str, Any]:
    await store.create("s")
    result = await store.commit("s", first, redactions=first_redactions or None)
    tail = {None: None, True: result.tail, False: "stale-tail"}[commit["tail"]]
    try:
        await store.commit(
            "s",
            commit["messages"],
            rewritten=commit["rewritten"],
            expected_tail=tail,
            redactions=commit["redactions"],
        )
    except (ValueError, TypeError, SessionConflictError) as exc:
        outcome: tuple[str, Any] = (type(exc).__name__, str(exc))
    else:
        outcome = ("ok", (await store.get("s")).messages)
    if outcome[0] != "ok":  # a refused commit wrote nothing
        view = [first_redactions.get(i, m) for i, m in enumerate(first)]
        assert (await store.get("s")).messages == view
    return outcome


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored=histories, redact_last=st.booleans(), spec=commits)
def test_memory_file_and_sqlite_do_what_the_rules_say(
    stored: list[Any], redact_last: bool, spec: dict[str, Any]
) -> None:
    first_redactions = {len(stored) - 1: msg("[redacted]")} if redact_last and stored else {}
    commit = commit_of(stored, spec)
    expected = model_outcome(stored, first_redactions, commit["tail"], commit)

    async def run(root: Path) -> None:
        for kind in KINDS:
            store = make(kind, root / kind)
            try:
                assert await store_outcome(store, stored, first_redactions, commit) == expected, (
                    kind
                )
            finally:
                close(store)

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(run(Path(root)))


# ---------------------------------------------------------------- paging


def tool_pair(i: int) -> list[dict[str, Any]]:
    use = {"toolUse": {"toolUseId": f"t{i}", "name": "f", "input": {}}}
    result = {"toolResult": {"toolUseId": f"t{i}", "status": "success", "content": []}}
    return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]


@given(
    shape=st.lists(st.booleans(), max_size=12),
    offset=st.integers(0, 30),
    limit=st.integers(0, 8),
)
def test_a_page_cut_from_its_read_window_never_splits_a_tool_pair(
    shape: list[bool], offset: int, limit: int
) -> None:
    history: list[Any] = []
    for i, pair in enumerate(shape):
        history.extend(tool_pair(i) if pair else [msg(f"m{i}")])
    total = len(history)
    lo, hi = page_read_range(total, offset, limit)
    page = page_of(total, offset, limit, lo, history[lo:hi])
    assert page.messages == history[page.offset : page.next_offset]
    assert page.total == total
    assert page.offset <= min(offset, total) <= page.next_offset
    if not limit:  # an empty page is asked for: it is empty where it was asked
        assert (page.offset, page.messages) == (min(offset, total), [])
        return
    assert page.next_offset >= min(offset + limit, total)
    for at in (page.offset, page.next_offset):  # no pair straddles either boundary
        if 0 < at < total:
            assert not (
                "toolUse" in history[at - 1]["content"][0]
                and "toolResult" in history[at]["content"][0]
            )


@pytest.mark.parametrize(
    ("session_id", "offset", "error", "names"),
    [
        ("s", -1, ValueError, "offset"),
        ("s", True, TypeError, "offset"),
        ("", 0, ValueError, "session_id"),
    ],
)
def test_get_arguments_are_checked_alike(
    session_id: str, offset: Any, error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        check_get_args(session_id, offset)
    with pytest.raises(error, match=names):
        asyncio.run(MemorySessionStore().get(session_id, offset=offset))


def test_decode_messages_parses_many_texts_at_once_and_refuses_what_is_not_one_each() -> None:
    """One parse for a whole resume: texts that would join into something else (two
    values in one text, a value split across two) are refused, never miscounted."""
    one = b'{"role":"user","content":[{"text":"a"}]}'
    two = b'{"role":"assistant","content":[{"text":"b"}]}'
    assert rules.decode_messages([one, two]) == [
        {"role": "user", "content": [{"text": "a"}]},
        {"role": "assistant", "content": [{"text": "b"}]},
    ]
    assert rules.decode_messages([]) == []
    assert rules.decode_messages([one + b"," + two]) is None  # two messages in one text
    assert rules.decode_messages([one[:10], one[10:]]) is None  # one split across two
    assert rules.decode_messages([one, b'{"role":"system","content":[]}']) is None
    assert rules.decode_messages([one, b"[1]"]) is None
    assert rules.decode_messages([b"\xff"]) is None
    encoded = b'{"role":"user","content":[{"image":{"format":"png","source":{"bytes":'
    valid = encoded + b'{"__bytes_encoded__":true,"data":"AAE="}}}}]}'
    assert rules.decode_messages([valid, one]) == [
        {"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": b"\0\1"}}}]},
        {"role": "user", "content": [{"text": "a"}]},
    ]
    assert rules.decode_messages([encoded + b'{"__bytes_encoded__":true,"data":"!!"}}}}]}']) is None


# ---------------------------------------------------------------- verify_rows


def _rows(n: int, *, as_bytes: bool, base: int = 0) -> list[tuple[Any, ...]]:
    """Rows as a row store reads them: ``(key, body, hash, redacted, redacted_hash)``."""
    rows, prev = [], ZERO_HASH
    for i in range(n):
        body = json.dumps({"role": "user", "content": [{"text": f"m{i}"}]}, separators=(",", ":"))
        prev = chain_hash(prev, body)
        rows.append((i + base, body.encode() if as_bytes else body, prev, None, None))
    return rows


def _damage(at: int, kind: str, detail: str) -> Exception:
    return ValueError((at, kind))


def _finding(rows: list[tuple[Any, ...]], end: int, head: str | None) -> tuple[int, str]:
    with pytest.raises(ValueError) as info:
        rules.verify_rows(rows, 0, ZERO_HASH, end, head, _damage)
    return info.value.args[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_verify_rows_returns_the_messages_of_sound_rows_and_their_redactions(
    as_bytes: bool,
) -> None:
    rows = _rows(5, as_bytes=as_bytes, base=7)
    replacement = '{"role":"user","content":[{"text":"[redacted]"}]}'
    text = replacement.encode() if as_bytes else replacement
    rows[2] = (*rows[2][:3], text, chain_hash(rows[2][2], text))
    got = rules.verify_rows(rows, 0, ZERO_HASH, 5, rows[-1][2], _damage, base=7)
    assert [m["content"][0]["text"] for m in got] == ["m0", "m1", "[redacted]", "m3", "m4"]
    tail = rules.verify_rows(iter(rows[3:]), 3, rows[2][2], 5, rows[-1][2], _damage, base=7)
    assert [m["content"][0]["text"] for m in tail] == ["m3", "m4"]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_verify_rows_names_each_kind_of_damage_and_its_row(as_bytes: bool) -> None:
    """Sound rows take a fast pass; every damage still gets the slow pass's name."""

    def edited(i: int, **change: Any) -> list[tuple[Any, ...]]:
        rows = _rows(5, as_bytes=as_bytes)
        key, body, stored, redacted, redacted_hash = rows[i]
        row = {"key": key, "body": body, "stored": stored, "redacted": redacted}
        row.update(change)
        rows[i] = (row["key"], row["body"], row["stored"], row["redacted"], redacted_hash)
        return rows

    good = _rows(5, as_bytes=as_bytes)
    head = good[-1][2]
    body2 = good[2][1]
    other = body2.replace(b"m2", b"M2") if as_bytes else body2.replace("m2", "M2")
    assert _finding(edited(2, body=other), 5, head) == (2, "bad_hash")
    assert _finding(edited(3, stored="0" * 32), 5, head) == (3, "bad_hash")
    assert _finding(good[:2] + good[3:], 5, head) == (2, "bad_sequence")
    assert _finding(good[:4], 5, head) == (4, "bad_sequence")
    assert _finding(good, 4, None) == (4, "bad_sequence")
    assert _finding(good, 5, "f" * 32) == (4, "broken_chain")
    assert _finding(edited(1, key=9), 5, head) == (1, "bad_sequence")
    assert _finding(edited(1, body=None), 5, head) == (1, "bad_payload")
    assert _finding(edited(4, redacted=body2), 5, head) == (4, "bad_hash")
    # A body whose hash holds but that is no message: named after the chain checks.
    nothing = b"[1]" if as_bytes else "[1]"
    rows = [*good[:3], (3, nothing, chain_hash(good[2][2], nothing), None, None)]
    assert _finding(rows, 4, rows[-1][2]) == (3, "bad_payload")


def test_a_long_parse_pauses_the_collector_and_leaves_it_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    seen: list[bool] = []
    loads = json.loads

    def spying(text: Any) -> Any:
        seen.append(gc.isenabled())
        return loads(text)

    monkeypatch.setattr(rules.json, "loads", spying)
    one = b'{"role":"user","content":[{"text":"x"}]}'
    assert gc.isenabled()
    assert len(rules.decode_messages([one] * 1000)) == 1000
    assert rules.decode_messages([one] * 3) is not None
    assert seen == [False, True]
    assert gc.isenabled()
    gc.disable()
    try:
        assert rules.decode_messages([one] * 1000) is not None
        assert not gc.isenabled()  # not this call's to resume
    finally:
        gc.enable()
    assert rules.decode_messages([one] * 999 + [b"[1"]) is None
    assert gc.isenabled()


def test_a_history_past_an_offset_never_reads_as_a_shorter_one() -> None:
    # What a commit hands a store when the start of the history is only in the store:
    # the store reads past its stored count; anything before raises, never empties.
    new: list[Any] = [msg(f"m{i}") for i in range(2)]
    history = PastOffset(3, new, "were trimmed")
    assert len(history) == 5
    assert history[3] == new[0]
    assert history[-1] == new[1]
    assert list(history[3:]) == new
    assert list(history[4:5]) == [new[1]]
    with pytest.raises(IndexError, match="before index 3: those were trimmed"):
        history[2]
    with pytest.raises(IndexError, match="messages before index 3 were trimmed"):
        history[1:]
    with pytest.raises(IndexError, match="messages before index 3 were trimmed"):
        list(history)  # a plain iteration would otherwise stop at once, silently
    with pytest.raises(IndexError, match="past the end"):
        history[5]
    assert list(PastOffset(0, new)) == new


# ---------------------------------------------------------------- RowChunks


def _split(rows: list[tuple[Any, ...]], size: int) -> list[list[tuple[Any, ...]]]:
    return [rows[at : at + size] for at in range(0, len(rows), size)] or [[]]


def _outcome(read: Any, *args: Any) -> Any:
    """What ``read(*args)`` gives: its messages, or the finding it raised."""
    try:
        return read(*args)
    except ValueError as exc:
        return exc.args[0]


def _chunked(chunks: list[list[tuple[Any, ...]]], end: int, head: str | None) -> Any:
    reader = rules.RowChunks(0, ZERO_HASH)
    for chunk in chunks:
        reader.add(chunk)  # never raises: a finding comes out of finish()
    return reader.finish(end, head, _damage)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_rows_checked_as_chunks_arrive_read_as_rows_read_at_once(as_bytes: bool) -> None:
    """Every edit, cut into chunks of every size: the same messages or the same finding
    (row and kind) as :func:`verify_rows` over the rows at once."""
    good = _rows(7, as_bytes=as_bytes)
    head = good[-1][2]
    body = good[3][1]
    other = body.replace(b"m3", b"M3") if as_bytes else body.replace("m3", "M3")
    nothing = b"[1]" if as_bytes else "[1]"
    cases = [
        (good, 7, head),
        (good, 7, None),
        ([*good[:3], (3, other, good[3][2], None, None), *good[4:]], 7, head),  # body
        ([*good[:5], (5, good[5][1], "0" * 32, None, None), good[6]], 7, head),  # hash
        (good[:2] + good[3:], 7, head),  # a middle row gone
        (good[:6], 7, head),  # the last row gone
        (good, 6, None),  # a row past the end
        (good, 7, "f" * 32),  # the head
        ([*good[:6], (6, nothing, chain_hash(good[5][2], nothing), None, None)], 7, None),
        ([*good[:4], (4, good[4][1], good[4][2], body, "b" * 32), *good[5:]], 7, head),
    ]
    for rows, end, head_hash in cases:
        whole = _outcome(rules.verify_rows, list(rows), 0, ZERO_HASH, end, head_hash, _damage)
        for size in (1, 2, 3, len(rows) or 1):
            chunks = _split(rows, size)
            assert _outcome(_chunked, chunks, end, head_hash) == whole, (rows, size)
            # Chunks out of order (a heap not in index order): sorted, then checked.
            assert _outcome(_chunked, chunks[::-1], end, head_hash) == whole
    messages = _chunked(_split(good, 3), 7, head)
    assert [m["content"][0]["text"] for m in messages] == [f"m{i}" for i in range(7)]


def test_row_chunks_from_an_offset_chain_to_the_row_before() -> None:
    rows = _rows(9, as_bytes=True, base=5)
    reader = rules.RowChunks(4, rows[3][2], base=5)
    for chunk in _split(rows[4:], 2):
        reader.add(chunk)
    got = reader.finish(9, rows[-1][2], _damage)
    assert [m["content"][0]["text"] for m in got] == [f"m{i}" for i in range(4, 9)]
    wrong = rules.RowChunks(4, rows[2][2], base=5)  # chained to the wrong row
    wrong.add(rows[4:])
    assert _outcome(wrong.finish, 9, rows[-1][2], _damage) == (4, "bad_hash")


def test_a_sealed_chunk_without_its_key_raises_from_finish_after_the_hashes() -> None:
    from perdure.crypto import AESGCMCipher, seal
    from perdure.errors import DecryptionError

    cipher = AESGCMCipher(keys={"k1": bytes(range(32))}, active="k1")
    rows, prev = [], ZERO_HASH
    for i in range(6):
        body = seal(cipher, json.dumps({"role": "user", "content": [{"text": f"m{i}"}]}))
        prev = chain_hash(prev, body)
        rows.append((i, body, prev, None, None))
    opened = rules.RowChunks(0, ZERO_HASH, cipher=cipher)
    for chunk in _split(rows, 4):
        opened.add(chunk)
    assert [m["content"][0]["text"] for m in opened.finish(6, prev, _damage)] == [
        f"m{i}" for i in range(6)
    ]
    keyless = rules.RowChunks(0, ZERO_HASH)
    for chunk in _split(rows, 4):
        keyless.add(chunk)
    with pytest.raises(DecryptionError):
        keyless.finish(6, prev, _damage)
    damaged = rules.RowChunks(0, ZERO_HASH)  # a broken hash is damage before any key
    for chunk in _split([*rows[:5], (5, rows[5][1], "0" * 32, None, None)], 4):
        damaged.add(chunk)
    assert _outcome(damaged.finish, 6, prev, _damage) == (5, "bad_hash")


# --------------------------------------------------------------- tail tokens


def test_a_tail_token_is_the_write_count_and_64_random_bits() -> None:
    tokens = {rules.new_tail(7) for _ in range(1000)}
    assert len(tokens) == 1000
    assert all(re.fullmatch(r"7-[0-9a-f]{16}", token) for token in tokens)


def test_seeding_pythons_random_does_not_repeat_tail_tokens() -> None:
    # A program (or a test) that seeds random's shared instance must not make two
    # processes draw the same tokens.
    state = random.getstate()
    try:
        random.seed(1)
        first = rules.new_tail(1)
        random.seed(1)
        assert rules.new_tail(1) != first
    finally:
        random.setstate(state)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_draws_other_tail_tokens_than_its_parent() -> None:
    # The child starts with a copy of the parent's generator: without a fresh seed
    # its next token would be the parent's next one.
    read, write = os.pipe()
    pid = fork_child(lambda: os.write(write, rules.new_tail(1).encode()))
    os.close(write)
    assert exit_code(pid) == 0
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    assert re.fullmatch(r"1-[0-9a-f]{16}", child)
    assert rules.new_tail(1) != child
