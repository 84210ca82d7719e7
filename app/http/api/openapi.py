"""The OpenAPI document, completed: every status an operation can answer, with its real body.

FastAPI derives the document from the routes, which leaves gaps a client generator or a
schema-driven fuzzer (schemathesis, in ``tests/reliability``) trips over: error answers listed
as ``application/json`` with FastAPI's own validation body, while the service always answers
``application/problem+json``; no 401 where authentication is on; no ``Retry-After``;
``/metrics`` as JSON. ``refine`` fixes those in one place, after the routes are declared, and
adds the links between operations (a started run → its status, events, cancellation and the
answer to its confirmation), so a stateful client can follow a run from start to end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from fastapi import FastAPI

__all__ = ["EVENT_TYPES", "install_openapi", "refine"]

EVENT_TYPES = (
    "run.started",
    "run.resumed",
    "text.delta",
    "reasoning.delta",
    "tool.call.started",
    "tool.call.completed",
    "custom",
    "usage",
    "run.completed",
    "run.failed",
    "run.cancelled",
)

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
_RETRY_AFTER = {
    "description": "Seconds to wait before retrying",
    "required": True,
    "schema": {"type": "string", "pattern": r"^[0-9]+$"},
}
_RUN_ID_HEADER = {
    "description": "The id of the started run",
    "required": True,
    "schema": {"type": "string"},
}
_DESCRIPTIONS = {
    401: "Missing or wrong API key (code unauthorized)",
    404: "Unknown, or another principal's, session or run (code not_found)",
    409: "Conflict: session_busy, or not_accepted for an external event",
    413: "The request body is too large (code payload_too_large)",
    422: "The request is not valid (code validation_error)",
    429: "No slot and no queue place (code overloaded), or a daily token budget is used up "
    "(code budget_exceeded)",
    503: "Draining, starting, the database is unreachable, or the run's agent failed its "
    "warm-up (code agent_unavailable)",
}
# statuses every operation of the service's API may answer, besides its own
_PROTECTED_PREFIXES = ("/v1/", "/external-events", "/debug/")
_BODY_METHODS = frozenset({"post", "put", "patch", "delete"})


def _problem(status: int, *, retry_after: bool = False, auth: bool = False) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS.get(status, "Problem"),
        "content": {"application/problem+json": {"schema": _PROBLEM_REF}},
    }
    headers: dict[str, Any] = {}
    if retry_after:
        headers["Retry-After"] = _RETRY_AFTER
    if auth:
        headers["WWW-Authenticate"] = {"required": True, "schema": {"type": "string"}}
    if headers:
        response["headers"] = headers
    return response


def _event_stream_content() -> dict[str, Any]:
    # each SSE event (its event, id and data fields), as OpenAPI 3.2's itemSchema describes it
    return {"text/event-stream": {"itemSchema": {"$ref": "#/components/schemas/ServerSentEvent"}}}


def _components(schema: dict[str, Any]) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ServerSentEvent"] = {
        "title": "ServerSentEvent",
        "type": "object",
        "required": ["event", "data", "id"],
        "properties": {
            "event": {"type": "string", "enum": list(EVENT_TYPES)},
            "id": {"type": "string", "pattern": r"^[1-9][0-9]*$"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": "#/components/schemas/WireEvent"},
            },
        },
    }
    components["WireEvent"] = {
        "title": "WireEvent",
        "type": "object",
        "required": ["type", "seq", "run_id", "session_id", "ts", "data"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": list(EVENT_TYPES)},
            "seq": {"type": "integer", "minimum": 1},
            "run_id": {"type": "string"},
            "session_id": {"type": "string"},
            "ts": {"type": "string"},
            "data": {"type": "object"},
        },
    }
    _storable(components)
    problem = components.get("Problem")
    if isinstance(problem, dict):
        problem.setdefault("required", ["type", "title", "status", "detail", "code"])
    # FastAPI's own validation body is never sent: every 422 is a problem
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)


_NO_NUL = "^[^\\u0000]*$"


def _storable(components: dict[str, Any]) -> None:
    """Say in the document what ``app.http.api.schemas`` refuses of what a run stores: NUL in any
    string or key (JSON numbers out of a double's range cannot be written by a client that
    reads the document, and are refused too)."""
    text = {"type": "string", "pattern": _NO_NUL}
    components["StorableValue"] = {
        "description": "Any JSON value without NUL (U+0000) in its strings or keys.",
        "anyOf": [
            text,
            {"type": "number"},
            {"type": "boolean"},
            {"type": "null"},
            {"type": "array", "items": {"$ref": "#/components/schemas/StorableValue"}},
            {
                "type": "object",
                "propertyNames": text,
                "additionalProperties": {"$ref": "#/components/schemas/StorableValue"},
            },
        ],
    }
    json_schema = components.get("JsonSchemaFormat")
    if isinstance(json_schema, dict):
        # a response format's schema goes to the provider and into the run's options: the
        # same values as metadata (``description`` is text like any other)
        fields = json_schema.get("properties", {})
        if "schema" in fields:
            fields["schema"].update(
                propertyNames=text,
                additionalProperties={"$ref": "#/components/schemas/StorableValue"},
            )
        for branch in fields.get("description", {}).get("anyOf", []):
            if branch.get("type") == "string":
                branch["pattern"] = _NO_NUL
    run = components.get("RunRequest")
    if not isinstance(run, dict):
        return
    properties = run.get("properties", {})
    # every text field of the request is stored with the run (``replaces`` and ``agent`` too)
    for field in properties.values():
        for branch in [field, *field.get("anyOf", [])]:
            # a field with a pattern of its own (``webhook_url``) already excludes NUL
            if branch.get("type") == "string" and "enum" not in branch:
                branch.setdefault("pattern", _NO_NUL)
    if "metadata" in properties:
        metadata = properties["metadata"]
        metadata["anyOf"] = [
            {
                "type": "object",
                "propertyNames": text,
                "additionalProperties": {"$ref": "#/components/schemas/StorableValue"},
            },
            {"type": "null"},
        ]


def _operation_ids(schema: dict[str, Any]) -> dict[tuple[str, str], str]:
    ids: dict[tuple[str, str], str] = {}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if isinstance(operation, dict) and "operationId" in operation:
                ids[(method, path)] = operation["operationId"]
    return ids


_Operation = tuple[str, str]
_Ids = dict[_Operation, str]

_START: Final = ("post", "/v1/sessions/{session_id}/runs")
_GET_RUN: Final = ("get", "/v1/runs/{run_id}")
_EVENTS: Final = ("get", "/v1/runs/{run_id}/events")
_CANCEL: Final = ("post", "/v1/runs/{run_id}/cancel")
_DELIVER: Final = ("post", "/external-events")
_SESSION: Final = ("get", "/v1/sessions/{session_id}")
_MESSAGES: Final = ("get", "/v1/sessions/{session_id}/messages")
_DELETE: Final = ("delete", "/v1/sessions/{session_id}")


def _by_run(expression: str) -> dict[str, Any]:
    return {"parameters": {"run_id": expression}}


def _answer(session_id: str, run_id: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "session_id": session_id,
            "run_id": run_id,
            "name": "confirmation_response",
            "payload": {"tool_call_id": "call_unknown", "approved": True},
        }
    }


def _link(ids: _Ids, target: _Operation, extra: dict[str, Any], text: str) -> dict[str, Any]:
    return {"operationId": ids[target], "description": text, **extra}


def _links(schema: dict[str, Any]) -> None:
    ids = _operation_ids(schema)
    if not all(key in ids for key in (_START, _GET_RUN, _EVENTS, _CANCEL, _DELIVER, _SESSION)):
        return
    responses = _operation(schema, _START)["responses"]
    started = _started_links(ids)
    for status in ("200", "202"):
        if status in responses:
            responses[status]["links"] = dict(started)
    _operation(schema, _GET_RUN)["responses"]["200"]["links"] = _viewed_links(ids)
    by_path = "$request.path.run_id"
    _operation(schema, _EVENTS)["responses"]["200"]["links"] = {
        "GetRun": _link(ids, _GET_RUN, _by_run(by_path), "The run's status and result"),
        "CancelRun": _link(ids, _CANCEL, _by_run(by_path), "Cancel the run"),
    }
    # the cancellation links nowhere: a fuzzer takes an operation with links out as a place
    # to start, and a cancellation of a random run id leads nowhere
    for status in ("202", "409"):
        deliver_responses = _operation(schema, _DELIVER)["responses"]
        if status in deliver_responses:
            deliver_responses[status]["links"] = {
                "CancelRun": _link(
                    ids, _CANCEL, _by_run("$request.body#/run_id"), "Cancel the run"
                ),
            }


def _started_links(ids: _Ids) -> dict[str, Any]:
    """Where a started run leads: its id is in the answer's ``X-Run-Id``."""
    run_header = "$response.header.X-Run-Id"
    started = {
        "GetRun": _link(ids, _GET_RUN, _by_run(run_header), "The run's status and result"),
        "FollowEvents": _link(ids, _EVENTS, _by_run(run_header), "The run's events"),
        "CancelRun": _link(ids, _CANCEL, _by_run(run_header), "Cancel the run"),
        "AnswerConfirmation": _link(
            ids,
            _DELIVER,
            _answer("$request.path.session_id", run_header),
            "Answer the run's confirmation request",
        ),
        "GetSession": _link(
            ids,
            _SESSION,
            {"parameters": {"session_id": "$request.path.session_id"}},
            "The run's session",
        ),
    }
    if _MESSAGES in ids:
        started["GetMessages"] = _link(
            ids,
            _MESSAGES,
            {"parameters": {"session_id": "$request.path.session_id"}},
            "The session's conversation",
        )
    return started


def _viewed_links(ids: _Ids) -> dict[str, Any]:
    """Where a run's record leads: its ids are in the answer's body."""
    by_body = "$response.body#/run_id"
    viewed = {
        "FollowEvents": _link(ids, _EVENTS, _by_run(by_body), "The run's events"),
        "CancelRun": _link(ids, _CANCEL, _by_run(by_body), "Cancel the run"),
        "AnswerConfirmation": _link(
            ids,
            _DELIVER,
            _answer("$response.body#/session_id", by_body),
            "Answer the run's confirmation request",
        ),
    }
    if _DELETE in ids:
        viewed["DeleteSession"] = _link(
            ids,
            _DELETE,
            {"parameters": {"session_id": "$response.body#/session_id"}},
            "Delete the run's session",
        )
    return viewed


def _not_null(parameter: dict[str, Any]) -> None:
    """An optional header or query parameter is absent, never ``null``: FastAPI's ``anyOf``
    with ``{"type": "null"}`` would invite a client to send the text "null"."""
    schema = parameter.get("schema")
    if not isinstance(schema, dict) or not isinstance(schema.get("anyOf"), list):
        return
    kept = [item for item in schema["anyOf"] if item != {"type": "null"}]
    if len(kept) == len(schema["anyOf"]):
        return
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    if rest.get("default", 0) is None:
        del rest["default"]
    parameter["schema"] = {**kept[0], **rest} if len(kept) == 1 else {**rest, "anyOf": kept}


def _operation(schema: dict[str, Any], key: tuple[str, str]) -> dict[str, Any]:
    method, path = key
    operation: dict[str, Any] = schema["paths"][path][method]
    return operation


def refine(schema: dict[str, Any], *, auth: bool) -> dict[str, Any]:
    """Complete FastAPI's document in place (see the module docstring); returns it."""
    _components(schema)
    if auth:
        schemes = schema["components"].setdefault("securitySchemes", {})
        schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    for path, operations in schema.get("paths", {}).items():
        protected = path.startswith(_PROTECTED_PREFIXES)
        for method, operation in operations.items():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", ()):
                _not_null(parameter)
            responses: dict[str, Any] = operation.setdefault("responses", {})
            statuses = {int(code) for code in responses if code.isdigit() and int(code) >= 400}
            if protected:
                statuses |= {404, 503}
                if auth:
                    statuses.add(401)
                    operation["security"] = [{"bearer": []}]
                if operation.get("parameters") or "requestBody" in operation:
                    statuses.add(422)
                if method in _BODY_METHODS and "requestBody" in operation:
                    statuses.add(413)
            for status in sorted(statuses):
                retry_after = status in (429, 503)
                responses[str(status)] = _problem(
                    status, retry_after=retry_after, auth=status == 401
                )
            for code, response in responses.items():
                if not code.startswith("2"):
                    continue
                content = response.get("content")
                if not isinstance(content, dict):
                    continue
                if "text/event-stream" in content:
                    content.update(_event_stream_content())
                    if path.endswith("/events"):
                        content.pop("application/json", None)
                elif content.get("application/json") == {"schema": {}}:
                    # a route answering a Response of its own: FastAPI knows no body schema
                    content["application/json"] = {"schema": {"type": "object"}}
    _special_cases(schema)
    _links(schema)
    return schema


def _special_cases(schema: dict[str, Any]) -> None:
    paths = schema.get("paths", {})
    start = paths.get("/v1/sessions/{session_id}/runs", {}).get("post")
    if start is not None:
        for status in ("200", "202"):
            response = start["responses"].get(status)
            if response is not None:
                response.setdefault("headers", {})["X-Run-Id"] = _RUN_ID_HEADER
    metrics = paths.get("/metrics", {}).get("get")
    if metrics is not None:
        metrics["responses"]["200"] = {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    ready = paths.get("/readyz", {}).get("get")
    if ready is not None:
        ready["responses"]["200"]["content"] = {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {
                        "status": {"type": "string", "enum": ["ready"]},
                        "readiness": {
                            "type": "string",
                            "enum": ["answered", "configured"],
                            "description": "answered: every required agent's model answered "
                            "a warm-up call; configured: AGENT_WARMUP=0, no call was made",
                        },
                        "agents": {
                            "type": "object",
                            "description": "each agent's warm-up state, by name",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["status", "required"],
                                "properties": {
                                    "status": {
                                        "type": "string",
                                        "enum": [
                                            "starting",
                                            "ready",
                                            "configured",
                                            "unavailable",
                                        ],
                                    },
                                    "required": {"type": "boolean"},
                                    "reason": {"type": "string"},
                                },
                            },
                        },
                    },
                }
            }
        }
        ready["responses"]["503"] = _problem(503, retry_after=True)
    health = paths.get("/healthz", {}).get("get")
    if health is not None:
        health["responses"]["200"]["content"] = {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"type": "string", "enum": ["ok"]}},
                }
            }
        }


def install_openapi(app: FastAPI) -> None:
    """Serve the refined document at ``/openapi.json`` (built once, on first use)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            enabled = bool(getattr(app.state.authenticator, "enabled", False))
            app.openapi_schema = refine(build(), auth=enabled)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
