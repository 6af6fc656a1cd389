"""The pure rules every memory store shares (perdure.memory.rules)."""

from __future__ import annotations

import pytest

from perdure.errors import MemoryStoreError
from perdure.memory.rules import (
    RRF_K,
    check_embedder,
    check_metadata,
    check_namespace,
    content_key,
    fuse_rankings,
    memory_entry,
    message_items,
    query_terms,
    storable,
)


def test_query_terms_drop_stop_words_unless_nothing_else_is_left() -> None:
    assert query_terms("What is the user's favourite colour?") == [
        "user",
        "s",
        "favourite",
        "colour",
    ]
    assert query_terms("the THE it") == ["the", "it"]
    assert query_terms("snake_case x²") == ["snake", "case", "x²"]
    assert len(query_terms(" ".join(f"w{i}" for i in range(50)))) == 32


def test_the_same_memory_ignores_case_and_whitespace() -> None:
    assert content_key("Dark  mode\n") == content_key("dark mode")
    assert content_key("dark mode") != content_key("dark modes")


def test_storable_text_loses_only_what_cannot_be_stored() -> None:
    assert storable("fine é") == "fine é"
    assert storable("a\udc80b") == "a\ufffdb"
    assert storable("a\x00b") == "a\x00b"
    assert storable("a\x00b\udc80", nul=True) == "a\ufffdb\ufffd"


def test_message_items_keep_text_and_role() -> None:
    items = message_items(
        [
            {"role": "user", "content": [{"text": " hi "}, {"text": "there\x00"}]},
            {"role": "assistant", "content": [{"toolUse": {"name": "x"}}]},  # type: ignore[typeddict-item]
        ],
        {"source": "chat"},
        nul=True,
    )
    assert items == [("hi\nthere\ufffd", {"source": "chat", "role": "user"})]
    with pytest.raises(TypeError, match="messages"):
        message_items("hi", None)  # type: ignore[arg-type]


def test_arguments_are_refused_by_name() -> None:
    for bad in ("", "a\x00b", "a\udc80"):
        with pytest.raises(ValueError, match="namespace"):
            check_namespace(bad)
    with pytest.raises(TypeError, match="namespace"):
        check_namespace(3)
    with pytest.raises(ValueError, match="reserved"):
        check_metadata({"memory_id": 1})
    with pytest.raises(ValueError, match="JSON"):
        check_metadata({"x": object()})
    with pytest.raises(TypeError, match="embedder"):
        check_embedder(object())


def test_fusion_adds_reciprocal_ranks_and_breaks_ties_by_age() -> None:
    fused = fuse_rankings([3, 1], [1, 7])
    assert [memory_id for memory_id, _ in fused] == [1, 3, 7]
    assert fused[0][1] == pytest.approx(1 / (RRF_K + 2) + 1 / (RRF_K + 1))
    assert fuse_rankings([5], [4]) == [(4, 1 / (RRF_K + 1)), (5, 1 / (RRF_K + 1))]


def test_an_entry_fills_in_its_id_and_time_and_damage_is_typed() -> None:
    entry = memory_entry(7, "text", '{"a": 1}', 12.5, store_name="pg", score=0.5)
    assert entry.metadata == {"a": 1, "memory_id": 7, "created_at": 12.5}
    assert (entry.store_name, entry.score) == ("pg", 0.5)
    for damaged in ("[1]", "{", b"{}"):
        with pytest.raises(MemoryStoreError) as info:
            memory_entry(7, "text", damaged, 0.0, store_name="pg", score=None)  # type: ignore[arg-type]
        assert info.value.details["fault"] == "damage"
