"""@tool: the spec it builds, the forms it takes, and the misuse it refuses."""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal

import pytest

from perdure.tools import AgentTool, DecoratedTool, ToolContext, tool


def lookup(city: str, days: int = 3, units: Literal["metric", "imperial"] = "metric") -> str:
    """Get the weather forecast.

    Uses the public feed.

    Args:
        city: The city name.
        days: How many days
            ahead.

    Returns:
        The forecast text.
    """
    return f"{city}:{days}:{units}"


def test_spec_from_signature_and_docstring() -> None:
    decorated = tool(lookup)
    assert decorated.tool_spec == {
        "name": "lookup",
        "description": "Get the weather forecast.\n\nUses the public feed.",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name."},
                    "days": {
                        "type": "integer",
                        "description": "How many days ahead.",
                        "default": 3,
                    },
                    "units": {
                        "type": "string",
                        "enum": ["metric", "imperial"],
                        "default": "metric",
                    },
                },
                "required": ["city"],
                "additionalProperties": False,
            }
        },
    }
    assert decorated.tool_name == "lookup"


def test_three_decorator_forms() -> None:
    @tool
    def a(x: int) -> int:
        """A."""
        return x

    @tool()
    def b(x: int) -> int:
        """B."""
        return x

    @tool(name="renamed", description="Custom text.")
    def c(x: int) -> int:
        """Ignored."""
        return x

    assert isinstance(a, DecoratedTool)
    assert isinstance(b, DecoratedTool)
    assert (a.tool_name, a.tool_spec["description"]) == ("a", "A.")
    assert (b.tool_name, b.tool_spec["description"]) == ("b", "B.")
    assert c.tool_name == "renamed"
    assert c.tool_spec["name"] == "renamed"
    assert c.tool_spec["description"] == "Custom text."


def test_no_docstring_means_the_name_is_the_description() -> None:
    @tool
    def ping() -> str:
        return "pong"

    assert ping.tool_spec["description"] == "ping"
    assert ping.tool_spec["inputSchema"]["json"] == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_annotated_description_beats_docstring() -> None:
    @tool
    def f(a: Annotated[int, "from the hint"], b: Annotated[int, "only hint"]) -> None:
        """F.

        Args:
            a: from the docstring.
        """

    props = f.tool_spec["inputSchema"]["json"]["properties"]
    assert props["a"]["description"] == "from the hint"
    assert props["b"]["description"] == "only hint"


def test_parameters_without_docs_have_no_description() -> None:
    @tool
    def f(a: int, b: Any = None) -> None:
        """F."""

    props = f.tool_spec["inputSchema"]["json"]["properties"]
    assert props == {"a": {"type": "integer"}, "b": {"default": None}}


def test_keyword_only_parameters_are_fine() -> None:
    @tool
    def f(*, a: int, b: str = "x") -> None:
        """F."""

    schema = f.tool_spec["inputSchema"]["json"]
    assert list(schema["properties"]) == ["a", "b"]
    assert schema["required"] == ["a"]


def test_context_parameters_are_left_out_of_the_schema() -> None:
    @tool
    def by_name(query: str, context) -> None:  # type: ignore[no-untyped-def]
        """By name."""

    @tool
    def by_annotation(ctx: ToolContext, query: str) -> None:
        """By annotation."""

    @tool
    def optional_any(query: str, context: ToolContext | None = None, c2: Any = None) -> None:
        """Optional context; a parameter annotated Any but not named context stays."""

    for decorated in (by_name, by_annotation):
        schema = decorated.tool_spec["inputSchema"]["json"]
        assert schema["properties"] == {"query": {"type": "string"}}
        assert schema["required"] == ["query"]
    assert list(optional_any.tool_spec["inputSchema"]["json"]["properties"]) == ["query", "c2"]


def test_context_named_parameter_with_another_type_is_refused() -> None:
    def f(context: str) -> None:
        """F."""

    with pytest.raises(ValueError, match=r"'context'.*reserved for the ToolContext"):
        tool(f)


def test_decorated_function_is_still_callable() -> None:
    decorated = tool(lookup)
    assert decorated("Oslo") == "Oslo:3:metric"
    assert decorated("Oslo", days=1, units="imperial") == "Oslo:1:imperial"
    assert decorated.original_function is lookup
    assert decorated.__name__ == "lookup"
    assert decorated.__doc__ == lookup.__doc__
    assert inspect.signature(decorated) == inspect.signature(lookup)


async def test_decorated_async_function_returns_a_coroutine() -> None:
    @tool
    async def double(x: int) -> int:
        """Double."""
        return x * 2

    pending = double(4)
    assert inspect.iscoroutine(pending)
    assert await pending == 8


def test_decorated_tools_implement_agent_tool() -> None:
    assert isinstance(tool(lookup), AgentTool)


def test_redecorating_describes_the_original() -> None:
    once = tool(lookup)
    twice = tool(name="again")(once)
    assert twice.original_function is lookup
    assert twice.tool_spec["inputSchema"] == once.tool_spec["inputSchema"]
    assert twice.tool_name == "again"


def test_bound_method_and_callable_object() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        def add(self, n: int) -> int:
            """Add n."""
            self.total += n
            return self.total

        def __call__(self, n: int) -> int:
            """Call me."""
            return n + 100

    counter = Counter()
    method_tool = tool(counter.add)
    assert method_tool.tool_name == "add"
    assert method_tool.tool_spec["inputSchema"]["json"]["required"] == ["n"]
    assert method_tool(2) == 2
    assert counter.total == 2
    object_tool = tool(counter)
    assert object_tool.tool_name == "Counter"
    assert object_tool.tool_spec["description"] == "Call me."
    assert object_tool(1) == 101


# --- misuse ---------------------------------------------------------------------------


def _var_args(query: str, *items: int) -> None:
    """V."""


def _var_kwargs(query: str, **options: int) -> None:
    """K."""


def _positional_only(limit: int, /, query: str) -> None:
    """P."""


def _unannotated(query: str, limit) -> None:  # type: ignore[no-untyped-def]
    """U."""


def _bytes_param(query: str, blob: bytes) -> None:
    """B."""


def _nested_bad(query: str, blobs: list[bytes] | None = None) -> None:
    """N."""


def _bad_forward_ref(query: DoesNotExist) -> None:  # type: ignore[name-defined]  # noqa: F821
    """F."""


@pytest.mark.parametrize(
    ("func", "fragments"),
    [
        (_var_args, ["_var_args", "'items'", "*items"]),
        (_var_kwargs, ["_var_kwargs", "'options'", "**options"]),
        (_positional_only, ["_positional_only", "'limit'", "positional-only"]),
        (_unannotated, ["_unannotated", "'limit'", "typing.Any"]),
        (_bytes_param, ["_bytes_param", "'blob'", "bytes"]),
        (_nested_bad, ["_nested_bad", "'blobs'", "bytes"]),
        (_bad_forward_ref, ["_bad_forward_ref", "DoesNotExist"]),
    ],
)
def test_value_errors_name_function_and_parameter(func: Any, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        tool(func)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unannotated_self_suggests_binding_the_method() -> None:
    class Service:
        def run(self, n: int) -> int:
            return n

    with pytest.raises(ValueError, match=r"'self'.*tool\(obj.method\)"):
        tool(Service.run)


@pytest.mark.parametrize("name", ["has space", "", "x" * 65, "dots.not.allowed", "ünï"])
def test_invalid_tool_names(name: str) -> None:
    with pytest.raises(ValueError, match="must match") as info:
        tool(name=name)(lookup)
    assert repr(name) in str(info.value)


def test_lambda_needs_an_explicit_name() -> None:
    with pytest.raises(ValueError, match="'<lambda>'"):
        tool(lambda: None)
    assert tool(name="anon")(lambda: None).tool_name == "anon"


def test_name_of_64_characters_is_fine() -> None:
    assert tool(name="a-b_" + "x" * 60)(lookup).tool_name == "a-b_" + "x" * 60


def test_explicit_description_must_be_non_empty_text() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        tool(description="  ")(lookup)
    with pytest.raises(TypeError, match="description must be a str"):
        tool(description=3)(lookup)  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [5, None, object(), "lookup", [lookup]])
def test_non_callables_are_type_errors(value: Any) -> None:
    with pytest.raises(TypeError, match="needs a callable"):
        DecoratedTool(value)


def test_positional_string_hints_at_name_keyword() -> None:
    with pytest.raises(TypeError, match=r"tool\(name=\.\.\.\)"):
        tool("lookup")  # type: ignore[call-overload]


def test_classes_are_type_errors() -> None:
    class Thing:
        pass

    with pytest.raises(TypeError, match=r"class .*Thing"):
        tool(Thing)


def test_generator_functions_are_refused() -> None:
    def gen(n: int) -> Any:
        """G."""
        yield n

    async def agen(n: int) -> Any:
        """A."""
        yield n

    for func in (gen, agen):
        with pytest.raises(ValueError, match="generator"):
            tool(func)


def test_tool_spec_is_a_copy() -> None:
    decorated = tool(lookup)
    decorated.tool_spec["inputSchema"]["json"]["properties"].clear()
    assert "city" in decorated.tool_spec["inputSchema"]["json"]["properties"]
