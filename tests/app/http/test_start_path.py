"""The short path of POST /v1/sessions/{id}/runs answers exactly as the FastAPI route does."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from app.http.api import start_path
from app.http.api.runs import start_run
from app.http.api.start_path import RunStartMiddleware
from tests.support.served import Serve

T = TypeVar("T")

JSON = {"content-type": "application/json"}
_sessions = itertools.count()

# (name, headers, body, path): each request is sent twice, once by each path
CASES: list[tuple[str, dict[str, str], bytes, str | None]] = [
    ("stream", JSON, b'{"input": "hello"}', None),
    (
        "stream, charset",
        {"content-type": "application/json; charset=utf-8"},
        b'{"input": "hi"}',
        None,
    ),
    ("blocking", JSON, b'{"input": "hello", "stream": false}', None),
    ("background", JSON, b'{"input": "hello", "background": true}', None),
    ("unknown agent", JSON, b'{"input": "hello", "agent": "nope"}', None),
    ("unknown field", JSON, b'{"input": "hello", "nope": 1}', None),
    ("wrong type", JSON, b'{"input": 5}', None),
    ("not json", JSON, b'{"input": ', None),
    ("an array", JSON, b"[]", None),
    ("no body", JSON, b"", None),
    ("no content type", {}, b'{"input": "hello"}', None),
    ("text", {"content-type": "text/plain"}, b'{"input": "hello"}', None),
    ("bad session id", JSON, b'{"input": "hello"}', "/v1/sessions/a%20b/runs"),
    ("long session id", JSON, b'{"input": "hello"}', "/v1/sessions/" + "s" * 129 + "/runs"),
    ("idempotency key", {**JSON, "idempotency-key": "k-{n}"}, b'{"input": "hello"}', None),
    ("bad last event id", {**JSON, "last-event-id": "x"}, b'{"input": "hello"}', None),
    (
        "nested too deep",
        JSON,
        b'{"input": "x", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        None,
    ),
]


def _shape(response: httpx.Response) -> dict[str, Any]:
    """What must be the same either way (ids and times differ from run to run)."""
    kind = response.headers.get("content-type", "")
    shape: dict[str, Any] = {"status": response.status_code, "type": kind}
    if kind.startswith("text/event-stream"):
        shape["events"] = [
            line.removeprefix("event: ")
            for line in response.text.splitlines()
            if line.startswith("event: ")
        ]
    elif "json" in kind:
        data = response.json()
        if "problem" in kind:
            shape["problem"] = {key: data.get(key) for key in ("code", "title", "status")}
            shape["detail"] = str(data.get("detail", "")).replace(_session_of(response), "S")
        else:
            shape["keys"] = sorted(data)
            shape["status_field"] = data.get("status")
    shape["run_id_header"] = "x-run-id" in response.headers
    return shape


def _session_of(response: httpx.Response) -> str:
    return response.request.url.path.split("/")[3]


async def _passthrough(
    self: RunStartMiddleware, scope: Scope, receive: Receive, send: Send
) -> None:
    await self.app(scope, receive, send)


async def _each_way(monkeypatch: pytest.MonkeyPatch, send: Callable[[], Awaitable[T]]) -> list[T]:
    """``send()`` twice: through the short path, then with it stepped over (the route)."""
    answers = []
    for short in (True, False):
        with monkeypatch.context() as patch:
            if not short:
                patch.setattr(RunStartMiddleware, "__call__", _passthrough)
            answers.append(await send())
    return answers


async def _both(serve: Serve, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
    taken: list[str] = []

    async def counted(*args: Any) -> Any:
        taken.append(args[0])
        return await start_run(*args)

    monkeypatch.setattr(start_path, "start_run", counted)
    async with serve(**settings) as served:
        for name, case_headers, body, path in CASES:

            async def send(
                case_headers: dict[str, str] = case_headers,
                body: bytes = body,
                path: str | None = path,
            ) -> dict[str, Any]:
                number = next(_sessions)
                url = path or f"/v1/sessions/path-{number}/runs"
                sent = {
                    key: value.replace("{n}", str(number)) for key, value in case_headers.items()
                }
                return _shape(await served.client.post(url, content=body, headers=sent))

            answers = await _each_way(monkeypatch, send)
            assert answers[0] == answers[1], name
            await served.wait_idle()
    # the short path took the plain starts (the first five cases, once each), nothing else
    assert len(taken) == 5, taken


async def test_the_short_path_answers_as_the_route_does(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _both(serve, monkeypatch)


async def test_a_caller_the_authenticator_refuses_gets_the_routes_answer(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(api_keys="key-a=alice") as served:
        for authorization in (None, "Bearer wrong", "Basic a2V5LWE="):
            headers = {**JSON, **({"authorization": authorization} if authorization else {})}

            async def send(headers: dict[str, str] = headers) -> tuple[int, str]:
                response = await served.client.post(
                    "/v1/sessions/auth/runs", content=b'{"input": "hi"}', headers=headers
                )
                return response.status_code, response.json()["code"]

            answers = await _each_way(monkeypatch, send)
            assert answers[0] == answers[1] == (401, "unauthorized")
        allowed = await served.client.post(
            "/v1/sessions/auth/runs",
            json={"input": "hi", "stream": False},
            headers={"authorization": "Bearer key-a"},
        )
        assert allowed.status_code == 200 and allowed.json()["status"] == "completed"
        # the session exists, made by alice's allowed start, not by the refused ones
        other = await served.client.get(
            "/v1/sessions/auth", headers={"authorization": "Bearer key-a"}
        )
        assert other.status_code == 200


async def test_a_chunked_body_over_the_limit_gets_the_routes_413(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"input": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}'

    async with serve(max_body_bytes=4096) as served:

        async def send() -> tuple[int, str]:
            response = await served.client.post(
                "/v1/sessions/big/runs", content=chunks(), headers=JSON
            )
            return response.status_code, response.json()["code"]

        answers = await _each_way(monkeypatch, send)
        assert answers[0] == answers[1] == (413, "payload_too_large")
        assert (await served.client.get("/v1/sessions/big")).status_code == 404
