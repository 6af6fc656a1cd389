"""Every CLI test checks the output rules of issue 23 on every command it runs.

``CliRunner.invoke`` is wrapped for the whole of ``tests/cli``: whatever a test runs,
success or error case, its output must hold no Python traceback, the command must
not end in an exception other than ``SystemExit``, and its stdout — never a
terminal under ``CliRunner``, so "piped" — must hold no box-drawing character.
"""

from __future__ import annotations

import itertools
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
