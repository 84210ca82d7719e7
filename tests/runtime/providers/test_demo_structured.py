"""The demo model's structured answers match the schema they were asked in."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from agent_runtime.providers.demo_structured import example_value

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "exclusiveMinimum": 3},
            "x": {"type": "number", "minimum": 1.5},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "minItems": 2},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            "kind": {"const": "k"},
            "short": {"type": "string", "maxLength": 2, "minLength": 1},
            "long": {"type": "string", "minLength": 40},
        },
        "$defs": {"Tag": {"enum": ["red", "blue"]}},
        "additionalProperties": False,
    },
    {"allOf": [{"type": "object", "properties": {"a": {"type": ["string", "null"]}}}]},
    {"$ref": "#/definitions/Node", "definitions": {"Node": {"type": "array", "items": {}}}},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_value_is_valid(schema: dict[str, Any]) -> None:
    value = example_value(schema, "the input")
    jsonschema.validate(value, schema)


def test_strings_are_the_input() -> None:
    assert example_value(SCHEMAS[0], "Ada") == {"a": "Ada"}


def test_a_recursive_schema_ends() -> None:
    schema = {"$ref": "#", "type": "object"}
    assert example_value(schema, "x") is None
