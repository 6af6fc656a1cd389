"""``perdure chat``: the scripted model, an OpenAI-compatible fake server, sessions."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import assert_model_valid
from models._servers import FakeServer, openai_error, openai_text_stream, openai_tool_stream
from perdure.agent import Agent
from perdure.cli.chat import add_chat_command, current_time, run_chat
from perdure.hooks import AgentInitializedEvent, HookRegistry, MessageAddedEvent
from perdure.models import ScriptedModel


def parse(argv: list[str], **kwargs: Any) -> argparse.Namespace:
    """Parse ``argv`` with the chat command registered as the CLI registers it."""
    parser = argparse.ArgumentParser(prog="perdure")
    add_chat_command(parser.add_subparsers(dest="command"), **kwargs)
    return parser.parse_args(argv)


def run(argv: list[str], stdin: str, **kwargs: Any) -> tuple[int, str, str]:
    args = parse(argv, **kwargs)
    out, err = io.StringIO(), io.StringIO()
    status = args.handler(args, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


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
    script = textwrap.dedent(
        """
        import argparse, sys
        from perdure.cli.chat import add_chat_command
        parser = argparse.ArgumentParser(prog="perdure")
        add_chat_command(parser.add_subparsers())
        args = parser.parse_args(sys.argv[1:])
        sys.exit(args.handler(args))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "chat", "--model", "scripted", "--color"],
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


class RecordingSession:
    """A stand-in session manager: preloads a history and records what is added."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.added: list[Any] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AgentInitializedEvent, self._restore)
        registry.add_callback(MessageAddedEvent, lambda event: self.added.append(event.message))

    def _restore(self, event: AgentInitializedEvent) -> None:
        event.agent.messages = [
            {"role": "user", "content": [{"text": "earlier"}]},
            {"role": "assistant", "content": [{"text": "before"}]},
        ]


def test_the_session_hook_adds_session_and_passes_the_manager() -> None:
    sessions: list[RecordingSession] = []

    def factory(session_id: str) -> RecordingSession:
        sessions.append(RecordingSession(session_id))
        return sessions[-1]

    status, out, _ = run(
        ["chat", "--model", "scripted", "--session", "s-1"], "hi\n", session_factory=factory
    )
    assert status == 0
    (session,) = sessions
    assert session.session_id == "s-1"
    assert out.startswith("(resumed a conversation of 2 messages)\n")
    # the scripted model answers from where the restored conversation is: an echo
    assert [m["role"] for m in session.added] == ["user", "assistant"]
    assert "You said: hi" in out
    # without --session, no session manager; without a factory, no --session option
    status, _, _ = run(["chat", "--model", "scripted"], "hi\n", session_factory=factory)
    assert len(sessions) == 1
    with pytest.raises(SystemExit):
        parse(["chat", "--model", "scripted", "--session", "x"])


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
