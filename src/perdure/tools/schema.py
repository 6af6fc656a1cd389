"""Describe Python type hints as JSON Schema, check tool input against it, convert it back.

Three pure functions share one idea of which types a tool may take:

- :func:`type_to_schema` / :func:`property_schema` turn a type hint into the JSON
  Schema the model is shown;
- :func:`validate_input` checks the model's JSON input against that schema before the
  tool runs, with a message that names the offending argument;
- :func:`from_json` turns validated JSON back into what the hint promises (an ``Enum``
  member, a dataclass instance, a ``tuple`` or ``set``), so the function gets the
  types it declared.

Supported: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, ``list[X]``,
``Sequence[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``set[X]``, ``frozenset[X]``,
``dict[str, X]``, ``Mapping[str, X]``, unions and ``Optional``, ``Literal``, ``Enum``
subclasses, ``TypedDict`` classes, dataclasses, ``NewType`` and
``Annotated[X, "description"]``. Anything else raises ``ValueError``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin

__all__ = ["from_json", "property_schema", "type_to_schema", "validate_input"]

_ARRAY_ORIGINS: frozenset[object] = frozenset(
    {list, collections.abc.Sequence, collections.abc.MutableSequence}
)
_SET_ORIGINS: frozenset[object] = frozenset(
    {set, frozenset, collections.abc.Set, collections.abc.MutableSet}
)
_MAPPING_ORIGINS: frozenset[object] = frozenset(
    {dict, collections.abc.Mapping, collections.abc.MutableMapping}
)
_UNION_ORIGINS: frozenset[object] = frozenset({Union, types.UnionType})
_PRIMITIVES: dict[object, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}
_SUPPORTED = (
    "use str, int, float, bool, None, Any, list, tuple, set, dict[str, ...], "
    "a union, Literal, an Enum, a TypedDict or a dataclass"
)


class _Undescribable(Exception):
    """Raised deep inside :func:`_schema`; ``reason`` names the innermost bad type."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- type hints → JSON Schema ------------------------------------------------------


def type_to_schema(annotation: object, *, name: str = "value") -> dict[str, Any]:
    """Return the JSON Schema describing values of the type hint ``annotation``.

    ``name`` is the parameter (or field) the hint belongs to; it only appears in
    error messages. ``Any`` gives ``{}`` (any JSON value); ``X | None`` gives
    ``{"anyOf": [X, {"type": "null"}]}``; objects built from TypedDicts and
    dataclasses have ``additionalProperties: false``.

    Raises:
        ValueError: the hint (or a type inside it) has no JSON Schema; the message
            names ``name``, the hint and the innermost unsupported type.
    """
    try:
        return _schema(annotation, ())
    except _Undescribable as exc:
        raise ValueError(
            f"parameter {name!r}: cannot describe type {_type_name(annotation)} "
            f"as JSON Schema: {exc.reason}"
        ) from None


def property_schema(
    annotation: object,
    *,
    name: str,
    description: str | None = None,
    default: object = inspect.Parameter.empty,
) -> dict[str, Any]:
    """Return the schema of one object property (a tool parameter, a dataclass field).

    A description from ``Annotated[X, "..."]`` wins over ``description`` (the more
    specific source); ``default`` (``inspect.Parameter.empty`` for none) is recorded as
    ``"default"`` when it can be written as JSON (an ``Enum`` member as its value).

    Raises:
        ValueError: as :func:`type_to_schema`.
    """
    schema = type_to_schema(annotation, name=name)
    if description and "description" not in schema:
        schema["description"] = description
    if default is not inspect.Parameter.empty:
        ok, value = _json_default(default)
        if ok:
            schema["default"] = value
    return schema


def _schema(tp: object, seen: tuple[type, ...]) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp is None:
        tp = type(None)
    if isinstance(tp, type) and tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if isinstance(tp, typing.NewType):
        return _schema(tp.__supertype__, seen)
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is typing.Annotated:
        schema = _schema(args[0], seen)
        description = next((m for m in args[1:] if isinstance(m, str)), None)
        if description is not None:
            schema["description"] = description
        return schema
    if origin in (Required, NotRequired):
        return _schema(args[0], seen)
    if origin in _UNION_ORIGINS:
        return {"anyOf": [_schema(member, seen) for member in args]}
    if origin is Literal:
        return _enum_schema(args, tp)
    if origin in _ARRAY_ORIGINS or tp in (list, tuple):
        return _array_schema(args[0] if args else Any, seen)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _array_schema(args[0], seen)
        items = [_schema(arg, seen) for arg in args]
        return {
            "type": "array",
            "prefixItems": items,
            "items": False,
            "minItems": len(items),
            "maxItems": len(items),
        }
    if origin in _SET_ORIGINS or tp in (set, frozenset):
        return {**_array_schema(args[0] if args else Any, seen), "uniqueItems": True}
    if origin in _MAPPING_ORIGINS or tp is dict:
        key, value = args if args else (str, Any)
        if _unwrap(key) is not str:
            raise _Undescribable(f"object keys must be str, not {_type_name(key)}")
        mapping: dict[str, Any] = {"type": "object"}
        if value is not Any:
            mapping["additionalProperties"] = _schema(value, seen)
        return mapping
    if origin is None and isinstance(tp, type):
        if tp in seen:
            raise _Undescribable(f"{tp.__qualname__} refers to itself")
        if issubclass(tp, enum.Enum):
            return _enum_schema([member.value for member in tp], tp)
        if typing.is_typeddict(tp):
            return _typeddict_schema(tp, (*seen, tp))
        if dataclasses.is_dataclass(tp):
            return _dataclass_schema(tp, (*seen, tp))
    raise _Undescribable(f"{_type_name(tp)} is not supported ({_SUPPORTED})")


def _array_schema(item: object, seen: tuple[type, ...]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    if item is not Any:
        schema["items"] = _schema(item, seen)
    return schema


def _enum_schema(values: collections.abc.Sequence[object], tp: object) -> dict[str, Any]:
    kinds = set()
    for value in values:
        kind = _PRIMITIVES.get(type(value))
        if kind is None:
            raise _Undescribable(
                f"{_type_name(tp)} has the value {value!r}, which is not a JSON "
                "string, number, boolean or null"
            )
        kinds.add(kind)
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    schema: dict[str, Any] = {"type": kinds.pop()} if len(kinds) == 1 else {}
    schema["enum"] = list(values)
    return schema


def _typeddict_schema(tp: type, seen: tuple[type, ...]) -> dict[str, Any]:
    hints = _hints(tp)
    declared_required: frozenset[str] = getattr(tp, "__required_keys__", frozenset())
    properties: dict[str, Any] = {}
    required: list[str] = []
    for key, hint in hints.items():
        properties[key] = _schema(hint, seen)
        # The qualifier wins: under ``from __future__ import annotations`` Python 3.11
        # cannot see Required/NotRequired when it computes ``__required_keys__``.
        qualifier = _qualifier(hint)
        if qualifier is Required or (qualifier is None and key in declared_required):
            required.append(key)
    return _object_schema(properties, required)


def _dataclass_schema(tp: type, seen: tuple[type, ...]) -> dict[str, Any]:
    hints = _hints(tp)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in dataclasses.fields(tp):
        if not field.init:
            continue
        properties[field.name] = _schema(hints[field.name], seen)
        if field.default is not dataclasses.MISSING:
            ok, value = _json_default(field.default)
            if ok:
                properties[field.name]["default"] = value
        elif field.default_factory is dataclasses.MISSING:
            required.append(field.name)
    return _object_schema(properties, required)


def _object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _hints(tp: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(tp, include_extras=True)
    except Exception as exc:  # NameError for a bad forward reference, and kin
        raise _Undescribable(
            f"the type hints of {tp.__qualname__} cannot be resolved: {exc}"
        ) from None


def _qualifier(hint: object) -> object:
    """Return ``Required``/``NotRequired`` if ``hint`` carries one (under ``Annotated``)."""
    while True:
        origin = get_origin(hint)
        if origin in (Required, NotRequired):
            return origin
        if origin is not typing.Annotated:
            return None
        hint = get_args(hint)[0]


def _unwrap(tp: object) -> object:
    """Strip ``Annotated``, ``Required``/``NotRequired`` and ``NewType`` wrappers."""
    while True:
        if isinstance(tp, typing.NewType):
            tp = tp.__supertype__
        elif get_origin(tp) in (typing.Annotated, Required, NotRequired):
            tp = get_args(tp)[0]
        else:
            return tp


def _json_default(value: object) -> tuple[bool, object]:
    """Return ``(True, json_value)`` if ``value`` can be written as JSON, else ``(False, None)``."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return True, json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return False, None


def _type_name(tp: object) -> str:
    if isinstance(tp, type) and get_origin(tp) is None:
        return tp.__qualname__
    return repr(tp)


# --- validation of JSON input ------------------------------------------------------


def validate_input(schema: Mapping[str, Any], value: object) -> None:
    """Check the JSON ``value`` against ``schema`` (as built by :func:`type_to_schema`).

    Deliberately small: it understands ``type``, ``enum``, ``const``, ``anyOf``,
    ``properties``, ``required``, ``additionalProperties``, ``items``, ``prefixItems``,
    ``minItems`` and ``maxItems``, and ignores every other keyword. ``integer`` means
    an ``int`` that is not a ``bool``; ``number`` an ``int`` or ``float`` that is not
    a ``bool``.

    Raises:
        ValueError: ``value`` does not match; the message names the argument path,
            e.g. ``argument 'limit': expected integer, got str`` or
            ``argument 'items[2].name': missing required argument``.
    """
    error = _check(schema, value, "")
    if error is not None:
        raise ValueError(error)


def _check(schema: Mapping[str, Any], value: object, path: str) -> str | None:
    """Return why ``value`` does not match ``schema``, or ``None`` if it does."""
    if "anyOf" in schema:
        error = _check_any_of(schema["anyOf"], value, path)
        if error is not None:
            return error
    if "const" in schema and not _json_equal(value, schema["const"]):
        return _at(path, f"expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and not any(_json_equal(value, option) for option in schema["enum"]):
        return _at(path, f"expected one of {schema['enum']!r}, got {value!r}")
    if "type" in schema and not _type_matches(schema, value):
        return _at(path, f"expected {_describe(schema)}, got {_kind(value)}")
    if isinstance(value, dict):
        return _check_object(schema, value, path)
    if isinstance(value, list | tuple):
        return _check_array(schema, value, path)
    return None


def _check_any_of(options: list[Mapping[str, Any]], value: object, path: str) -> str | None:
    errors = [_check(option, value, path) for option in options]
    if any(error is None for error in errors):
        return None
    # When only one option has the value's JSON type, its error is the useful one
    # (an Optional[SomeDataclass] given an object with a bad field).
    same_type = [
        error
        for option, error in zip(options, errors, strict=True)
        if "type" in option and _type_matches(option, value)
    ]
    if len(same_type) == 1:
        return same_type[0]
    expected = " or ".join(_describe(option) for option in options)
    return _at(path, f"expected {expected}, got {_kind(value)}")


def _check_object(schema: Mapping[str, Any], value: dict[Any, Any], path: str) -> str | None:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for key in schema.get("required", ()):
        if key not in value:
            return _at(_join(path, key), "missing required argument")
    additional = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = _join(path, str(key))
        if key in properties:
            error = _check(properties[key], item, sub)
        elif additional is False:
            allowed = ", ".join(repr(name) for name in properties) or "none"
            return _at(sub, f"unexpected argument (allowed: {allowed})")
        elif isinstance(additional, Mapping):
            error = _check(additional, item, sub)
        else:
            error = None
        if error is not None:
            return error
    return None


def _check_array(
    schema: Mapping[str, Any], value: list[Any] | tuple[Any, ...], path: str
) -> str | None:
    min_items = schema.get("minItems")
    max_items = schema.get("maxItems")
    if min_items is not None and len(value) < min_items:
        return _at(path, f"expected at least {min_items} items, got {len(value)}")
    if max_items is not None and len(value) > max_items:
        return _at(path, f"expected at most {max_items} items, got {len(value)}")
    prefix: list[Mapping[str, Any]] = schema.get("prefixItems", [])
    items = schema.get("items", True)
    for index, item in enumerate(value):
        sub = f"{path}[{index}]"
        if index < len(prefix):
            error = _check(prefix[index], item, sub)
        elif items is False:
            return _at(sub, f"expected at most {len(prefix)} items")
        elif isinstance(items, Mapping):
            error = _check(items, item, sub)
        else:
            error = None
        if error is not None:
            return error
    return None


def _type_matches(schema: Mapping[str, Any], value: object) -> bool:
    expected = schema["type"]
    names = [expected] if isinstance(expected, str) else list(expected)
    return any(_is_type(name, value) for name in names)


def _is_type(name: str, value: object) -> bool:
    match name:
        case "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "string":
            return isinstance(value, str)
        case "boolean":
            return isinstance(value, bool)
        case "null":
            return value is None
        case "array":
            return isinstance(value, list | tuple)
        case "object":
            return isinstance(value, dict)
        case _:
            return True  # a type this small validator does not know: do not reject


def _json_equal(a: object, b: object) -> bool:
    # True == 1 in Python but not in JSON.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _describe(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return f"one of {schema['enum']!r}"
    if "anyOf" in schema:
        return " or ".join(_describe(option) for option in schema["anyOf"])
    expected = schema.get("type")
    if expected is None:
        return "any value"
    return expected if isinstance(expected, str) else " or ".join(expected)


def _kind(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _at(path: str, problem: str) -> str:
    return f"argument {path!r}: {problem}" if path else f"input: {problem}"


# --- JSON → the Python values the hints promise -------------------------------------


def from_json(annotation: object, value: object) -> Any:
    """Convert JSON ``value`` (already validated) into the type ``annotation`` promises.

    Enum values become members, objects become dataclass instances, arrays become
    ``tuple``/``set``/``frozenset`` where the hint says so, an ``int`` for a ``float``
    becomes a ``float``; containers, unions, TypedDicts and dataclasses convert their
    contents recursively. Anything already of the right shape is returned as is.

    Raises:
        Exception: whatever an ``Enum`` or dataclass constructor raises for the value.
    """
    tp = _unwrap(annotation)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in _UNION_ORIGINS:
        for member in args:
            if _check(_schema(member, ()), value, "") is None:
                return from_json(member, value)
        return value
    if isinstance(value, list | tuple):
        return _array_from_json(tp, origin, args, value)
    if isinstance(value, dict):
        return _object_from_json(tp, origin, args, value)
    if origin is None and isinstance(tp, type) and issubclass(tp, enum.Enum):
        return value if isinstance(value, tp) else tp(value)
    return value


def _array_from_json(
    tp: object, origin: object, args: tuple[Any, ...], value: list[Any] | tuple[Any, ...]
) -> Any:
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return tuple(from_json(arg, item) for arg, item in zip(args, value, strict=False))
    item_type = args[0] if args else Any
    items = [from_json(item_type, item) for item in value]
    container = origin if origin is not None else tp
    if container is tuple:
        return tuple(items)
    if container is frozenset:
        return frozenset(items)
    if container in (set, collections.abc.Set, collections.abc.MutableSet):
        return set(items)
    return items


def _object_from_json(
    tp: object, origin: object, args: tuple[Any, ...], value: dict[Any, Any]
) -> Any:
    if origin in _MAPPING_ORIGINS and len(args) == 2:
        return {key: from_json(args[1], item) for key, item in value.items()}
    if origin is not None or not isinstance(tp, type):
        return value
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {key: from_json(hints.get(key, Any), item) for key, item in value.items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return tp(**{key: from_json(hints.get(key, Any), item) for key, item in value.items()})
    return value
