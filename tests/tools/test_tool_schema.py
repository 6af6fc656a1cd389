"""Type hints → JSON Schema, validation of tool input, and conversion back to Python."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, NewType, NotRequired, Optional, Required, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.tools.schema import from_json, property_schema, type_to_schema, validate_input


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mixed(enum.Enum):
    A = "a"
    B = 2


class Movie(TypedDict):
    title: str
    year: NotRequired[int]
    rating: Annotated[float, "out of ten"]


class Partial(TypedDict, total=False):
    key: Required[str]
    note: str


@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.0
    tags: list[str] = dataclasses.field(default_factory=list)
    cache: dict[str, int] = dataclasses.field(init=False, default_factory=dict)


@dataclasses.dataclass
class Shape:
    name: str
    points: list[Point]
    color: Color = Color.RED


@dataclasses.dataclass
class Node:
    value: int
    children: list[Node]


class Plain:
    pass


UserId = NewType("UserId", int)


# --- schema generation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (None, {"type": "null"}),
        (type(None), {"type": "null"}),
        (Any, {}),
        (UserId, {"type": "integer"}),
    ],
)
def test_primitives(hint: object, expected: dict[str, Any]) -> None:
    assert type_to_schema(hint) == expected


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (typing.List[int], {"type": "array", "items": {"type": "integer"}}),  # noqa: UP006
        (Sequence[str], {"type": "array", "items": {"type": "string"}}),
        (list, {"type": "array"}),
        (list[Any], {"type": "array"}),
        (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
        (set[str], {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        (frozenset[int], {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (Mapping[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (dict, {"type": "object"}),
        (dict[str, Any], {"type": "object"}),
        (
            list[list[bool]],
            {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}},
        ),
    ],
)
def test_containers(hint: object, expected: dict[str, Any]) -> None:
    assert type_to_schema(hint) == expected


def test_fixed_tuple_lists_each_position() -> None:
    assert type_to_schema(tuple[int, str]) == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "items": False,
        "minItems": 2,
        "maxItems": 2,
    }


@pytest.mark.parametrize("hint", [Optional[int], int | None, typing.Union[int, None]])  # noqa: UP007, UP045
def test_optional_is_any_of_with_null(hint: object) -> None:
    assert type_to_schema(hint) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}


def test_union() -> None:
    assert type_to_schema(int | str | list[int]) == {
        "anyOf": [
            {"type": "integer"},
            {"type": "string"},
            {"type": "array", "items": {"type": "integer"}},
        ]
    }


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
        (Literal[True], {"type": "boolean", "enum": [True]}),
        (Literal["a", 1], {"enum": ["a", 1]}),
        (Literal["a", None], {"enum": ["a", None]}),
        (Literal[1, 2.5], {"type": "number", "enum": [1, 2.5]}),
    ],
)
def test_literal(hint: object, expected: dict[str, Any]) -> None:
    assert type_to_schema(hint) == expected


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (Mixed, {"enum": ["a", 2]}),
    ],
)
def test_enum_lists_its_values(hint: object, expected: dict[str, Any]) -> None:
    assert type_to_schema(hint) == expected


def test_typeddict_required_follows_qualifiers_and_totality() -> None:
    # This module uses ``from __future__ import annotations``: Python 3.11 gets
    # ``__required_keys__`` wrong for NotRequired/Required here, the schema must not.
    assert type_to_schema(Movie) == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "year": {"type": "integer"},
            "rating": {"type": "number", "description": "out of ten"},
        },
        "required": ["title", "rating"],
        "additionalProperties": False,
    }
    assert type_to_schema(Partial)["required"] == ["key"]


def test_dataclass_fields_defaults_and_init_false() -> None:
    assert type_to_schema(Point) == {
        "type": "object",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "number", "default": 0.0},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["x"],
        "additionalProperties": False,
    }


def test_nested_dataclass_and_enum_default() -> None:
    schema = type_to_schema(Shape)
    assert schema["properties"]["points"]["items"] == type_to_schema(Point)
    assert schema["properties"]["color"] == {
        "type": "string",
        "enum": ["red", "green"],
        "default": "red",
    }
    assert schema["required"] == ["name", "points"]


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
        (
            Annotated[int, 5, "first str wins", "second"],
            {"type": "integer", "description": "first str wins"},
        ),
        (Annotated[int, 5], {"type": "integer"}),
        (
            Annotated[list[str] | None, "tags"],
            {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "description": "tags",
            },
        ),
    ],
)
def test_annotated_description(hint: object, expected: dict[str, Any]) -> None:
    assert type_to_schema(hint) == expected


def test_schemas_are_fresh_objects() -> None:
    first = type_to_schema(Point)
    first["properties"]["x"]["type"] = "string"
    assert type_to_schema(Point)["properties"]["x"] == {"type": "integer"}


@pytest.mark.parametrize(
    ("hint", "named"),
    [
        (bytes, "bytes"),
        (Plain, "Plain"),
        (Callable[[int], str], "Callable"),
        (dict[int, str], "int"),
        (list[bytes], "bytes"),
        (Optional[Plain], "Plain"),  # noqa: UP045
        (Literal[b"x"], "b'x'"),
        (complex, "complex"),
        (Node, "Node refers to itself"),
    ],
)
def test_undescribable_types_name_parameter_and_type(hint: object, named: str) -> None:
    with pytest.raises(ValueError, match="cannot describe") as info:
        type_to_schema(hint, name="payload")
    message = str(info.value)
    assert "'payload'" in message
    assert named in message


def test_property_schema_description_and_default() -> None:
    assert property_schema(int, name="n", description="count", default=3) == {
        "type": "integer",
        "description": "count",
        "default": 3,
    }
    # Annotated is more specific than the docstring.
    assert property_schema(Annotated[int, "from hint"], name="n", description="from doc") == {
        "type": "integer",
        "description": "from hint",
    }
    # Defaults that cannot be written as JSON are left out; enums give their value.
    assert "default" not in property_schema(Any, name="n", default=object())
    assert property_schema(Color, name="c", default=Color.GREEN)["default"] == "green"
    assert property_schema(tuple[int, ...], name="t", default=(1, 2))["default"] == [1, 2]
    assert "default" not in property_schema(int, name="n", default=inspect.Parameter.empty)


# --- validation ---------------------------------------------------------------------

SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "ratio": {"type": "number"},
        "exact": {"type": "boolean"},
        "color": type_to_schema(Color),
        "ids": type_to_schema(list[int]),
        "counts": type_to_schema(dict[str, int]),
        "shape": type_to_schema(Shape | None),
        "pair": type_to_schema(tuple[int, str]),
        "anything": {},
    },
    "required": ["query"],
    "additionalProperties": False,
}


def test_valid_input_passes() -> None:
    validate_input(
        SEARCH,
        {
            "query": "q",
            "limit": 3,
            "ratio": 1,
            "exact": False,
            "color": "red",
            "ids": [1, 2],
            "counts": {"a": 1},
            "shape": {"name": "s", "points": [{"x": 1, "y": 2.5}], "color": "green"},
            "pair": [1, "a"],
            "anything": [{"x": None}],
        },
    )
    validate_input(SEARCH, {"query": "q", "shape": None, "ratio": 0.5})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"query": "q", "limit": "3"}, "argument 'limit': expected integer, got str"),
        ({"query": "q", "limit": True}, "argument 'limit': expected integer, got bool"),
        ({"query": "q", "limit": 2.0}, "argument 'limit': expected integer, got float"),
        ({"query": "q", "ratio": False}, "argument 'ratio': expected number, got bool"),
        ({"query": "q", "exact": 1}, "argument 'exact': expected boolean, got int"),
        ({"query": 5}, "argument 'query': expected string, got int"),
        ({"query": None}, "argument 'query': expected string, got None"),
        ({}, "argument 'query': missing required argument"),
        ({"query": "q", "extra": 1}, "argument 'extra': unexpected argument"),
        (
            {"query": "q", "color": "blue"},
            "argument 'color': expected one of ['red', 'green'], got 'blue'",
        ),
        ({"query": "q", "ids": [1, "2"]}, "argument 'ids[1]': expected integer, got str"),
        ({"query": "q", "ids": "1"}, "argument 'ids': expected array, got str"),
        ({"query": "q", "counts": {"a": "x"}}, "argument 'counts.a': expected integer, got str"),
        ({"query": "q", "counts": []}, "argument 'counts': expected object, got list"),
        (
            {"query": "q", "shape": {"name": "s", "points": [{"y": 1.0}]}},
            "argument 'shape.points[0].x': missing required argument",
        ),
        (
            {"query": "q", "shape": {"name": "s", "points": [], "size": 1}},
            "argument 'shape.size': unexpected argument",
        ),
        ({"query": "q", "shape": "round"}, "argument 'shape': expected object or null, got str"),
        ({"query": "q", "pair": [1]}, "argument 'pair': expected at least 2 items, got 1"),
        ({"query": "q", "pair": [1, "a", 2]}, "argument 'pair': expected at most 2 items, got 3"),
        ({"query": "q", "pair": ["a", "a"]}, "argument 'pair[0]': expected integer, got str"),
    ],
)
def test_invalid_input_names_the_argument(value: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_input(SEARCH, value)
    assert str(info.value) == message or str(info.value).startswith(message + " ")


def test_unexpected_argument_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"allowed: 'query', 'limit'"):
        validate_input(SEARCH, {"query": "q", "lmit": 1})


def test_root_must_match_too() -> None:
    with pytest.raises(ValueError, match=r"^input: expected object, got list$"):
        validate_input(SEARCH, [])


def test_enum_membership_tells_bool_from_int() -> None:
    with pytest.raises(ValueError, match="expected one of"):
        validate_input({"enum": [1, 2]}, True)
    with pytest.raises(ValueError, match="expected one of"):
        validate_input({"enum": [True]}, 1)
    validate_input({"enum": [1, 2]}, 2)
    validate_input({"const": "x"}, "x")
    with pytest.raises(ValueError, match="expected 'x'"):
        validate_input({"const": "x"}, "y")


def test_type_lists_and_unknown_keywords() -> None:
    validate_input({"type": ["string", "null"], "format": "email"}, None)
    with pytest.raises(ValueError, match="expected string or null, got int"):
        validate_input({"type": ["string", "null"]}, 3)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=20,
    )
)
def test_any_accepts_every_json_value(value: object) -> None:
    validate_input({}, value)
    validate_input(type_to_schema(Any), value)


# --- conversion back to Python ------------------------------------------------------


def test_from_json_builds_declared_types() -> None:
    assert from_json(Color, "green") is Color.GREEN
    assert from_json(Level, 2) is Level.HIGH
    assert from_json(Color | None, None) is None
    assert from_json(Color | None, "red") is Color.RED
    assert from_json(tuple[int, ...], [1, 2]) == (1, 2)
    assert from_json(tuple[int, Color], [1, "red"]) == (1, Color.RED)
    assert from_json(set[str], ["a", "a"]) == {"a"}
    assert from_json(frozenset[int], [1]) == frozenset({1})
    assert from_json(tuple, [1]) == (1,)
    assert from_json(dict[str, Color], {"k": "red"}) == {"k": Color.RED}
    assert from_json(Annotated[list[Color], "d"], ["red"]) == [Color.RED]
    converted = from_json(float, 3)
    assert converted == 3.0
    assert isinstance(converted, float)
    assert from_json(bool, True) is True
    assert from_json(Any, {"a": [1]}) == {"a": [1]}
    assert from_json(UserId, 5) == 5


def test_from_json_builds_dataclasses_and_typeddicts() -> None:
    shape = from_json(Shape, {"name": "s", "points": [{"x": 1}], "color": "green"})
    assert shape == Shape(name="s", points=[Point(x=1)], color=Color.GREEN)
    assert isinstance(shape.points[0].y, float)
    assert from_json(list[Point] | None, [{"x": 2, "y": 1}]) == [Point(x=2, y=1.0)]
    movie = from_json(Movie, {"title": "t", "year": 1999, "rating": 7})
    assert movie == {"title": "t", "year": 1999, "rating": 7.0}
    assert isinstance(movie["rating"], float)


def test_from_json_union_takes_the_first_member_that_fits() -> None:
    assert from_json(int | str, "3") == "3"
    assert from_json(int | str, 3) == 3
    assert from_json(Point | Color, "red") is Color.RED
    assert from_json(Point | Color, {"x": 1}) == Point(x=1)


@given(
    st.builds(
        Shape,
        name=st.text(),
        points=st.lists(
            st.builds(
                Point,
                x=st.integers(),
                y=st.floats(allow_nan=False, allow_infinity=False),
                tags=st.lists(st.text()),
            ),
            max_size=4,
        ),
        color=st.sampled_from(Color),
    )
)
def test_dataclass_round_trip_through_json(shape: Shape) -> None:
    data = {
        "name": shape.name,
        "points": [{"x": p.x, "y": p.y, "tags": p.tags} for p in shape.points],
        "color": shape.color.value,
    }
    validate_input(type_to_schema(Shape), data)
    assert from_json(Shape, data) == shape
