"""The checks a ``response_format`` schema passes before its run starts.

A schema is data a client chose, and every answer of the run is validated against it on the
server, so it must be one whose validation is bounded:

- at most ``MAX_SCHEMA_DEPTH`` levels of JSON nesting and ``MAX_SCHEMA_NODES`` JSON values;
- references only into the schema itself (a remote ``$ref`` would make the server fetch a URL
  a client chose), each pointing at something; ``$id`` only at the root; no ``$dynamicRef``
  or ``$recursiveRef``;
- no cycle of references and in-place keywords (``allOf``, ``not``, ``if``...) that comes back
  to a schema without going down into the answer: its validation would never end. A recursive
  schema that goes down a level each time (a tree: a node's ``children`` are nodes) is fine;
- every ``pattern`` and ``patternProperties`` name compiled by RE2, which matches in linear
  time: no backreferences or lookaround, and at most ``MAX_PATTERN_SIZE`` RE2 instructions.

A schema that fails one raises ``OutputSchemaError`` with the JSON path of the offending part.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import re2  # type: ignore[import-untyped]

from .errors import OutputSchemaError

__all__ = [
    "MAX_PATTERN_SIZE",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_NODES",
    "Path",
    "check_bounds",
    "check_schema_graph",
    "compile_pattern",
]

MAX_SCHEMA_DEPTH = 64
"""Levels of JSON nesting (objects and arrays) a schema may have."""
MAX_SCHEMA_NODES = 5_000
"""JSON values (objects, arrays, strings, numbers...) a schema may have."""
MAX_PATTERN_SIZE = 1_000
"""RE2 instructions a pattern may compile to: matching costs up to this much per character."""

Path = tuple[str | int, ...]

# keywords whose schemas apply to the same instance: a cycle through them never ends
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas", "dependencies")
# keywords whose schemas apply to a part of the instance (or to a property name)
_CHILD_ONE = (
    "additionalProperties",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "items",
)
_CHILD_LIST = ("prefixItems", "items")
_CHILD_MAP = ("properties", "patternProperties", "$defs", "definitions")
_DYNAMIC = ("$dynamicRef", "$recursiveRef")

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the client's error, not a log line
_OPTIONS.never_capture = True  # only whether it matches is asked


def _where(path: Path) -> str:
    return "/".join(str(part) for part in path) or "(root)"


def check_bounds(schema: Any, field: str) -> None:
    """Depth and size, counted without recursion: the first check of a client's schema."""
    count = 0
    pending: list[tuple[Any, int, Path]] = [(schema, 1, ())]
    while pending:
        value, depth, path = pending.pop()
        count += 1
        if count > MAX_SCHEMA_NODES:
            raise OutputSchemaError(
                f"{field} has more than {MAX_SCHEMA_NODES} JSON values; make it smaller",
                kind="too_large",
                path=(),
            )
        if isinstance(value, Mapping | list) and depth > MAX_SCHEMA_DEPTH:
            raise OutputSchemaError(
                f"{field} is nested deeper than {MAX_SCHEMA_DEPTH} levels at {_where(path)}; "
                "use $defs and $ref for deep shapes",
                kind="too_deep",
                path=path,
            )
        if isinstance(value, Mapping):
            pending.extend((item, depth + 1, (*path, str(key))) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, depth + 1, (*path, i)) for i, item in enumerate(value))


def compile_pattern(pattern: str, field: str, path: Path) -> Any:
    """The RE2 form of a schema's pattern, or OutputSchemaError naming where it is."""
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise OutputSchemaError(
            f"{field}: the pattern {pattern[:100]!r} at {_where(path)} is not supported "
            f"({reason}); patterns are matched by RE2: no backreferences or lookaround",
            kind="pattern",
            path=path,
        ) from None
    if compiled.programsize > MAX_PATTERN_SIZE:
        raise OutputSchemaError(
            f"{field}: the pattern {pattern[:100]!r} at {_where(path)} is too complex "
            f"({compiled.programsize} RE2 instructions, at most {MAX_PATTERN_SIZE}); "
            "use smaller repetition counts",
            kind="pattern",
            path=path,
        )
    return compiled


def _subschemas(node: Mapping[str, Any], path: Path) -> Iterator[tuple[Any, Path, bool]]:
    """Each schema under ``node``'s keywords, its path, and whether it applies in place."""
    for key in _IN_PLACE_ONE + _CHILD_ONE:
        value = node.get(key)
        if isinstance(value, Mapping):
            yield value, (*path, key), key in _IN_PLACE_ONE
    for key in _IN_PLACE_LIST + _CHILD_LIST:
        value = node.get(key)
        if isinstance(value, list):
            for i, item in enumerate(value):
                yield item, (*path, key, i), key in _IN_PLACE_LIST
    for key in _IN_PLACE_MAP + _CHILD_MAP:
        value = node.get(key)
        if isinstance(value, Mapping):
            for name, item in value.items():
                # $defs are applied only through a $ref, which is an edge of its own
                yield item, (*path, key, name), key in _IN_PLACE_MAP


class _Graph:
    """The schema's subschemas, and the in-place edges between them (``$ref`` included)."""

    def __init__(self, root: Mapping[str, Any], field: str, draft4: bool) -> None:
        self.root = root
        self.field = field
        self.draft4 = draft4
        self.anchors = self._anchors()
        self.paths: dict[int, Path] = {}
        self.edges: dict[int, list[int]] = {}
        self.patterns: dict[str, Any] = {}
        self.evaluates_unevaluated = False
        self.has_pattern_properties = False

    def _anchors(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        pending: list[Any] = [self.root]
        while pending:
            value = pending.pop()
            if isinstance(value, Mapping):
                for key in ("$anchor", "$dynamicAnchor"):
                    if isinstance(value.get(key), str):
                        found.setdefault(value[key], value)
                for key in ("$id", "id"):
                    if isinstance(value.get(key), str) and value[key].startswith("#"):
                        found.setdefault(value[key][1:], value)
                pending.extend(value.values())
            elif isinstance(value, list):
                pending.extend(value)
        return found

    def resolve(self, ref: str, path: Path) -> tuple[Any, Path]:
        if not ref.startswith("#"):
            raise OutputSchemaError(
                f"{self.field}: $ref {ref!r} at {_where(path)} is not allowed; only references "
                "into the schema itself ('#/$defs/NAME') are",
                kind="ref",
                path=path,
            )
        if ref in ("#", "#/"):
            return self.root, ()
        if not ref.startswith("#/"):
            target = self.anchors.get(ref[1:])
            if target is None:
                raise OutputSchemaError(
                    f"{self.field}: $ref {ref!r} at {_where(path)} names no anchor",
                    kind="ref",
                    path=path,
                )
            return target, ("#" + ref[1:],)
        node: Any = self.root
        where: list[str | int] = []
        for part in ref[2:].split("/"):
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
                where.append(key)
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
                where.append(int(key))
            else:
                raise OutputSchemaError(
                    f"{self.field}: $ref {ref!r} at {_where(path)} points at nothing",
                    kind="ref",
                    path=path,
                )
        return node, tuple(where)

    def walk(self) -> None:
        pending: list[tuple[Any, Path]] = [(self.root, ())]
        while pending:
            node, path = pending.pop()
            if not isinstance(node, Mapping) or id(node) in self.paths:
                continue  # a boolean schema, or one already seen (through a $ref)
            self.paths[id(node)] = path
            edges = self.edges[id(node)] = []
            self._keywords(node, path)
            ref = node.get("$ref")
            if isinstance(ref, str):
                target, target_path = self.resolve(ref, (*path, "$ref"))
                if isinstance(target, Mapping):
                    edges.append(id(target))
                    pending.append((target, target_path))
            for sub, sub_path, in_place in _subschemas(node, path):
                if isinstance(sub, Mapping):
                    if in_place:
                        edges.append(id(sub))
                    pending.append((sub, sub_path))

    def _keywords(self, node: Mapping[str, Any], path: Path) -> None:
        for key in _DYNAMIC:
            if key in node:
                raise OutputSchemaError(
                    f"{self.field}: {key} at {_where(path)} is not supported; use $ref",
                    kind="unsupported",
                    path=(*path, key),
                )
        identifiers = ("$id", "id") if self.draft4 else ("$id",)
        for key in identifiers:
            value = node.get(key)
            if path and isinstance(value, str) and not value.startswith("#"):
                raise OutputSchemaError(
                    f"{self.field}: {key} is allowed only at the root (found at {_where(path)})",
                    kind="unsupported",
                    path=(*path, key),
                )
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern not in self.patterns:
            self.patterns[pattern] = compile_pattern(pattern, self.field, (*path, "pattern"))
        names = node.get("patternProperties")
        if isinstance(names, Mapping):
            self.has_pattern_properties = True
            for name in names:
                if name not in self.patterns:
                    where = (*path, "patternProperties", name)
                    self.patterns[name] = compile_pattern(name, self.field, where)
        if "unevaluatedProperties" in node:
            self.evaluates_unevaluated = True

    def find_cycle(self) -> Path | None:
        """The path of a schema on an in-place cycle, if there is one (an iterative DFS)."""
        done: set[int] = set()
        for start in self.edges:
            if start in done:
                continue
            on_path = {start}
            stack: list[tuple[int, Iterator[int]]] = [(start, iter(self.edges[start]))]
            while stack:
                node, successors = stack[-1]
                following = next(successors, None)
                if following is None:
                    stack.pop()
                    on_path.discard(node)
                    done.add(node)
                elif following in on_path:
                    return self.paths[following]
                elif following not in done:
                    on_path.add(following)
                    stack.append((following, iter(self.edges.get(following, ()))))
        return None


def check_schema_graph(schema: Mapping[str, Any], field: str, *, draft4: bool) -> dict[str, Any]:
    """References, cycles and patterns of a schema within bounds (``check_bounds``); the
    RE2 form of each of its patterns, by pattern."""
    graph = _Graph(schema, field, draft4)
    graph.walk()
    cycle = graph.find_cycle()
    if cycle is not None:
        raise OutputSchemaError(
            f"{field}: the schema at {_where(cycle)} refers back to itself without going down "
            "into the answer ($ref, allOf, anyOf, oneOf, not, if...): its validation would "
            "never end",
            kind="ref_cycle",
            path=cycle,
        )
    if graph.evaluates_unevaluated and graph.has_pattern_properties:
        raise OutputSchemaError(
            f"{field}: unevaluatedProperties together with patternProperties is not supported",
            kind="unsupported",
            path=(),
        )
    return graph.patterns
