"""RFC 9457 problem answers of a server."""

from __future__ import annotations

from typing import Any

import httpx

PROBLEM = "application/problem+json"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem with this status and code; its body."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert isinstance(body["detail"], str) and body["detail"]
    assert {"type", "title"} <= body.keys()
    return body
