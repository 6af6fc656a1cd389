"""Docstring parsing: the description and the parameter docs, Google and NumPy style."""

from __future__ import annotations

import pytest

from perdure.tools.docstring import Docstring, parse_docstring


def google_style(query: str, limit: int, *args: int, **kwargs: int) -> None:
    """Search the catalogue.

    Matches titles and authors;
    case does not matter.

    A second paragraph.

    Args:
        query (str): What to look for.
            May span lines.
        limit: How many results
            at most.

            Zero means no limit.
        *args: Extra ids.
        **kwargs (dict[str, int]): Extra filters.

    Returns:
        list: the hits, best first.

    Raises:
        ValueError: query is empty.

    Examples:
        >>> search("x", 3)
    """


def numpy_style(x: float, y: float, scale: int) -> None:
    """Scale a vector.

    Longer text.

    Parameters
    ----------
    x, y : float
        The coordinates.
    scale : int, optional
        The factor,
        applied twice.

    Returns
    -------
    tuple
        scaled: the result.

    Raises
    ------
    ValueError
        never.
    """


def test_google_description_keeps_paragraphs_and_stops_at_first_section() -> None:
    parsed = parse_docstring(google_style.__doc__)
    assert parsed.description == (
        "Search the catalogue.\n\nMatches titles and authors;\ncase does not matter.\n\n"
        "A second paragraph."
    )


def test_google_params_with_and_without_types_and_continuations() -> None:
    assert parse_docstring(google_style.__doc__).params == {
        "query": "What to look for. May span lines.",
        "limit": "How many results at most.\n\nZero means no limit.",
        "args": "Extra ids.",
        "kwargs": "Extra filters.",
    }


def test_google_returns_raises_examples_do_not_leak() -> None:
    parsed = parse_docstring(google_style.__doc__)
    text = parsed.description + " ".join(parsed.params.values())
    for leaked in ("hits", "empty", ">>>", "Returns", "Raises", "Examples"):
        assert leaked not in text
    assert set(parsed.params) == {"query", "limit", "args", "kwargs"}


@pytest.mark.parametrize("header", ["Args:", "Arguments:", "Parameters:", "Keyword Args:"])
def test_google_param_section_names(header: str) -> None:
    doc = f"Do it.\n\n{header}\n    a (int): first.\n    b: second.\n"
    assert parse_docstring(doc) == Docstring("Do it.", {"a": "first.", "b": "second."})


def test_google_type_with_brackets_and_colon_in_text() -> None:
    doc = """Fetch.

    Args:
        mapping (dict(str, int)): the map.
        url (str): see http://example.com: it works.
        flag (bool, optional):
            described on the next line.
    """
    assert parse_docstring(doc).params == {
        "mapping": "the map.",
        "url": "see http://example.com: it works.",
        "flag": "described on the next line.",
    }


def test_google_section_ends_when_text_returns_to_margin() -> None:
    doc = "Do.\n\nArgs:\n    a: first.\nTrailing prose.\n    b: not a parameter.\n"
    assert parse_docstring(doc) == Docstring("Do.", {"a": "first."})
    doc = "Do.\n\nArgs:\n    a: first.\nReturns:\n    b: not a parameter.\n"
    assert parse_docstring(doc) == Docstring("Do.", {"a": "first."})


def test_numpy_description_and_params() -> None:
    parsed = parse_docstring(numpy_style.__doc__)
    assert parsed.description == "Scale a vector.\n\nLonger text."
    assert parsed.params == {
        "x": "The coordinates.",
        "y": "The coordinates.",
        "scale": "The factor, applied twice.",
    }


def test_numpy_returns_and_raises_do_not_leak() -> None:
    parsed = parse_docstring(numpy_style.__doc__)
    assert "scaled" not in parsed.params
    assert "never" not in " ".join(parsed.params.values())
    assert "Returns" not in parsed.description
    assert "-----" not in parsed.description


def test_numpy_section_without_parameters_gives_no_params() -> None:
    doc = "Compute.\n\nReturns\n-------\nint\n    the answer.\n"
    assert parse_docstring(doc) == Docstring("Compute.", {})


@pytest.mark.parametrize("doc", [None, "", "   \n  "])
def test_empty_docstring(doc: str | None) -> None:
    assert parse_docstring(doc) == Docstring("", {})


def test_description_only() -> None:
    assert parse_docstring("  Just this.\n\n  And this.  \n") == Docstring(
        "Just this.\n\nAnd this.", {}
    )


def test_a_word_ending_in_colon_is_not_a_section() -> None:
    doc = "Compare these:\n\n    a and b\n\nArgs:\n    a: first.\n"
    assert parse_docstring(doc) == Docstring("Compare these:\n\n    a and b", {"a": "first."})


def test_description_before_returns_when_there_are_no_args() -> None:
    doc = "Ping the server.\n\nReturns:\n    pong.\n"
    assert parse_docstring(doc) == Docstring("Ping the server.", {})
