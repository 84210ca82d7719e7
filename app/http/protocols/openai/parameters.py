"""The OpenAI request parameters beyond the input: honoured, or refused, never dropped.

- Structured output is the run's own (``RunRequestOptions.response_format``: the answer is
  validated against the schema, and retried, before the run completes). Chat's
  ``response_format`` and the Responses API's ``text.format``: ``json_schema`` maps to it as it
  is, ``json_object`` to the schema ``{"type": "object"}``, ``text`` to nothing.
- What the service cannot give is a 400 ``invalid_request_error`` naming the parameter: more
  than one choice (``n``), log probabilities, stop sequences, token biases, audio, predicted
  output, and any other format.
- Sampling settings (``temperature``, ``top_p``, penalties, ``seed``, token limits, ``reasoning``,
  ``service_tier``...) are the agent's configuration; a request's are echoed in the Responses
  object, where the Open Responses schema requires them, and otherwise not applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from app.http.api.schemas import JsonSchemaFormat
from app.http.protocols.common import RefusedValue

__all__ = [
    "chat_response_format",
    "refuse_unhonoured_chat",
    "refuse_unhonoured_responses",
    "responses_text_format",
    "sampling_echo",
]

_JSON_OBJECT = {"type": "object"}


def _schema_format(param: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime's ``response_format`` of a ``json_schema`` spec (name, schema, strict)."""
    try:
        parsed = JsonSchemaFormat.model_validate(
            {key: spec[key] for key in ("name", "description", "schema", "strict") if key in spec}
        )
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise RefusedValue(param, f"{param}.{where}: {problem['msg']}") from None
    return {
        "type": "json_schema",
        "json_schema": {
            "name": parsed.name,
            "schema": parsed.json_schema,
            "strict": parsed.strict,
        },
    }


def _json_object(name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": _JSON_OBJECT}}


def chat_response_format(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Chat's ``response_format`` as the run's; ``RefusedValue`` for a kind it cannot take."""
    if value is None:
        return None
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _json_object("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise RefusedValue("response_format", "response_format.json_schema: an object")
        return _schema_format("response_format.json_schema", spec)
    raise RefusedValue(
        "response_format",
        f"response_format of type {kind!r} is not supported: text, json_object or json_schema",
    )


def responses_text_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Responses API's ``text.format`` as the run's ``response_format``."""
    if text is None:
        return None
    form = text.get("format")
    if form is None:
        return None
    if not isinstance(form, Mapping):
        raise RefusedValue("text.format", "text.format: an object with a type")
    kind = form.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _json_object("json_object")
    if kind == "json_schema":
        return _schema_format("text.format", form)
    raise RefusedValue(
        "text.format",
        f"text.format of type {kind!r} is not supported: text, json_object or json_schema",
    )


def _refuse(param: str, why: str) -> RefusedValue:
    return RefusedValue(param, f"{param}: {why}; leave it out")


def refuse_unhonoured_chat(extra: Mapping[str, Any]) -> None:
    """A 400 (``RefusedValue``) for a Chat Completions parameter the service cannot honour.

    ``extra``: the request's fields beyond those the model reads (pydantic's extras).
    """
    n = extra.get("n")
    if n is not None and n != 1:
        raise _refuse("n", "an agent's run gives one answer, so one choice")
    if extra.get("logprobs"):
        raise _refuse("logprobs", "an agent's answer carries no log probabilities")
    if extra.get("top_logprobs"):
        raise _refuse("top_logprobs", "an agent's answer carries no log probabilities")
    if extra.get("stop"):
        raise _refuse("stop", "the agent's answer is not cut at stop sequences")
    if extra.get("logit_bias"):
        raise _refuse("logit_bias", "the agent's model takes no token biases from a request")
    modalities = extra.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _refuse("modalities", "an agent answers in text only")
    for name in ("audio", "prediction"):
        if extra.get(name) is not None:
            raise _refuse(name, "not supported by the agents of this server")
    if extra.get("functions"):
        raise _refuse("functions", "this server runs the agent's own tools")


def refuse_unhonoured_responses(extra: Mapping[str, Any]) -> None:
    """A 400 (``RefusedValue``) for a Responses parameter the service cannot honour."""
    if extra.get("top_logprobs"):
        raise _refuse("top_logprobs", "an agent's answer carries no log probabilities")
    include = extra.get("include")
    if isinstance(include, list) and "message.output_text.logprobs" in include:
        raise _refuse("include", "an agent's answer carries no log probabilities")


# the Responses object's sampling members: the request's value, else the API's default
_SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "reasoning": None,
    "service_tier": "default",  # the one tier there is
    "safety_identifier": None,
    "prompt_cache_key": None,
}
_NUMBERS = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})


def sampling_echo(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The members the Open Responses schema requires of a response, from the request."""
    echoed = dict(_SAMPLING_DEFAULTS)
    for name in _SAMPLING_DEFAULTS:
        value = (extra or {}).get(name)
        if value is None:
            continue
        if name in _NUMBERS and isinstance(value, int | float) and not isinstance(value, bool):
            echoed[name] = float(value)
        elif name in ("top_logprobs", "max_output_tokens", "max_tool_calls"):
            if isinstance(value, int) and not isinstance(value, bool):
                echoed[name] = value
        elif name == "reasoning" and isinstance(value, Mapping):
            echoed[name] = {"effort": value.get("effort"), "summary": value.get("summary")}
        elif name in ("safety_identifier", "prompt_cache_key") and isinstance(value, str):
            echoed[name] = value
    return echoed
