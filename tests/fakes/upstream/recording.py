"""The record of one request, as the fake upstream received it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from .. import capability_wire

__all__ = ["Protocol", "RecordedRequest"]

Protocol: TypeAlias = Literal["openai", "anthropic", "responses"]


@dataclass
class RecordedRequest:
    """One request as the server received it. Header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    outcome: str = "pending"
    #: the input tokens the server's prompt cache accounting counted (None without one)
    counted_input: int | None = None

    @property
    def json(self) -> Any:
        """The decoded JSON body (None if it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def protocol(self) -> Protocol | None:
        """Which API the path belongs to."""
        if self.path.endswith("/chat/completions"):
            return "openai"
        if self.path.endswith("/messages"):
            return "anthropic"
        if self.path.endswith("/responses"):
            return "responses"
        return None

    @property
    def model(self) -> str | None:
        """The ``model`` field of the body (JSON or multipart form)."""
        body = self.json
        if isinstance(body, dict):
            return body.get("model")
        found = self.form.get("model")
        return found if isinstance(found, str) else None

    @property
    def form(self) -> dict[str, bytes | str]:
        """The fields of a multipart body (files as bytes), else empty."""
        return capability_wire.multipart(self)

    @property
    def api_key(self) -> str | None:
        """The credential sent: ``x-api-key``, else the bearer token of ``authorization``."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    @property
    def messages(self) -> list[Any]:
        """The ``messages`` field of the body."""
        body = self.json
        return list(body.get("messages") or []) if isinstance(body, dict) else []

    @property
    def input(self) -> list[Any]:
        """The ``input`` items of a Responses request (a string input is one user message)."""
        body = self.json
        if not isinstance(body, dict):
            return []
        items = body.get("input")
        if isinstance(items, str):
            return [{"role": "user", "content": items}]
        return list(items or [])

    @property
    def stream(self) -> bool:
        """True if the client asked for a stream."""
        body = self.json
        return bool(body.get("stream")) if isinstance(body, dict) else False
