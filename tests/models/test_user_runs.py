"""Never two user messages in a row to a model, with every model adapter (issue 23).

A model call that fails leaves the user's prompt in the stored history; the next
prompt follows it. The loop merges such a run into one request message — the stored
log keeps both messages as written. Each adapter is driven through a real
:class:`~perdure.Agent` on a file session store, against the local servers that
speak its provider's wire format (tests/models/_servers.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from _servers import (
    FakeServer,
    Sleeps,
    anthropic_error,
    anthropic_stream,
    anthropic_text_block,
    openai_error,
    openai_text_stream,
    require_sdk,
)

from perdure import Agent
from perdure.agent.conversation.pairing import merge_user_runs
from perdure.errors import ModelError
from perdure.models import Model, ScriptedModel
from perdure.session import FileSessionStore, Session
from perdure.types import Message


def user(*texts: str) -> Message:
    return {"role": "user", "content": [{"text": t} for t in texts]}


def test_merge_user_runs_is_pure_and_puts_tool_results_first() -> None:
    result = {"toolResult": {"toolUseId": "t1", "status": "success", "content": []}}
    history: list[Message] = [
        user("a"),
        user("b"),
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}],
        },
        {"role": "user", "content": [result]},
        user("c"),
        user("d"),
        {"role": "assistant", "content": [{"text": "ok"}]},
        user("e"),
    ]
    before = [dict(m, content=list(m["content"])) for m in history]
    sent = merge_user_runs(history)
    assert sent == [
        user("a", "b"),
        history[2],
        {"role": "user", "content": [result, {"text": "c"}, {"text": "d"}]},
        history[6],
        history[7],
    ]
    assert history == before  # nothing stored is changed
    assert sent[1] is history[2]
    assert sent[4] is history[7]
    # A text before a later tool result still leaves the result first.
    assert merge_user_runs([user("x"), {"role": "user", "content": [result]}]) == [
        {"role": "user", "content": [result, {"text": "x"}]}
    ]
    assert merge_user_runs([]) == []


@pytest.fixture
def server() -> AsyncIterator[FakeServer]:
    with FakeServer() as srv:
        yield srv  # type: ignore[misc]


async def openai_model(server: FakeServer) -> tuple[Model, Callable[[], list[Any]]]:
    require_sdk("openai")
    from perdure.models.openai import OpenAIModel

    server.add(openai_error(400, "invalid request"), openai_text_stream("hello"))
    model = OpenAIModel("gpt-test", api_key="sk-test", base_url=server.url + "/v1", sleep=Sleeps())

    def sent() -> list[Any]:
        return [m for m in server.bodies[-1]["messages"] if m["role"] != "system"]

    return model, sent


async def anthropic_model(server: FakeServer) -> tuple[Model, Callable[[], list[Any]]]:
    require_sdk("anthropic")
    from perdure.models.anthropic import AnthropicModel

    server.add(
        anthropic_error(400, "invalid_request_error", "invalid request"),
        anthropic_stream(anthropic_text_block(0, "hello")),
    )
    model = AnthropicModel(
        "claude-test", max_tokens=64, api_key="sk-ant-test", base_url=server.url, sleep=Sleeps()
    )

    def sent() -> list[Any]:
        return list(server.bodies[-1]["messages"])

    return model, sent


async def scripted_model(server: FakeServer) -> tuple[Model, Callable[[], list[Any]]]:
    model = ScriptedModel([ModelError("the model failed"), "hello"])
    return model, lambda: model.requests[-1]["messages"]


def texts(message: Any) -> list[str]:
    """The texts of a request message, in whichever wire format it is."""
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [part["text"] for part in content if "text" in part]


@pytest.mark.parametrize("make", [scripted_model, openai_model, anthropic_model])
async def test_a_prompt_after_a_failed_call_is_sent_as_one_user_message(
    make: Callable[[FakeServer], Any], server: FakeServer, tmp_path: Path
) -> None:
    model, sent = await make(server)
    store = FileSessionStore(tmp_path / "store")
    agent = Agent(model=model, session_manager=Session(store, "s1"))
    with pytest.raises(ModelError):
        await agent.invoke_async("first question")
    result = await agent.invoke_async("second question")
    assert str(result) == "hello"

    request = sent()
    assert [m["role"] for m in request] == ["user"], request
    assert texts(request[0]) == ["first question", "second question"]
    # The stored log stays as written: two user messages, then the answer.
    stored = (await store.get("s1")).messages
    assert [m["role"] for m in stored] == ["user", "user", "assistant"]
    assert [m["content"] for m in stored[:2]] == [
        [{"text": "first question"}],
        [{"text": "second question"}],
    ]
    aclose = getattr(model, "aclose", None)
    if aclose is not None:
        await aclose()
