"""Structured output: an answer that must be JSON matching a schema.

A run given an output type (``output_type=`` a pydantic model or any type a ``TypeAdapter``
accepts) or a JSON schema (``response_format=``, the HTTP form) asks the model for JSON: the
schema goes to the provider (OpenAI ``response_format`` json_schema, Anthropic a forced output
tool; see ``ModelRequest.output_schema``) and into the system prompt as an instruction, for
models with no native form. The final answer is validated; on a validation error the model is
shown the error and answers again, at most ``output_retries`` times (default 2), all within the
run's one ``run_timeout``. What still does not validate ends the run with
``StructuredOutputError``.

A ``response_format`` schema is a client's: it is checked before the run starts
(``schema_check``: bounded size and depth, references only inside it and none that loops in
place, RE2 patterns) and answers are validated against it with a bounded cost
(``answer_check``: RE2 matching, a time limit, threads of their own). An answer longer than
``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_ANSWER_DEPTH`` is refused without being
validated, as an invalid answer.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import pydantic
import referencing
import referencing.exceptions

from .answer_check import (
    VALIDATION_TIME_LIMIT,
    Budget,
    BudgetSpent,
    current_budget,
    safe_validator,
    validation_executor,
)
from .errors import ConfigurationError, OutputSchemaError, StructuredOutputError
from .messages import AssistantMessage, Message, UserMessage
from .model import OutputSchema
from .schema_check import check_bounds, check_schema_graph

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "MAX_ANSWER_CHARS",
    "MAX_ANSWER_DEPTH",
    "OutputCheck",
    "OutputSpec",
    "StructuredOutput",
    "aoutput_spec",
    "check_answer",
    "output_spec",
]

DEFAULT_OUTPUT_RETRIES = 2
MAX_ANSWER_CHARS = 128 * 1024
"""Characters of an answer that are validated; a longer answer is refused unparsed (parsing
JSON holds the GIL, about 3 ms for this many)."""
MAX_ANSWER_DEPTH = 64
"""Levels of JSON nesting an answer may have."""
_MAX_ERRORS = 20  # validation errors reported of one answer
_MAX_MESSAGE = 300  # characters of one error's message (they quote the answer)
_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_LANGUAGE = re.compile(r"[A-Za-z0-9_-]*")
_FIELD = "response_format.json_schema.schema"


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """The validated value of a run's answer, and its JSON form (``run.completed``'s
    ``output.structured`` on the wire)."""

    value: Any
    json: Any


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """The verdict on one answer: the value, or what is wrong with it.

    ``feedback`` is shown to the model (it may quote the answer); ``summary`` names only where
    and which rule failed, for errors and logs.
    """

    ok: bool
    value: Any = None
    json: Any = None
    feedback: str = ""
    summary: str = ""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What a run's answer must be: the schema sent to the model and the check of its answer."""

    schema: OutputSchema
    check: Callable[[str], OutputCheck]
    max_retries: int = DEFAULT_OUTPUT_RETRIES

    def instructions(self) -> str:
        """The system prompt's part: answer with JSON matching the schema."""
        schema = json.dumps(self.schema.schema, ensure_ascii=False, sort_keys=True)
        return (
            "Answer with a single JSON value and nothing else (no prose, no code fence) that "
            f"matches this JSON schema:\n{schema}"
        )

    def retry_prompt(self, feedback: str) -> str:
        """The message that gives the model its validation error."""
        return (
            f"Your answer did not match the required JSON schema: {feedback}\n"
            "Answer again with only the corrected JSON value."
        )

    async def acheck(self, text: str) -> OutputCheck:
        """``check`` on the validation threads, within ``VALIDATION_TIME_LIMIT``; a caller
        cancelled meanwhile (its run's timeout, a cancel) stops it at its next keyword."""
        budget = Budget()

        def run() -> OutputCheck:
            budget.deadline = time.monotonic() + VALIDATION_TIME_LIMIT  # from its start
            with budget:
                return self.check(text)

        future = validation_executor().submit(run)
        try:
            return await asyncio.wrap_future(future)
        finally:
            budget.stop.set()


def _refused(problem: str) -> OutputCheck:
    return OutputCheck(False, feedback=problem, summary=problem)


def _unfenced(text: str) -> str:
    """The JSON of an answer, out of a Markdown code fence if it came in one."""
    stripped = text.strip()
    if len(stripped) < 7 or not (stripped.startswith("```") and stripped.endswith("```")):
        return stripped
    inner = stripped[3:-3]
    language = _LANGUAGE.match(inner)
    rest = inner[language.end() if language else 0 :]
    gap = rest[: len(rest) - len(rest.lstrip())]
    return rest.strip() if "\n" in gap else stripped


def _depth(value: Any) -> int:
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            pending.extend((inner, depth + 1) for inner in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((inner, depth + 1) for inner in item)
    return deepest


def _decode(text: str) -> tuple[Any, OutputCheck | None]:
    if len(text) > MAX_ANSWER_CHARS:
        return None, _refused(
            f"the answer is {len(text)} characters long; at most {MAX_ANSWER_CHARS} are accepted"
        )
    too_deep = _refused(f"the answer is nested deeper than {MAX_ANSWER_DEPTH} levels")
    try:
        value = json.loads(_unfenced(text))
    except json.JSONDecodeError as exc:
        return None, _refused(f"not valid JSON ({exc.msg} at character {exc.pos})")
    except RecursionError:  # deeper than the parser goes
        return None, too_deep
    if _depth(value) > MAX_ANSWER_DEPTH:
        return None, too_deep
    return value, None


def _type_check(adapter: pydantic.TypeAdapter[Any]) -> Callable[[str], OutputCheck]:
    def check(text: str) -> OutputCheck:
        decoded, failed = _decode(text)
        if failed is not None:
            return failed
        try:
            value = adapter.validate_python(decoded)
        except pydantic.ValidationError as exc:
            errors = exc.errors(include_url=False)
            summary = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['type']}" for e in errors
            )
            feedback = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in errors
            )
            return OutputCheck(False, feedback=feedback, summary=summary)
        return OutputCheck(True, value=value, json=adapter.dump_python(value, mode="json"))

    return check


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else f"{text[: _MAX_MESSAGE - 3]}..."


def _schema_check(validator: jsonschema.protocols.Validator) -> Callable[[str], OutputCheck]:
    def validate(text: str) -> OutputCheck:
        decoded, failed = _decode(text)
        if failed is not None:
            return failed
        try:
            found = list(itertools.islice(validator.iter_errors(decoded), _MAX_ERRORS))
        except referencing.exceptions.Unresolvable:
            return _refused("the schema has a reference that cannot be resolved")
        except BudgetSpent as exc:
            if exc.cancelled:
                raise
            return _refused(
                "checking the answer against the schema took longer than "
                f"{VALIDATION_TIME_LIMIT:g} s; answer with a smaller value"
            )
        except RecursionError:
            return _refused("the answer is nested too deeply to be checked against the schema")
        if not found:
            return OutputCheck(True, value=decoded, json=decoded)
        errors = sorted(found, key=lambda e: [str(p) for p in e.absolute_path])
        where = [".".join(str(p) for p in e.absolute_path) or "(root)" for e in errors]
        summary = "; ".join(f"{w}: {e.validator}" for w, e in zip(where, errors, strict=True))
        feedback = "; ".join(f"{w}: {_clip(e.message)}" for w, e in zip(where, errors, strict=True))
        return OutputCheck(False, feedback=feedback, summary=summary)

    def check(text: str) -> OutputCheck:
        if current_budget() is not None:
            return validate(text)
        with Budget():  # called directly, not through acheck: still within the time limit
            return validate(text)

    return check


def output_spec(
    *,
    output_type: Any = None,
    response_format: Mapping[str, Any] | None = None,
    max_retries: int | None = None,
) -> OutputSpec | None:
    """The OutputSpec of a run's options; None when it asks for no structured output.

    ``response_format`` is ``{"type": "json_schema", "json_schema": {"name"?, "schema",
    "strict"?}}``. A bad type raises ConfigurationError, a refused schema OutputSchemaError
    (see ``schema_check``). Checking a large schema takes a while: on an event loop, use
    ``aoutput_spec``.
    """
    if max_retries is None:
        max_retries = DEFAULT_OUTPUT_RETRIES
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigurationError("output_retries must be an integer >= 0")
    if output_type is not None and response_format is not None:
        raise ConfigurationError("give output_type or response_format, not both")
    if output_type is not None:
        try:
            adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(output_type)
            schema = adapter.json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
            raise ConfigurationError(f"{output_type!r} cannot be an output type: {exc}") from exc
        label = getattr(output_type, "__name__", None) or "output"
        return OutputSpec(OutputSchema(_name(label), schema), _type_check(adapter), max_retries)
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        raise ConfigurationError('response_format must be {"type": "json_schema", ...}')
    body = response_format.get("json_schema")
    if not isinstance(body, Mapping) or not isinstance(body.get("schema"), Mapping):
        raise ConfigurationError("response_format.json_schema needs a schema (a JSON object)")
    name = body.get("name", "output")
    strict = body.get("strict", False)
    if not isinstance(name, str) or not isinstance(strict, bool):
        raise ConfigurationError("response_format.json_schema: name is a string, strict a bool")
    check_bounds(body["schema"], _FIELD)
    try:
        key = json.dumps(body["schema"], sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutputSchemaError(f"{_FIELD} is not JSON: {exc}", kind="invalid") from None
    schema, check = _compiled(key)
    return OutputSpec(OutputSchema(_name(name), schema, strict), check, max_retries)


async def aoutput_spec(
    *,
    output_type: Any = None,
    response_format: Mapping[str, Any] | None = None,
    max_retries: int | None = None,
) -> OutputSpec | None:
    """``output_spec`` on the validation threads: checking a client's schema against its
    draft's metaschema costs about 50 µs a value, too long for an event loop."""
    if output_type is None and response_format is None:
        return None
    call = functools.partial(
        output_spec,
        output_type=output_type,
        response_format=response_format,
        max_retries=max_retries,
    )
    return await asyncio.wrap_future(validation_executor().submit(call))


@functools.lru_cache(maxsize=64)
def _compiled(key: str) -> tuple[dict[str, Any], Callable[[str], OutputCheck]]:
    """A schema's checked form and the check of its answers, by its canonical JSON: a run's
    schema is checked at its admission and again at its start, often the same for many runs."""
    schema = json.loads(key)
    with warnings.catch_warnings():
        # an unknown $schema is a warning (and a fallback to the latest draft) in jsonschema
        warnings.simplefilter("error", DeprecationWarning)
        try:
            cls = jsonschema.validators.validator_for(schema)
        except DeprecationWarning:
            raise OutputSchemaError(
                f"{_FIELD} names an unknown $schema", kind="invalid", path=("$schema",)
            ) from None
    if cls is jsonschema.Draft3Validator:
        raise OutputSchemaError(
            f"{_FIELD}: draft-03 is not supported; use draft-04 or later",
            kind="unsupported",
            path=("$schema",),
        )
    patterns = check_schema_graph(schema, _FIELD, draft4=cls is jsonschema.Draft4Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = tuple(exc.absolute_path)
        where = "/".join(str(p) for p in path) or "(root)"
        raise OutputSchemaError(
            f"{_FIELD} is not a valid JSON schema at {where}: {_clip(exc.message)}",
            kind="invalid",
            path=path,
        ) from None
    # an empty registry: a schema's references are resolved in the schema, never fetched
    validator = safe_validator(cls, patterns, _FIELD)(schema, registry=referencing.Registry())
    return schema, _schema_check(validator)


def _name(label: str) -> str:
    return (_NAME.sub("_", label).strip("_") or "output")[:64]


async def check_answer(
    output: OutputSpec,
    message: AssistantMessage,
    answers: int,
    *,
    run_id: str,
    conversation: list[Message],
) -> StructuredOutput | None:
    """The validated answer, or None after asking the model again (the correction goes on
    ``conversation``; the rejected answer and it stay out of the stored turn); past the
    retries, StructuredOutputError."""
    # off the loop and within a time limit that this run's end also reaches: a client's
    # schema must not hold up the loop's other runs, nor outlive its run
    verdict = await output.acheck(message.content or "")
    if verdict.ok:
        return StructuredOutput(verdict.value, verdict.json)
    if answers > output.max_retries:
        raise StructuredOutputError(
            verdict.summary,
            attempts=answers,
            output=message.content or "",
            run_id=run_id,
        )
    conversation.append(UserMessage(output.retry_prompt(verdict.feedback)))
    return None
