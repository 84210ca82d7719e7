"""The demo model's structured answers: a JSON value that matches the run's output schema.

Deterministic, like the rest of the demo model: strings are the user's input, numbers the
smallest the schema allows, booleans ``true``, arrays as short as allowed, objects every property
they declare, and a choice (``enum``, ``anyOf``, ``oneOf``) its first option. ``$ref`` is
followed inside the schema (``#/$defs/...``, ``#/definitions/...``), a bounded number of times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["example_value"]

# references followed at most this deep (a recursive schema gets its shortest instance)
_MAX_DEPTH = 16


def example_value(schema: Mapping[str, Any], text: str) -> Any:
    """A value that ``schema`` accepts, built from ``text`` where it needs a string."""
    return _value(schema, schema, text, 0)


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _value(schema: Mapping[str, Any], root: Mapping[str, Any], text: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(schema.get("$ref"), str):
        return _value(_resolve(root, schema["$ref"]), root, text, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and isinstance(options[0], Mapping):
            if key == "allOf":
                merged: dict[str, Any] = {}
                for option in options:
                    if isinstance(option, Mapping):
                        merged.update(option)
                return _value(merged, root, text, depth + 1)
            return _value(options[0], root, text, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _typed(str(kind), schema, root, text, depth)


def _typed(
    kind: str, schema: Mapping[str, Any], root: Mapping[str, Any], text: str, depth: int
) -> Any:
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return {}
        return {
            str(name): _value(sub if isinstance(sub, Mapping) else {}, root, text, depth + 1)
            for name, sub in properties.items()
        }
    if kind == "array":
        items = schema.get("items")
        count = int(schema.get("minItems") or 0) or 1
        if not isinstance(items, Mapping):
            return []
        return [_value(items, root, text, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _number(kind, schema)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema, text)


def _number(kind: str, schema: Mapping[str, Any]) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    number: int | float = low if isinstance(low, int | float) and not isinstance(low, bool) else 0
    if "exclusiveMinimum" in schema and number == schema["exclusiveMinimum"]:
        number += 1
    return math.ceil(number) if kind == "integer" else number


def _string(schema: Mapping[str, Any], text: str) -> str:
    low = int(schema.get("minLength") or 0)
    high = schema.get("maxLength")
    value = text or "demo"
    if len(value) < low:
        value = value.ljust(low, ".")
    if isinstance(high, int) and len(value) > high:
        value = value[:high]
    return value
