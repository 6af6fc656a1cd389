"""Every CLI test checks the output rules of issue 23 on every command it runs.

``CliRunner.invoke`` is wrapped for the whole of ``tests/cli``: whatever a test runs,
success or error case, its output must hold no Python traceback, the command must
not end in an exception other than ``SystemExit``, and its stdout — never a
terminal under ``CliRunner``, so "piped" — must hold no box-drawing character.
``subprocess.run`` is wrapped too: a ``perdure`` process a test runs (``python -m
perdure …`` or the README's shell blocks) must print no traceback either.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest
from click.testing import CliRunner, Result

from perdure.cli.output import BOX_CHARACTERS

TRACEBACK = "Traceback (most recent call last)"


def check_output_rules(result: Result, args: Sequence[str] = ()) -> None:
    """Fail when ``result`` breaks a rule every command keeps, error cases included.

    Box-drawing is allowed only when the command asked for ``--format table``.
    """
    assert TRACEBACK not in result.output, result.output
    assert TRACEBACK not in result.stderr, result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"the command raised {result.exception!r}") from result.exception
    words = list(args)
    if "--format=table" in words or ("--format", "table") in itertools.pairwise(words):
        return
    boxes = sorted(BOX_CHARACTERS & set(result.stdout))
    assert not boxes, f"box-drawing characters {boxes} in piped output:\n{result.stdout}"


@pytest.fixture(autouse=True)
def output_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    invoke = CliRunner.invoke

    def checked(self: CliRunner, cli: Any, args: Any = None, *rest: Any, **kwargs: Any) -> Result:
        result = invoke(self, cli, args, *rest, **kwargs)
        check_output_rules(result, [args] if isinstance(args, str) else list(args or ()))
        return result

    monkeypatch.setattr(CliRunner, "invoke", checked)

    run = subprocess.run

    def checked_run(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        done = run(*args, **kwargs)
        if "perdure" in str(args[0] if args else kwargs.get("args")):
            for stream in (done.stdout, done.stderr):
                text = stream.decode(errors="replace") if isinstance(stream, bytes) else stream
                assert TRACEBACK not in (text or ""), text
        return done

    monkeypatch.setattr(subprocess, "run", checked_run)
