"""Bad constructor arguments are refused at once, by name (SPEC §11), not deep inside."""

from __future__ import annotations

from typing import Any

import pytest

from perdure import SummarizingConversationManager
from perdure.models import ScriptedModel
from perdure.session import FileCheckpointStore, FileSessionStore


@pytest.mark.parametrize("bad", [5, None, b"/tmp/x", 1.5])
@pytest.mark.parametrize("store", [FileCheckpointStore, FileSessionStore])
def test_a_store_directory_that_is_no_path_is_named(store: Any, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"dir must be a str or os\.PathLike path, got"):
        store(bad)


@pytest.mark.parametrize("bad", [5, 2.5, object()])
def test_scripted_responses_that_are_no_list_are_named(bad: Any) -> None:
    with pytest.raises(TypeError, match="responses must be a list of responses, got"):
        ScriptedModel(bad)


@pytest.mark.parametrize(
    ("argument", "value", "error"),
    [
        ("summary_ratio", "0.3", TypeError),
        ("summary_ratio", True, TypeError),
        ("summary_ratio", 0, ValueError),
        ("summary_ratio", 1.5, ValueError),
        ("preserve_recent_messages", "3", TypeError),
        ("preserve_recent_messages", 2.5, TypeError),
        ("preserve_recent_messages", True, TypeError),
        ("preserve_recent_messages", -1, ValueError),
        ("context_threshold_tokens", "100", TypeError),
        ("context_threshold_tokens", 10.0, TypeError),
        ("context_threshold_tokens", 0, ValueError),
    ],
)
def test_a_summarizing_managers_bad_settings_are_named(
    argument: str, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match=argument):
        SummarizingConversationManager(**{argument: value})


def test_good_settings_still_pass() -> None:
    manager = SummarizingConversationManager(
        summary_ratio=1, preserve_recent_messages=0, context_threshold_tokens=1
    )
    assert (manager.summary_ratio, manager.preserve_recent_messages) == (1, 0)
    assert ScriptedModel(iter(["a", "b"])).calls == 0
