"""Validating an answer against a client's schema: bounded in time and off the event loop.

``jsonschema`` matches ``pattern`` and ``patternProperties`` with Python's backtracking ``re``,
which holds the GIL for as long as a match takes: ``^(a+)+$`` against 32 ``a`` and a ``!``
takes minutes, and no timeout reaches into it. Here those keywords (and
``additionalProperties``, which matches the same patterns) use RE2, linear in the answer;
``uniqueItems`` compares canonical forms in a set instead of every pair. Every keyword first
checks a ``Budget``: a validation past its time limit, or whose run was cancelled, stops at
the next keyword instead of running on in its thread.

Checks run on ``validation_executor()``, two threads of their own, so that a slow one never
takes the threads that file reads and DNS look-ups of the default executor need. A thread
holding the GIL yields it to the loop at least every 5 ms (``sys.getswitchinterval``), and
RE2 releases it while matching; what holds it longer is parsing the answer's JSON, which is
why an answer is bounded in size (``structured.MAX_ANSWER_CHARS``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from .schema_check import compile_pattern

__all__ = [
    "VALIDATION_TIME_LIMIT",
    "Budget",
    "BudgetSpent",
    "current_budget",
    "safe_validator",
    "validation_executor",
]

VALIDATION_TIME_LIMIT = 2.0
"""Seconds one answer's validation may take; past it the answer is refused as too costly."""

_local = threading.local()
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()

Keyword = Callable[[Any, Any, Any, Mapping[str, Any]], Iterator[ValidationError] | None]


class BudgetSpent(Exception):
    """A validation ran past its time limit (``cancelled`` false) or its run ended."""

    def __init__(self, *, cancelled: bool) -> None:
        super().__init__("cancelled" if cancelled else "time limit")
        self.cancelled = cancelled


class Budget:
    """One validation's time limit, and a stop its run sets when it ends meanwhile."""

    def __init__(self, seconds: float = VALIDATION_TIME_LIMIT) -> None:
        self.deadline = time.monotonic() + seconds
        self.stop = threading.Event()

    def check(self) -> None:
        if self.stop.is_set():
            raise BudgetSpent(cancelled=True)
        if time.monotonic() > self.deadline:
            raise BudgetSpent(cancelled=False)

    def __enter__(self) -> Budget:
        _local.budget = self
        return self

    def __exit__(self, *exc: object) -> None:
        _local.budget = None


def current_budget() -> Budget | None:
    """The budget of the validation running on this thread, if any."""
    budget: Budget | None = getattr(_local, "budget", None)
    return budget


def validation_executor() -> ThreadPoolExecutor:
    """The threads answers are validated in (made on first use, shared by every agent)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="answer-check")
        return _executor


def _guarded(keyword: Keyword) -> Keyword:
    def guarded(
        validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError] | None:
        budget = current_budget()
        if budget is not None:
            budget.check()
        return keyword(validator, value, instance, schema)

    return guarded


def _canonical(value: Any) -> Any:
    """A hashable form under which two JSON values are equal when JSON Schema says so
    (``1`` and ``1.0`` are, ``true`` and ``1`` are not)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    if isinstance(value, Mapping):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    return ("other", repr(value))


def safe_validator(
    cls: type[jsonschema.protocols.Validator], patterns: dict[str, Any], field: str
) -> type[jsonschema.protocols.Validator]:
    """``cls`` with RE2 patterns (``patterns``: each compiled, by its source), a linear
    ``uniqueItems`` and a budget check before every keyword."""

    def regex(pattern: str) -> Any:
        found = patterns.get(pattern)
        if found is None:  # a pattern the schema check did not reach: compile it the same way
            found = patterns[pattern] = compile_pattern(pattern, field, ())
        return found

    def pattern(
        validator: Any, source: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string") and regex(source).search(instance) is None:
            yield ValidationError(f"{_short(instance)} does not match {source!r}")

    def pattern_properties(
        validator: Any, value: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        for source, subschema in value.items():
            compiled = regex(source)
            for key, item in instance.items():
                if compiled.search(key) is not None:
                    yield from validator.descend(item, subschema, path=key, schema_path=source)

    def additional_properties(
        validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        properties = schema.get("properties", {})
        compiled = [regex(source) for source in schema.get("patternProperties", {})]
        extras = [
            key
            for key in instance
            if key not in properties and not any(c.search(key) is not None for c in compiled)
        ]
        if validator.is_type(value, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], value, path=extra)
        elif not value and extras:
            names = ", ".join(repr(extra) for extra in sorted(extras)[:10])
            yield ValidationError(f"Additional properties are not allowed ({names} unexpected)")

    def unique_items(
        validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        if value and validator.is_type(instance, "array"):
            seen = {_canonical(item) for item in instance}
            if len(seen) < len(instance):
                yield ValidationError("the array has non-unique elements")

    keywords: dict[str, Keyword] = dict(cls.VALIDATORS)
    keywords.update(
        pattern=pattern,
        patternProperties=pattern_properties,
        additionalProperties=additional_properties,
        uniqueItems=unique_items,
    )
    guarded = {name: _guarded(keyword) for name, keyword in keywords.items()}
    extend: Callable[..., type[jsonschema.protocols.Validator]] = jsonschema.validators.extend
    return extend(cls, validators=guarded)


def _short(instance: Any) -> str:
    text = repr(instance)
    return text if len(text) <= 80 else f"{text[:77]}..."
