"""Bad input: a schema-driven fuzzer, then hand-picked malformed requests, against a real server.

schemathesis loads the live server's ``/openapi.json`` and runs all of its phases in-process
(examples, coverage, fuzzing, and the stateful phase, which follows the document's links: a
started run → its status, events, confirmation answer, cancellation). Every check is on: no
5xx, no status, header, content type or body outside the document, valid data accepted, invalid
data refused, undeclared methods answered 405, the API keys honoured. The hand-picked requests
are the ones a fuzzer does not write: bodies that are not JSON, are too large (declared or
chunked), nested too deeply; bad ids; NUL bytes. Each must be a 4xx problem with the right code.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.support.auth import API_KEYS, auth
from tests.support.probes import state, wait_idle
from tests.support.problems import PROBLEM, assert_problem
from tests.support.server import Server, backend_env, launch, stop
from tests.support.sse import read_events

if TYPE_CHECKING:
    # imported where used: the hand-picked requests below run without the fuzz group
    import schemathesis
    from schemathesis.engine import events as engine_events

MAX_BODY = 64 * 1024
SEED = int(os.environ.get("RELIABILITY_SEED", "20261130"))
MAX_EXAMPLES = 60
SERVER_ENV = {
    "AGENT_API_KEYS": API_KEYS,
    "AGENT_MAX_BODY_BYTES": str(MAX_BODY),
    "AGENT_CONFIRMATION_TIMEOUT": "0.5",
    "AGENT_RUN_TIMEOUT": "10",
    "AGENT_DEMO_SLOW_SECONDS": "0.05",
}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    """One server with API keys, a small body limit and short waits (confirmations, runs)."""
    failed = request.session.testsfailed
    running = launch(tmp_path_factory.mktemp("bad-input"), SERVER_ENV)
    yield running
    stop(running, request, failed)


@pytest.fixture(
    scope="module",
    params=[
        "default",
        pytest.param("redis+postgres", marks=[pytest.mark.redis, pytest.mark.postgres]),
    ],
)
def fuzzed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The server schemathesis runs against, once per backend (the default one is
    ``server``)."""
    pytest.importorskip(
        "schemathesis", reason="not installed (the fuzz group): uv run --group fuzz pytest -m slow"
    )
    if request.param == "default":
        yield request.getfixturevalue("server")
        return
    failed = request.session.testsfailed
    with backend_env(request.param) as env:
        running = launch(tmp_path_factory.mktemp("bad-input-shared"), {**SERVER_ENV, **env})
        yield running
        stop(running, request, failed)


# --- schemathesis -------------------------------------------------------------------------------


def before_call(context: schemathesis.HookContext, case: Any, kwargs: dict[str, Any]) -> None:
    """An Idempotency-Key names one request: a generated key sent again with another body is
    rightly refused (422 ``idempotency_key_reused``), so every request sent gets a key of its
    own, as a client makes one per action (in every phase, replays included). A global hook:
    schemathesis calls ``before_call`` hooks of that scope only."""
    headers = case.headers  # a case-insensitive mapping
    key = headers.get("Idempotency-Key") if headers is not None else None
    if isinstance(key, str):
        headers["Idempotency-Key"] = f"{key[:200]}-{uuid.uuid4()}"


@functools.cache
def _register_global_hooks() -> None:
    """Gives schemathesis ``before_call``, once per process."""
    import schemathesis

    schemathesis.hook(before_call)


# what a body can be refused for that its schema cannot say (a cron expression that does not
# parse or fires too often, a zone the database does not know, a moment already past, a
# webhook host that does not resolve to a public address...)
_SEMANTIC_CODES = frozenset(
    {
        "invalid_cron",
        "cron_too_frequent",
        "cron_never_fires",
        "too_many_schedules",
        "unknown_timezone",
        "schedule_in_past",
        "schedule_timing",
        "unknown_agent",
        "webhook_url_refused",
        # a run's input parts: a blank text, a URL of another scheme, a data URL that does not
        # decode or whose bytes are not whole, too many parts
        "empty_input",
        "unsupported_url",
        "invalid_data_url",
        "empty_file",
        "malformed_file",
        "too_many_parts",
        # a file whose bytes are of no type taken (the schema can only say binary): a 415
        "unsupported_media_type",
        # a run's branch_from that names a run of the session that stored no turn
        "not_a_turn",
    }
)


def _semantic_refusal(response: Any) -> bool:
    """A 422 (or 415) problem whose code is one the schema cannot express."""
    if getattr(response, "status_code", None) not in (415, 422):
        return False
    try:
        body = response.json()
    except Exception:
        return False
    return isinstance(body, dict) and body.get("code") in _SEMANTIC_CODES


def _sent_authorization(response: Any) -> bool:
    """Whether the request behind ``response`` carried an Authorization header after all."""
    request = getattr(response, "request", None)
    headers = getattr(request, "headers", None) or {}
    return any(name.lower() == "authorization" for name in headers)


def _from_the_start(body: Any) -> Any:
    """A generated ``branch_from`` names no run (a 404): branch from the start instead, so runs
    start; unless the value (or its pairing with ``replaces``) is what the case gets wrong."""
    if not isinstance(body, dict) or "replaces" in body:
        return body
    branch = body.get("branch_from")
    if isinstance(branch, str) and 0 < len(branch) <= 128 and "\x00" not in branch:
        body["branch_from"] = "start"
    return body


def fuzz(server: Server) -> tuple[engine_events.EngineFinished, dict[str, Any]]:
    """Run every schemathesis phase; the end event and what was sent and received."""
    import schemathesis
    from schemathesis.engine import events as engine_events
    from schemathesis.engine import from_schema

    _register_global_hooks()
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "headers": auth("alice"),
            "request-timeout": 20,
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
            # steps enough to follow a run to its answer and cancellation beside the links
            # schemathesis infers for the files (an upload's Location)
            "phases": {"stateful": {"max-steps": 16}},
        }
    )
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json", config=config)

    @schema.hook
    def map_body(context: schemathesis.HookContext, body: Any) -> Any:
        # most generated agent names are unknown (a 404): name the configured one instead, so
        # that runs start and the stateful phase has something to follow
        if isinstance(body, dict) and isinstance(body.get("agent"), str):
            body["agent"] = "default"
        return _from_the_start(body)

    recreated: list[str] = []

    @schema.hook
    def filter_failure(
        context: schemathesis.HookContext, failure: Any, case: Any, response: Any
    ) -> bool:
        # a session is created by its first run: after DELETE /v1/sessions/X, a run started
        # in X (POST /v1/sessions/X/runs, which schemathesis does not know creates X) makes
        # X exist again. A refused start (a 404 `replaces`, a 409) must not: kept unless X
        # exists again with a run in it (its title, latest or active run came from one).
        if failure.code == "ST202" and _semantic_refusal(response):
            return False
        if failure.code == "ST203" and _sent_authorization(response):
            # the config's headers are added to every request, the one that drops
            # Authorization included: what the server answered was an authorized request
            return False
        if failure.code != "ST301" or not failure.free.startswith("DELETE /v1/sessions/"):
            return True
        path = failure.free.removeprefix("DELETE ")
        again = httpx.get(f"{server.base_url}{path}", headers=auth("alice"), timeout=10)
        view = again.json() if again.status_code == 200 else {}
        if any(view.get(key) is not None for key in ("title", "last_run_id", "active_run_id")):
            recreated.append(f"{failure.free} then {failure.usage}")
            return False
        return True

    statuses: collections.Counter[tuple[str, int]] = collections.Counter()
    transitions: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    finished: engine_events.EngineFinished | None = None
    for event in from_schema(schema).execute():
        if isinstance(event, engine_events.ScenarioFinished | engine_events.FuzzScenarioFinished):
            recorder = event.recorder
            for interaction in recorder.interactions.values():
                if interaction.response is not None:
                    label = f"{interaction.request.method}"
                    statuses[(label, interaction.response.status_code)] += 1
            for node in recorder.cases.values():
                if node.transition is not None:
                    transitions[node.transition.id] += 1
            for checks in recorder.checks.values():
                for check in checks:
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        failures.append(
                            f"{recorder.label}: {check.name}: {failure.title}\n"
                            f"{failure.message}\n{check.failure_info.code_sample}"
                        )
        elif isinstance(event, engine_events.NonFatalError | engine_events.FatalError):
            failures.append(f"engine error: {event!r}")
        elif isinstance(event, engine_events.EngineFinished):
            finished = event
    assert finished is not None
    return finished, {
        "statuses": statuses,
        "transitions": transitions,
        "failures": failures,
        "recreated": recreated,
    }


@pytest.mark.slow
async def test_schemathesis_finds_nothing_outside_the_schema(fuzzed: Server) -> None:
    started = time.monotonic()
    finished, seen = await asyncio.to_thread(fuzz, fuzzed)
    elapsed = time.monotonic() - started
    statuses: collections.Counter[tuple[str, int]] = seen["statuses"]
    transitions: collections.Counter[str] = seen["transitions"]
    print(
        f"schemathesis ({fuzzed.base_url}): {sum(statuses.values())} requests in {elapsed:.1f} s, "
        f"{sum(transitions.values())} link transitions, statuses {dict(sorted(statuses.items()))}, "
        f"sessions re-created after a delete: {len(seen['recreated'])}"
    )
    assert not seen["failures"], "\n".join(sorted(set(seen["failures"])))
    assert not finished.failures
    assert finished.stop_reason.value == "completed"
    assert not [key for key in statuses if key[1] >= 500]
    # the fuzzing reached the service, not only its validation: runs started and were followed
    assert statuses[("POST", 200)] > 10
    assert any("GetRun" in name or "FollowEvents" in name for name in transitions), transitions
    assert any("AnswerConfirmation" in name for name in transitions), transitions
    assert any("CancelRun" in name for name in transitions), transitions
    # and left nothing behind
    async with fuzzed.client() as client:
        await wait_idle(client, headers=auth("alice"))
    assert '"level": "error"' not in fuzzed.log()


async def test_the_document_declares_problems_links_and_auth(server: Server) -> None:
    async with server.client() as client:
        document = (await client.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert list(response["content"]) == [PROBLEM], (method, path, status)
                    schema = response["content"][PROBLEM]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Problem"}
            if path.startswith(("/v1/", "/external-events")):
                assert "401" in operation["responses"], (method, path)
                assert operation["security"] == [{"bearer": []}]
    start = document["paths"]["/v1/sessions/{session_id}/runs"]["post"]["responses"]
    assert {"GetRun", "FollowEvents", "CancelRun", "AnswerConfirmation"} <= set(
        start["202"]["links"]
    )
    assert start["429"]["headers"]["Retry-After"]["required"] is True
    events = document["paths"]["/v1/runs/{run_id}/events"]["get"]["responses"]["200"]
    assert list(events["content"]) == ["text/event-stream"]


# --- hand-picked bad requests -------------------------------------------------------------------

JSON = {"content-type": "application/json"}


def deep(levels: int) -> bytes:
    return b'{"input": "x", "metadata": ' + b'{"a": ' * levels + b"1" + b"}" * levels + b"}"


BAD_RUN_BODIES: list[tuple[str, bytes, dict[str, str]]] = [
    ("truncated JSON", b'{"input": "hel', JSON),
    ("two documents", b'{"input": "a"}{"input": "b"}', JSON),
    ("not UTF-8", b'{"input": "\xff\xfe\xfa"}', JSON),
    ("a JSON string", b'"hello"', JSON),
    ("a JSON array", b'[{"input": "x"}]', JSON),
    ("null", b"null", JSON),
    ("empty object", b"{}", JSON),
    ("input is a number", b'{"input": 5}', JSON),
    ("input is null", b'{"input": null}', JSON),
    ("stream is a string", b'{"input": "x", "stream": "yes"}', JSON),
    ("stream is 0", b'{"input": "x", "stream": 0}', JSON),
    ("background is 1", b'{"input": "x", "background": 1}', JSON),
    ("max_iterations is a string", b'{"input": "x", "max_iterations": "3"}', JSON),
    ("max_iterations is a fraction", b'{"input": "x", "max_iterations": 2.5}', JSON),
    ("max_iterations is 0", b'{"input": "x", "max_iterations": 0}', JSON),
    ("max_iterations is true", b'{"input": "x", "max_iterations": true}', JSON),
    ("run_timeout is NaN", b'{"input": "x", "run_timeout": NaN}', JSON),
    ("run_timeout is Infinity", b'{"input": "x", "run_timeout": Infinity}', JSON),
    ("run_timeout is negative", b'{"input": "x", "run_timeout": -1}', JSON),
    ("run_timeout is 1e999", b'{"input": "x", "run_timeout": 1e999}', JSON),
    ("a 5000-digit number", b'{"input": "x", "max_iterations": ' + b"9" * 5000 + b"}", JSON),
    ("on_disconnect unknown", b'{"input": "x", "on_disconnect": "explode"}', JSON),
    (
        "response_format strict is 0",
        b'{"input": "x", "response_format": {"type": "json_schema",'
        b' "json_schema": {"schema": {}, "strict": 0}}}',
        JSON,
    ),
    ("branch_from is null", b'{"input": "x", "branch_from": null}', JSON),
    ("branch_from beside replaces", b'{"input": "x", "branch_from": "a", "replaces": "b"}', JSON),
    ("metadata is a list", b'{"input": "x", "metadata": [1]}', JSON),
    ("unknown field", b'{"input": "x", "inputs": "y"}', JSON),
    ("lone surrogate in input", b'{"input": "a\\ud800b"}', JSON),
    ("lone surrogate in a metadata key", b'{"input": "a", "metadata": {"\\udfff": 1}}', JSON),
    ("nested past the parser's limit", deep(5000), JSON),
    ("text/plain", b'{"input": "x"}', {"content-type": "text/plain"}),
    ("form-encoded", b"input=x", {"content-type": "application/x-www-form-urlencoded"}),
]


@pytest.mark.parametrize(
    ("body", "headers"),
    [pytest.param(body, headers, id=name) for name, body, headers in BAD_RUN_BODIES],
)
async def test_a_bad_run_body_is_a_validation_problem(
    server: Server, body: bytes, headers: dict[str, str]
) -> None:
    async with server.client(headers=auth("alice")) as client:
        response = await client.post("/v1/sessions/bad-body/runs", content=body, headers=headers)
        problem = assert_problem(response, 422, "validation_error")
        assert problem["errors"], problem
        # nothing of the request is echoed: pydantic's "input" is dropped
        assert all(set(error) == {"loc", "msg", "type"} for error in problem["errors"])
        # the session was not left busy
        assert (await client.get("/v1/sessions/bad-body")).status_code in (200, 404)


BAD_EVENT_BODIES: list[tuple[str, bytes]] = [
    ("truncated JSON", b'{"session_id": "s", '),
    ("not UTF-8", b'{"session_id": "\xc3\x28"}'),
    ("missing name", b'{"session_id": "s", "payload": {}}'),
    ("empty name", b'{"session_id": "s", "name": "", "payload": {}}'),
    ("blank name", b'{"session_id": "s", "name": "  ", "payload": {}}'),
    ("payload is a list", b'{"session_id": "s", "name": "n", "payload": []}'),
    ("payload is a string", b'{"session_id": "s", "name": "n", "payload": "yes"}'),
    ("session id with a slash", b'{"session_id": "a/b", "name": "n", "payload": {}}'),
    ("session id with NUL", b'{"session_id": "a\\u0000b", "name": "n", "payload": {}}'),
    ("session id too long", b'{"session_id": "' + b"s" * 129 + b'", "name": "n"}'),
    ("run id too long", b'{"session_id": "s", "run_id": "' + b"r" * 129 + b'", "name": "n"}'),
    ("run id is a number", b'{"session_id": "s", "run_id": 7, "name": "n"}'),
    ("lone surrogate in payload", b'{"session_id": "s", "name": "n", "payload": {"a": "\\ud834"}}'),
    ("unknown field", b'{"session_id": "s", "name": "n", "extra": 1}'),
]


@pytest.mark.parametrize("body", [pytest.param(body, id=name) for name, body in BAD_EVENT_BODIES])
async def test_a_bad_external_event_is_a_validation_problem(server: Server, body: bytes) -> None:
    async with server.client(headers=auth("alice")) as client:
        response = await client.post("/external-events", content=body, headers=JSON)
        assert_problem(response, 422, "validation_error")


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("POST", "/v1/sessions/" + "s" * 129 + "/runs", 422, "validation_error"),
        ("POST", "/v1/sessions/a%20b/runs", 422, "validation_error"),
        ("POST", "/v1/sessions/%C3%A9t%C3%A9/runs", 422, "validation_error"),
        ("POST", "/v1/sessions/a%00b/runs", 422, "validation_error"),
        ("POST", "/v1/sessions/a%2Fb/runs", 404, "not_found"),
        ("POST", "/v1/sessions//runs", 404, "not_found"),
        ("GET", "/v1/sessions/a%00b", 422, "validation_error"),
        ("GET", "/v1/sessions/" + "s" * 129 + "/messages", 422, "validation_error"),
        ("DELETE", "/v1/sessions/%E2%80%A8", 422, "validation_error"),
        ("GET", "/v1/runs/run_00000000000000000000000000000000", 404, "not_found"),
        ("GET", "/v1/runs/run%00x", 404, "not_found"),
        ("GET", "/v1/runs/" + "r" * 5000, 404, "not_found"),
        ("GET", "/v1/runs/..%2F..%2Fetc%2Fpasswd", 404, "not_found"),
        ("GET", "/v1/runs/%F0%9F%98%80/events", 404, "not_found"),
        ("POST", "/v1/runs/run_unknown/cancel", 404, "not_found"),
        ("POST", "/v1/runs/%00/cancel", 404, "not_found"),
        ("GET", "/v1/runs/run_x/events?after=-1", 422, "validation_error"),
        ("GET", "/v1/runs/run_x/events?after=abc", 422, "validation_error"),
        ("PUT", "/v1/runs/run_x", 405, "method_not_allowed"),
        ("GET", "/external-events", 405, "method_not_allowed"),
        ("GET", "/v2/anything", 404, "not_found"),
    ],
)
async def test_bad_ids_and_paths_are_problems(
    server: Server, method: str, path: str, status: int, code: str
) -> None:
    async with server.client(headers=auth("alice")) as client:
        response = await client.request(method, path)
        assert_problem(response, status, code)
        if status == 405:
            # every method the path takes, not only the first route's (GET and DELETE here)
            allowed = {item.strip() for item in response.headers["allow"].split(",")}
            assert method not in allowed
            assert allowed == ALLOWED[path]


ALLOWED = {
    "/v1/runs/run_x": {"GET"},
    "/external-events": {"POST"},
    "/v1/sessions/s": {"GET", "DELETE"},
}


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "١٢", "+3", "1_000", "9" * 40])
async def test_a_bad_last_event_id_is_a_validation_problem(server: Server, value: str) -> None:
    async with server.client(headers=auth("alice")) as client:
        _, response = await read_events(
            client, "POST", "/v1/sessions/lei/runs", json={"input": "hi"}
        )
        run_id = response.headers["x-run-id"]
        response = await client.get(
            f"/v1/runs/{run_id}/events", headers={b"Last-Event-ID": value.encode()}
        )
        assert_problem(response, 422, "validation_error")


async def raw_request(server: Server, head: bytes, body: list[bytes]) -> tuple[int, bytes]:
    """Send ``head`` and then the body pieces on a raw connection, stopping as soon as the
    server answers; the status and the answer's bytes."""
    host, port = server.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        answer = asyncio.ensure_future(reader.read(65536))
        for piece in body:
            if answer.done():
                break
            writer.write(piece)
            try:
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0)
        data = await asyncio.wait_for(answer, 10)
        while b"}" not in data.partition(b"\r\n\r\n")[2]:  # the whole problem object
            more = await asyncio.wait_for(reader.read(65536), 10)
            if not more:
                break
            data += more
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data


def head(path: str, *headers: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: {auth('alice')['Authorization']}",
    ]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode()


@pytest.mark.parametrize("path", ["/v1/sessions/huge/runs", "/external-events"])
async def test_a_huge_declared_body_is_refused_before_it_is_read(server: Server, path: str) -> None:
    # a terabyte announced, nothing sent: the answer comes at once, not after a read
    status, data = await raw_request(
        server, head(path, "Content-Type: application/json", f"Content-Length: {10**12}"), []
    )
    assert status == 413
    assert b"application/problem+json" in data
    assert b'"code":"payload_too_large"' in data


@pytest.mark.parametrize("path", ["/v1/sessions/huge/runs", "/external-events"])
async def test_a_huge_chunked_body_is_refused_as_it_arrives(server: Server, path: str) -> None:
    # no length: counted as it arrives, refused once past the limit, without reading the rest
    piece = b'{"input": "' + b"x" * 8192
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    filler = b"y" * 8192
    more = f"{len(filler):x}\r\n".encode() + filler + b"\r\n"
    status, data = await raw_request(
        server,
        head(path, "Content-Type: application/json", "Transfer-Encoding: chunked"),
        [chunk, *[more] * (4 * MAX_BODY // len(filler))],
    )
    assert status == 413
    assert b'"code":"payload_too_large"' in data


async def test_a_body_just_over_the_limit_is_refused_and_one_at_it_accepted(
    server: Server,
) -> None:
    async with server.client(headers=auth("alice")) as client:
        prefix = b'{"input": "'
        suffix = b'", "stream": false}'
        filler = MAX_BODY - len(prefix) - len(suffix)
        fits = prefix + b"x" * filler + suffix
        assert len(fits) == MAX_BODY
        response = await client.post("/v1/sessions/limit/runs", content=fits, headers=JSON)
        assert response.status_code == 200, response.text[:300]
        over = prefix + b"x" * (filler + 1) + suffix
        response = await client.post("/v1/sessions/limit/runs", content=over, headers=JSON)
        assert_problem(response, 413, "payload_too_large")

        async def chunks() -> Any:
            yield over[: len(over) // 2]
            yield over[len(over) // 2 :]

        response = await client.post("/v1/sessions/limit/runs", content=chunks(), headers=JSON)
        assert_problem(response, 413, "payload_too_large")


async def test_nul_in_text_is_refused_not_stored(server: Server) -> None:
    # PostgreSQL cannot store NUL: every backend refuses it alike (test_bad_values.py)
    async with server.client(headers=auth("alice")) as client:
        for body in ({"input": "nul\x00inside"}, {"input": "x", "metadata": {"k\x00": "v"}}):
            response = await client.post("/v1/sessions/nul/runs", json={**body, "stream": False})
            assert_problem(response, 422, "validation_error")
        assert (await client.get("/v1/sessions/nul")).status_code == 404


async def test_the_server_is_still_healthy_and_idle(server: Server) -> None:
    async with server.client() as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        body = await wait_idle(client, headers=auth("alice"))
        assert body["locks"] == 0
        assert (await state(client, headers=auth("alice")))["runs"] == 0
    assert "Traceback" not in server.log()
