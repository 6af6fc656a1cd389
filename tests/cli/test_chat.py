"""``perdure chat``: the scripted model, an OpenAI-compatible fake server, sessions."""

from __future__ import annotations

import datetime
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import assert_model_valid
from models._servers import FakeServer, openai_error, openai_text_stream, openai_tool_stream
from perdure.agent import Agent
from perdure.cli.chat import current_time, run_chat
from perdure.cli.main import cli
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session


def run(argv: list[str], stdin: str) -> tuple[int, str, str]:
    """Run ``perdure ARGV`` through the click entry point with ``stdin`` as input."""
    result = CliRunner().invoke(cli, argv, input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    with FakeServer() as srv:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-chat")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.url + "/v1")
        yield srv


def test_scripted_chat_streams_shows_the_tool_call_and_stops_at_exit() -> None:
    status, out, err = run(
        ["chat", "--model", "scripted"], "hello there\n\nsecond line\n/exit\nnever read\n"
    )
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "Let me check the clock."
    assert lines[1] == "  ⚙ current_time()"
    assert lines[2].startswith("  ↳ 20")
    assert lines[3].startswith("The clock says 20")
    assert lines[4] == "You said: second line"
    assert "never read" not in out
    assert "\x1b[" not in out  # not a terminal: no colour


def test_the_chat_runs_as_a_real_process_on_a_pipe() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "chat", "--model", "scripted", "--color"],
        input="hi\nthere\n",
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": ""},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[36m  ⚙ current_time()\x1b[0m" in proc.stdout
    assert "You said: there" in proc.stdout


def test_chat_against_an_openai_compatible_server(server: FakeServer) -> None:
    server.add(
        openai_tool_stream(("call_t", "current_time", ["{}"]), text="Checking."),
        openai_text_stream("It is ", "late."),
        openai_text_stream("Bye!"),
    )
    status, out, err = run(
        ["chat", "--model", "openai:gpt-4o-mini", "--system", "Be brief."],
        "what time is it?\nthanks\n",
    )
    assert status == 0, err
    assert out.splitlines()[:2] == ["Checking.", "  ⚙ current_time()"]
    assert "It is late.\nBye!\n" in out
    bodies = server.bodies
    assert [b["model"] for b in bodies] == ["gpt-4o-mini"] * 3
    assert bodies[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what time is it?"},
    ]
    assert bodies[0]["tools"][0]["function"]["name"] == "current_time"
    tool_message = bodies[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_t"
    assert tool_message["content"].startswith("20")
    assert bodies[2]["messages"][-1] == {"role": "user", "content": "thanks"}


def test_a_failed_turn_is_reported_and_the_chat_goes_on(server: FakeServer) -> None:
    server.add(
        openai_tool_stream(("call_t", "current_time", [""])),
        openai_error(401, "Incorrect API key provided", code="invalid_api_key"),
        openai_text_stream("recovered"),
    )
    status, out, err = run(["chat", "--model", "openai:m"], "first\nsecond\n")
    assert status == 1
    assert err == (
        "error [model_authentication]: openai HTTP 401 (invalid_request_error / "
        "invalid_api_key): Incorrect API key provided\n"
    )
    assert out.endswith("recovered\n")
    roles = [[m["role"] for m in b["messages"]] for b in server.bodies]
    assert roles[2] == ["user", "assistant", "tool", "user"]  # the history stayed valid


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpt-4o", "malformed"),
        ("mistral:large", "unknown provider 'mistral'"),
        ("openai:", "no model name"),
    ],
)
def test_a_bad_model_spec_exits_2(spec: str, message: str) -> None:
    status, out, err = run(["chat", "--model", spec], "hi\n")
    assert status == 2
    assert message in err
    assert out == ""


def test_a_missing_key_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    status, _, err = run(["chat", "--model", "openai:gpt-4o-mini"], "hi\n")
    assert status == 2
    assert "OPENAI_API_KEY" in err


def test_a_session_is_resumed_from_the_store_and_keeps_what_is_added(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    earlier = Agent(
        model=ScriptedModel(["before"]), session_manager=Session(FileSessionStore(store_dir), "s-1")
    )
    earlier("earlier")
    store = f"file:{store_dir}"

    status, out, _ = run(
        ["chat", "--model", "scripted", "--session", "s-1", "--store", store], "hi\n"
    )
    assert status == 0
    assert out.startswith("(resumed a conversation of 2 messages)\n")
    # the scripted model answers from where the restored conversation is: an echo
    assert "You said: hi" in out
    messages = Agent(
        model=ScriptedModel([]), session_manager=Session(FileSessionStore(store_dir), "s-1")
    ).messages
    assert [m["role"] for m in messages[2:]] == ["user", "assistant"]
    # without --session, no session manager: the store is not touched
    status, out, _ = run(["chat", "--model", "scripted", "--store", store], "hi\n")
    assert status == 0
    assert "resumed" not in out
    assert sorted(p.name for p in (store_dir / "sessions").iterdir()) == ["s-1"]


def test_a_session_that_cannot_be_opened_is_one_error_line(tmp_path: Path) -> None:
    status, out, err = run(
        ["chat", "--model", "scripted", "--session", "s1", "--store", "nope:x"], "hi\n"
    )
    assert (status, out) == (2, "")
    assert err.startswith("error: --store: unknown store scheme 'nope'")
    assert err.count("\n") == 1
    status, _, err = run(
        ["chat", "--model", "scripted", "--session", "a/b", "--store", f"file:{tmp_path}"], "hi\n"
    )
    assert status == 2
    assert "session_id" in err


def test_run_chat_takes_any_model_and_shows_errors_and_stops() -> None:
    model = ScriptedModel(
        [
            {
                "role": "assistant",
                "content": [
                    {"toolUse": {"toolUseId": "t", "name": "nope", "input": {"q": "x" * 300}}}
                ],
            },
            "done",
        ]
    )
    out, err = io.StringIO(), io.StringIO()
    status = run_chat(model, stdin=io.StringIO("go\n"), stdout=out, stderr=err)
    assert status == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith('  ⚙ nope({"q": "xxx')
    assert lines[0].endswith("…)")
    assert lines[1].startswith("  ✗ ")
    assert lines[2] == "done"


def test_current_time_is_an_iso_timestamp() -> None:
    agent = Agent(model=ScriptedModel([]), tools=[current_time])
    assert agent.tool_names == ["current_time"]
    assert current_time.tool_spec["inputSchema"]["json"]["properties"] == {}
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    stamp = current_time()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp), stamp  # UTC with Z
    assert datetime.datetime.fromisoformat(stamp) >= before


def test_a_max_tokens_stop_is_shown() -> None:
    from perdure.models import ModelResponse

    model = ScriptedModel(
        [ModelResponse({"role": "assistant", "content": [{"text": "cut"}]}, "max_tokens")]
    )
    out = io.StringIO()
    run_chat(model, stdin=io.StringIO("go\n"), stdout=out, stderr=io.StringIO())
    assert out.getvalue() == "cut\n[stopped: max_tokens]\n"


def test_scripted_histories_stay_model_valid() -> None:
    out = io.StringIO()
    model = ScriptedModel(["a", "b"])
    run_chat(model, stdin=io.StringIO("1\n2\n"), stdout=out, stderr=io.StringIO())
    assert out.getvalue() == "a\nb\n"
    assert_model_valid(model.requests[-1]["messages"])
