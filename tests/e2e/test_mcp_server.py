"""``/mcp``, driven by the ``mcp`` SDK's own streamable-HTTP client against a real server.

List tools, call one (its text deltas arrive as progress notifications), continue a session,
answer a confirmation through elicitation, and the fallback for hosts without elicitation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.server import Server, launch

KEY = "sk-mcp-test"


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(tmp_path_factory.mktemp("mcp-server"), {"AGENT_API_KEYS": f"{KEY}=alice"})
    yield server
    server.stop()


@asynccontextmanager
async def connect(server: Server, key: str = KEY, **options: Any) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0)
    transport = streamable_http_client(f"{server.base_url}/mcp", http_client=http)
    async with http, Client(transport, **options) as client:
        yield client


def text_of(result: mcp_types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))


async def test_list_and_call_with_progress(mcp_server: Server) -> None:
    async with connect(mcp_server) as client:
        tools = await client.list_tools()
        assert [t.name for t in tools.tools] == ["default"]
        assert tools.tools[0].input_schema["properties"]["input"]["type"] == "string"
        seen: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, message))

        result = await client.call_tool(
            "default", {"input": "hello tools"}, progress_callback=on_progress
        )
    assert not result.is_error
    assert text_of(result) == "You said: hello tools"
    assert "".join(m or "" for _, m in seen) == "You said: hello tools"
    assert [v for v, _ in seen] == sorted(v for v, _ in seen)
    structured = result.structured_content or {}
    assert structured["status"] == "completed"
    assert structured["session_id"].startswith("mcp_")


async def test_session_continues(mcp_server: Server) -> None:
    async with connect(mcp_server) as client:
        first = await client.call_tool("default", {"input": "one", "session_id": "mcp-test-s1"})
        second = await client.call_tool("default", {"input": "two", "session_id": "mcp-test-s1"})
    assert (first.structured_content or {})["session_id"] == "mcp-test-s1"
    assert (second.structured_content or {})["session_id"] == "mcp-test-s1"
    async with httpx2.AsyncClient(
        base_url=mcp_server.base_url, headers={"Authorization": f"Bearer {KEY}"}
    ) as http:
        session = (await http.get("/v1/sessions/mcp-test-s1")).json()
    assert session["message_count"] == 4


async def test_confirmation_by_elicitation(mcp_server: Server) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"approved": True})

    async with connect(mcp_server, elicitation_callback=elicit) as client:
        result = await client.call_tool("default", {"input": "delete draft.txt"})
    assert len(asked) == 1
    assert "delete_file" in asked[0]
    assert not result.is_error
    assert "Deleted draft.txt" in text_of(result)


async def test_confirmation_without_elicitation(mcp_server: Server) -> None:
    async with connect(mcp_server) as client:
        result = await client.call_tool("default", {"input": "delete old.txt"})
        structured = result.structured_content or {}
        assert structured["status"] == "approval_required"
        assert structured["tool"] == "delete_file"
        assert "approve" in text_of(result)
        answered = await client.call_tool(
            "default", {"session_id": structured["session_id"], "approve": False}
        )
    assert "did not delete old.txt" in text_of(answered)
    assert (answered.structured_content or {})["status"] == "completed"


async def test_errors(mcp_server: Server) -> None:
    async with connect(mcp_server) as client:
        with pytest.raises(MCPError):
            await client.call_tool("nope", {"input": "hi"})
        with pytest.raises(MCPError):
            await client.call_tool("default", {"session_id": "mcp-none", "approve": True})
    async with httpx2.AsyncClient() as http:
        denied = await http.post(
            f"{mcp_server.base_url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Accept": "application/json, text/event-stream"},
        )
    assert denied.status_code == 401
    assert denied.headers["www-authenticate"].startswith("Bearer")
