"""Structured output: an answer that must be JSON matching a schema.

A run given an output type (``output_type=`` a pydantic model or any type a ``TypeAdapter``
accepts) or a JSON schema (``response_format=``, the HTTP form) asks the model for JSON: the
schema goes to the provider (OpenAI ``response_format`` json_schema, Anthropic a forced output
tool; see ``ModelRequest.output_schema``) and into the system prompt as an instruction, for
models with no native form. The final answer is validated; on a validation error the model is
shown the error and answers again, at most ``output_retries`` times (default 2), all within the
run's one ``run_timeout``. What still does not validate ends the run with
``StructuredOutputError``.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import pydantic
import referencing
import referencing.exceptions

from .errors import ConfigurationError
from .model import OutputSchema

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "OutputCheck",
    "OutputSpec",
    "StructuredOutput",
    "output_spec",
]

DEFAULT_OUTPUT_RETRIES = 2
_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*\Z", re.DOTALL)


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


def _unfenced(text: str) -> str:
    stripped = text.strip()
    match = _FENCE.match(stripped)
    return match.group(1).strip() if match else stripped


def _decode(text: str) -> tuple[Any, OutputCheck | None]:
    try:
        return json.loads(_unfenced(text)), None
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg} at character {exc.pos})"
        return None, OutputCheck(False, feedback=problem, summary=problem)


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


def _schema_check(validator: jsonschema.protocols.Validator) -> Callable[[str], OutputCheck]:
    def check(text: str) -> OutputCheck:
        decoded, failed = _decode(text)
        if failed is not None:
            return failed
        try:
            errors = sorted(validator.iter_errors(decoded), key=lambda e: list(e.absolute_path))
        except referencing.exceptions.Unresolvable:
            problem = "the schema has a reference that cannot be resolved"
            return OutputCheck(False, feedback=problem, summary=problem)
        if not errors:
            return OutputCheck(True, value=decoded, json=decoded)
        where = [".".join(str(p) for p in e.absolute_path) or "(root)" for e in errors]
        summary = "; ".join(f"{w}: {e.validator}" for w, e in zip(where, errors, strict=True))
        feedback = "; ".join(f"{w}: {e.message}" for w, e in zip(where, errors, strict=True))
        return OutputCheck(False, feedback=feedback, summary=summary)

    return check


def output_spec(
    *,
    output_type: Any = None,
    response_format: Mapping[str, Any] | None = None,
    max_retries: int | None = None,
) -> OutputSpec | None:
    """The OutputSpec of a run's options; None when it asks for no structured output.

    ``response_format`` is ``{"type": "json_schema", "json_schema": {"name"?, "schema",
    "strict"?}}``. A bad type or schema raises ConfigurationError.
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
    schema = dict(body["schema"])
    with warnings.catch_warnings():
        # an unknown $schema is a warning (and a fallback to the latest draft) in jsonschema
        warnings.simplefilter("error", DeprecationWarning)
        try:
            cls = jsonschema.validators.validator_for(schema)
        except DeprecationWarning:
            raise ConfigurationError(
                "response_format.json_schema.schema names an unknown $schema"
            ) from None
    _check_references(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ConfigurationError(
            f"response_format.json_schema.schema is not a valid JSON schema at {where}: "
            f"{exc.message}"
        ) from None
    name = body.get("name", "output")
    strict = body.get("strict", False)
    if not isinstance(name, str) or not isinstance(strict, bool):
        raise ConfigurationError("response_format.json_schema: name is a string, strict a bool")
    spec = OutputSchema(_name(name), schema, strict)
    # an empty registry: a schema's references are resolved in the schema, never fetched
    validator = cls(schema, registry=referencing.Registry())
    return OutputSpec(spec, _schema_check(validator), max_retries)


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


def _check_references(schema: Mapping[str, Any]) -> None:
    """Only references into the schema itself: a remote ``$ref`` would make the server fetch
    a URL a client chose."""
    for ref in _references(schema):
        if not ref.startswith("#"):
            raise ConfigurationError(
                f"response_format.json_schema.schema: $ref {ref!r} is not allowed; only "
                "references into the schema itself ('#/$defs/NAME') are"
            )
        if not ref.startswith("#/"):
            continue  # "#" or an anchor ("#name"): resolved, if at all, at validation
        node: Any = schema
        for part in ref[2:].split("/"):
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise ConfigurationError(
                    f"response_format.json_schema.schema: $ref {ref!r} points at nothing"
                )


def _name(label: str) -> str:
    return (_NAME.sub("_", label).strip("_") or "output")[:64]
