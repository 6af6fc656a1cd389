"""``@tool``: turn a typed Python function into an :class:`~perdure.tools.AgentTool`."""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, get_args, get_origin, overload

from perdure.tools.context import ToolContext
from perdure.tools.docstring import parse_docstring
from perdure.tools.result import to_tool_result
from perdure.tools.schema import from_json, property_schema, validate_input
from perdure.types import ToolResult, ToolSpec, ToolUse

__all__ = ["TOOL_NAME_PATTERN", "DecoratedTool", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What a tool name must match: the rule the model providers share."""

_CONTEXT_PARAMETER = "context"


class DecoratedTool(Generic[P, R]):
    """A function made into a tool by :func:`tool`; still callable like the function.

    Calling it (``my_tool(1, 2)``) calls the original function directly — a sync
    function returns its value, an async one a coroutine. :meth:`invoke` is the
    agent's way in: it validates the model's input against the schema, converts it
    to the declared types, injects the :class:`ToolContext`, and normalises the
    return value with :func:`~perdure.tools.to_tool_result`.

    Attributes:
        original_function: the decorated function, unchanged.
    """

    # Copied from the function by functools.update_wrapper.
    __name__: str
    __qualname__: str
    __wrapped__: Callable[P, R]

    def __init__(
        self,
        func: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        """Build the tool's spec from ``func``'s signature, type hints and docstring.

        Raises:
            TypeError: ``func`` is not callable (or is a class), or ``name`` /
                ``description`` is not a string.
            ValueError: the function cannot be described; see :func:`tool`.
        """
        if isinstance(func, DecoratedTool):  # tool(tool(f)): describe f afresh
            func = func.original_function
        target = _call_target(func)
        self.original_function: Callable[P, R] = func
        # A callable object's instance attributes are its own business, not the tool's.
        updated = functools.WRAPPER_UPDATES if inspect.isroutine(func) else ()
        functools.update_wrapper(self, func, updated=updated)
        default_name = getattr(func, "__name__", type(func).__name__)
        tool_name = default_name if name is None else name
        if not isinstance(tool_name, str):
            raise TypeError(f"tool name must be a str, got {type(tool_name).__name__}")
        if not TOOL_NAME_PATTERN.match(tool_name):
            raise ValueError(
                f"tool name {tool_name!r} (of function {_qualname(func)!r}) must match "
                f"{TOOL_NAME_PATTERN.pattern}; pass tool(name=...) to choose another"
            )
        if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
            raise ValueError(
                f"tool function {_qualname(func)!r} is a generator; a tool must return its result"
            )
        docstring = parse_docstring(inspect.getdoc(target))
        if description is None:
            description = docstring.description or tool_name
        elif not isinstance(description, str):
            raise TypeError(f"tool description must be a str, got {type(description).__name__}")
        elif not description.strip():
            raise ValueError(f"tool description of {tool_name!r} must not be empty")

        self._name = tool_name
        self._is_async = inspect.iscoroutinefunction(target)
        self._hints: dict[str, Any] = {}
        self._context_params: list[str] = []
        schema = self._describe_parameters(func, target, docstring.params)
        self._input_schema = schema
        self._spec: ToolSpec = {
            "name": tool_name,
            "description": description,
            "inputSchema": {"json": schema},
        }

    def _describe_parameters(
        self, func: object, target: Callable[..., Any], docs: dict[str, str]
    ) -> dict[str, Any]:
        where = f"tool function {_qualname(func)!r}"
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read its signature: {exc}") from None
        try:
            hints = typing.get_type_hints(target, include_extras=True)
        except Exception as exc:  # NameError for an unresolvable forward reference, …
            raise ValueError(f"{where}: cannot resolve its type hints: {exc!r}") from None
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in signature.parameters.values():
            label = f"{where}: parameter {param.name!r}"
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
                raise ValueError(
                    f"{label}: {stars}{param.name} is not supported; a tool takes named "
                    "parameters only"
                )
            if param.kind is param.POSITIONAL_ONLY:
                raise ValueError(f"{label} is positional-only; the model passes arguments by name")
            hint = hints.get(param.name, inspect.Parameter.empty)
            if _is_context(param.name, hint, label):
                self._context_params.append(param.name)
                continue
            if hint is inspect.Parameter.empty:
                if param.name in ("self", "cls"):
                    raise ValueError(
                        f"{label} has no type annotation; to make a method a tool, "
                        "apply tool() to the bound method (tool(obj.method))"
                    )
                raise ValueError(
                    f"{label} has no type annotation; annotate it "
                    "(use typing.Any to accept any JSON value)"
                )
            try:
                properties[param.name] = property_schema(
                    hint, name=param.name, description=docs.get(param.name), default=param.default
                )
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            self._hints[param.name] = hint
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    @property
    def tool_name(self) -> str:
        """The name the model calls the tool by."""
        return self._name

    @property
    def tool_spec(self) -> ToolSpec:
        """The spec shown to the model (a fresh deep copy on every access)."""
        return copy.deepcopy(self._spec)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the original function directly, bypassing validation and the context."""
        return self.original_function(*args, **kwargs)

    async def invoke(self, tool_use: ToolUse, context: ToolContext) -> ToolResult:
        """Run the function for ``tool_use`` and return its ``toolResult``.

        The input (``{}`` when missing or ``None``) is validated and converted to the
        declared types; omitted optional parameters take the function's defaults;
        ``context`` parameters receive ``context``. A sync function runs in a worker
        thread (``asyncio.to_thread``, which copies context variables) so that a
        blocking tool does not block the event loop; an async one is awaited.

        Raises:
            ValueError: the input is not an object or does not match the schema (the
                message names the argument); the agent reports it to the model.
            InterruptException: the tool called ``context.interrupt`` and no answer
                exists yet; always propagated.
            Exception: whatever the function raises, unchanged.
        """
        raw = tool_use.get("input")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ValueError(
                f"input of tool {self._name!r} must be an object, got {type(raw).__name__}"
            )
        validate_input(self._input_schema, raw)
        kwargs = {key: from_json(self._hints[key], value) for key, value in raw.items()}
        for param in self._context_params:
            kwargs[param] = context
        func: Callable[..., Any] = self.original_function
        if self._is_async:
            result = await func(**kwargs)
        else:
            result = await asyncio.to_thread(func, **kwargs)
            if inspect.isawaitable(result):  # e.g. a partial of an async function
                result = await result
        return to_tool_result(tool_use["toolUseId"], result)

    def __repr__(self) -> str:
        return f"<DecoratedTool {self._name!r} of {_qualname(self.original_function)}>"


@overload
def tool(func: Callable[P, R], /) -> DecoratedTool[P, R]: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[P, R]], DecoratedTool[P, R]]: ...


def tool(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> DecoratedTool[P, R] | Callable[[Callable[P, R]], DecoratedTool[P, R]]:
    """Make a typed function (sync or async) into a tool the agent can offer the model.

    Usable as ``@tool``, ``@tool()`` and ``@tool(name="x", description="y")``. The
    name defaults to the function's ``__name__``; the description to the docstring's
    text before its first section, or to the name when there is none. Each parameter
    becomes a property of the input schema (described from the docstring's
    ``Args:``/``Parameters`` section or from ``Annotated[X, "..."]``); parameters
    without a default are required; extra properties are refused. A parameter named
    ``context`` or annotated ``ToolContext`` is left out of the schema and receives
    the :class:`ToolContext` when the agent runs the tool.

    Raises:
        TypeError: ``func`` is not callable, or is a class.
        ValueError: naming the function and parameter, for ``*args``/``**kwargs``, a
            positional-only or unannotated parameter, a type with no JSON Schema, a
            ``context`` parameter annotated with something else than ``ToolContext``,
            a generator function, or a name not matching ``^[a-zA-Z0-9_-]{1,64}$``.
    """
    if func is None:

        def decorate(inner: Callable[P, R]) -> DecoratedTool[P, R]:
            return DecoratedTool(inner, name=name, description=description)

        return decorate
    return DecoratedTool(func, name=name, description=description)


def _call_target(func: object) -> Callable[..., Any]:
    """Return what to read the signature, hints and docstring from."""
    if isinstance(func, type):
        raise TypeError(f"tool() needs a function, got the class {func.__qualname__}")
    if not callable(func):
        raise TypeError(
            f"tool() needs a callable, got {type(func).__name__} {func!r}"
            + ("; to name the tool, use tool(name=...)" if isinstance(func, str) else "")
        )
    if inspect.isroutine(func):
        return func
    call: Callable[..., Any] = func.__call__
    return call  # a callable object: its bound __call__ has the signature


def _is_context(name: str, hint: object, label: str) -> bool:
    """Whether the parameter receives the ToolContext (and not input from the model)."""
    base = _strip_optional(hint)
    if base is ToolContext:
        return True
    if name != _CONTEXT_PARAMETER:
        return False
    if base in (inspect.Parameter.empty, Any):
        return True
    raise ValueError(
        f"{label} is reserved for the ToolContext but is annotated {hint!r}; "
        "annotate it ToolContext or rename it"
    )


def _strip_optional(hint: object) -> object:
    """``Annotated[X, ...]`` → ``X``; ``X | None`` → ``X``."""
    if get_origin(hint) is typing.Annotated:
        hint = get_args(hint)[0]
    args = get_args(hint)
    if (
        len(args) == 2
        and type(None) in args
        and get_origin(hint) in (typing.Union, types.UnionType)
    ):
        return next(arg for arg in args if arg is not type(None))
    return hint


def _qualname(func: object) -> str:
    return str(getattr(func, "__qualname__", None) or repr(func))
