"""A header value the HTTP parser refuses (a control character such as DEL) is answered 400
problem+json naming the header, over a real connection: never uvicorn's plain text."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from tests.support.server import Server


def _exchange(server: Server, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes after a 400
            answer += chunk
    return answer


@pytest.mark.parametrize(
    ("method", "path", "header"),
    [
        ("POST", "/v1/sessions/s/runs", "Idempotency-Key"),
        ("GET", "/v1/runs/run_0/events", "Last-Event-ID"),
        ("GET", "/healthz", "traceparent"),
    ],
)
async def test_a_control_character_in_a_header_is_a_problem(
    server: Server, method: str, path: str, header: str
) -> None:
    body = b'{"input": "hi", "stream": false}'
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{header}: ab\x7fcd\r\n\r\n"
    ).encode("latin-1") + body
    answer = await asyncio.to_thread(_exchange, server, request)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"content-type: application/problem+json" in head.lower()
    problem = json.loads(payload)
    assert (problem["status"], problem["code"], problem["header"]) == (
        400,
        "invalid_header",
        header.lower(),
    )
    assert header in problem["detail"]


async def test_an_unparsable_request_is_a_problem(server: Server) -> None:
    answer = await asyncio.to_thread(_exchange, server, b"NOT HTTP AT ALL\r\n\r\n")
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert json.loads(payload)["code"] == "bad_request"
