"""The MCP client against real MCP servers: over stdio (a subprocess) and streamable HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import mcp_types
import pytest

from agent_runtime import AgentCore, AgentRunContext, LoopAffinityError, ToolCall
from agent_runtime.content import DocumentPart, MemoryContentStore, part_to_dict
from agent_runtime.errors import ConfigurationError
from agent_runtime.mcp import (
    MCPClient,
    MCPClientStateError,
    MCPServerConfig,
    MCPServerError,
    MCPToolError,
    mcp_tool_name,
)
from agent_runtime.mcp.client import _render, _value
from agent_runtime.messages import AssistantMessage, ToolMessage
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.fakes.mcp_servers import HttpServerProcess, stdio_command
from tests.support.content_samples import PDF, PNG
from tests.support.waiting import wait_for

FAKE_TOOLS = [
    "add",
    "die",
    "echo_text",
    "fail",
    "hang",
    "open_gate",
    "picture",
    "pieces",
    "stats",
    "work",
]


@pytest.fixture(scope="module")
def http_server() -> Iterator[HttpServerProcess]:
    """One HTTP server shared by the tests that do not count what it saw."""
    server = HttpServerProcess()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fresh_http_server() -> Iterator[HttpServerProcess]:
    """A server of the test's own: its counters start at zero and the test may kill it."""
    server = HttpServerProcess()
    try:
        yield server
    finally:
        server.close()


def stdio_server(name: str = "st", **options: Any) -> MCPServerConfig:
    command, args, cwd = stdio_command()
    return MCPServerConfig.stdio(name, command, args, cwd=cwd, **options)


def tool_results(model: ScriptedModel) -> list[ToolMessage]:
    return [m for m in model.requests[-1].messages if isinstance(m, ToolMessage)]


async def server_stats(client: MCPClient, tool: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await client.call_tool(tool))
    return data


async def wait_for_stats(
    client: MCPClient, tool: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Poll the server's own counters until they show the state the test waits for."""

    async def shown() -> dict[str, Any] | None:
        stats = await server_stats(client, tool)
        return stats if predicate(stats) else None

    found: dict[str, Any] = await wait_for(shown, within=20)
    return found


# configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name", "command": "x"}, "must start with a letter"),
        ({"name": "a__b", "command": "x"}, "single '_'"),
        ({"name": "_a", "command": "x"}, "must start with a letter"),
        ({"name": "s"}, "stdio needs a command"),
        ({"name": "s", "command": "x", "url": "http://h/mcp"}, "belong to streamable_http"),
        ({"name": "s", "transport": "streamable_http"}, "needs an http"),
        ({"name": "s", "transport": "http", "url": "h", "command": "x"}, "needs an http"),
        ({"name": "s", "url": "http://h/mcp", "transport": "http", "cwd": "/"}, "belong to stdio"),
        ({"name": "s", "transport": "ws", "url": "ws://h"}, "transport must be"),
        ({"name": "s", "command": "x", "timeout": 0}, "timeout must be positive"),
        ({"name": "s", "command": "x", "session_pool_size": -1}, "session_pool_size"),
        ({"name": "s", "command": "x", "session_pool_size": True}, "session_pool_size"),
    ],
)
def test_bad_server_configs_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        MCPServerConfig(**kwargs)


def test_config_from_a_mapping_and_its_repr_hides_secrets() -> None:
    config = MCPServerConfig.from_dict(
        {
            "name": "web",
            "url": "https://example.test/mcp",
            "headers": {"Authorization": "Bearer s3cret"},
            "session_pool_size": 4,
            "timeout": 5,
        }
    )
    assert config.transport == "streamable_http"
    assert config.headers == {"Authorization": "Bearer s3cret"}
    assert (config.session_pool_size, config.timeout) == (4, 5)
    assert "s3cret" not in repr(config)
    assert "Authorization" in repr(config)
    local = MCPServerConfig.from_dict(
        {"name": "fs", "command": "srv", "args": ["--root", "/"], "env": {"TOKEN": "t0ken"}}
    )
    assert (local.transport, local.args) == ("stdio", ("--root", "/"))
    assert "t0ken" not in repr(local)
    alias = MCPServerConfig("h", "streamable-http", url="http://h/mcp")  # type: ignore[arg-type]
    assert alias.transport == "streamable_http"
    with pytest.raises(ConfigurationError, match="unknown MCP server setting"):
        MCPServerConfig.from_dict({"name": "x", "command": "c", "comand": "typo"})
    with pytest.raises(ConfigurationError, match="needs a name"):
        MCPServerConfig.from_dict({"command": "c"})
    with pytest.raises(ConfigurationError, match="unique"):
        MCPClient([local, local])


def test_advertised_names_fit_the_model_apis() -> None:
    assert mcp_tool_name("fs", "read_file") == "fs__read_file"
    assert mcp_tool_name("fs", "files/read.v2") == "fs__files_read_v2"
    long_a = mcp_tool_name("server", "x" * 80 + "a")
    long_b = mcp_tool_name("server", "x" * 80 + "b")
    for name in (long_a, long_b):
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name)
    assert long_a != long_b


def test_results_render_as_text() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="one"),
            mcp_types.ImageContent(data="AAAA", mime_type="image/png"),
            mcp_types.EmbeddedResource(
                resource=mcp_types.TextResourceContents(uri="file:///a.txt", text="inside")
            ),
            mcp_types.ResourceLink(uri="file:///b.txt", name="b"),
        ]
    )
    assert _render(result) == "one\n[image: image/png]\ninside\n[resource: file:///b.txt]"
    structured = mcp_types.CallToolResult(content=[], structured_content={"n": 1})
    assert _render(structured) == '{"n": 1}'


# stdio ------------------------------------------------------------------------------------------


async def test_stdio_discovery_calls_errors_and_a_server_that_dies() -> None:
    client = MCPClient([stdio_server()])
    with pytest.raises(MCPClientStateError, match="start"):
        client.tools()
    await client.start()
    try:
        tools = {t.name: t for t in client.tools()}
        assert sorted(tools) == [f"st__{name}" for name in FAKE_TOOLS]
        add = tools["st__add"]
        # the server's schema goes to the model as it is
        assert add.parameters["type"] == "object"
        assert add.parameters["required"] == ["a", "b"]
        assert add.description == "Add two integers."
        assert add.validate({"a": "not checked here"}) == {"a": "not checked here"}
        assert await add.function(a=1, b=2) == "3"
        with pytest.raises(MCPToolError, match="no such file"):
            await tools["st__fail"].function(reason="no such file")
        with pytest.raises(MCPServerError, match="closed the connection during 'die'"):
            await tools["st__die"].function()
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
    finally:
        await client.close()
    with pytest.raises(MCPClientStateError, match="closed"):
        await client.call_tool("st__add", {"a": 1, "b": 2})


async def test_a_pooled_stdio_session_whose_server_died_is_replaced() -> None:
    client = MCPClient([stdio_server(session_pool_size=1)])
    model = ScriptedModel(
        [
            tool_call_turn("st__stats", call_id="before"),
            tool_call_turn("st__die", call_id="crash"),
            tool_call_turn("st__stats", call_id="after"),
            "recovered",
        ]
    )
    agent = await AgentCore.create(model, mcp_client=client)
    try:
        response = await agent.chat("crash the server")
    finally:
        await agent.aclose()
        await client.close()
    assert response.content == "recovered"
    model.assert_consumed()
    before, crash, after = tool_results(model)
    assert not before.is_error and not after.is_error
    assert crash.is_error and "closed the connection" in crash.content
    # the first session served discovery and the first call; the crash forced a new process
    assert json.loads(before.content)["pid"] != json.loads(after.content)["pid"]
    assert json.loads(before.content)["calls"] == {"stats": 1}


# streamable HTTP --------------------------------------------------------------------------------


async def test_a_run_calls_an_mcp_tool_through_the_agent(http_server: HttpServerProcess) -> None:
    client = MCPClient([MCPServerConfig.streamable_http("web", http_server.url)])
    model = ScriptedModel(
        [
            AssistantMessage(
                None,
                [
                    ToolCall("c1", "web__add", {"a": 2, "b": 3}),
                    ToolCall("c2", "web__pieces", {}),
                    ToolCall("c3", "web__echo_text", {"text": "héllo"}),
                ],
            ),
            "done",
        ]
    )
    agent = await AgentCore.create(model, mcp_client=client)
    try:
        events = [event async for event in agent.stream("use the tools")]
    finally:
        await agent.aclose()
    # the agent does not own the client: it is still usable after aclose
    assert await client.call_tool("web__add", {"a": 1, "b": 1}) == "2"
    await client.close()
    model.assert_consumed()
    assert sorted(spec.name for spec in model.requests[0].tools) == [
        f"web__{n}" for n in FAKE_TOOLS
    ]
    assert [m.content for m in tool_results(model)] == ["5", "first\nsecond", "héllo"]
    completed = [e for e in events if e.type == "tool.call.completed"]
    assert (completed[0].name, completed[0].result) == ("web__add", "5")
    assert events[-1].type == "run.completed"


async def test_an_image_a_tool_returns_reaches_the_model_as_an_image(
    http_server: HttpServerProcess,
) -> None:
    store = MemoryContentStore()
    model = ScriptedModel([tool_call_turn("web__picture", call_id="c1"), "A pixel."])
    async with MCPClient([MCPServerConfig.streamable_http("web", http_server.url)]) as client:
        agent = await AgentCore.create(model, mcp_client=client, content_store=store)
        try:
            events = [event async for event in agent.stream("show me")]
        finally:
            await agent.aclose()
        # the client's own call answers text, as it always did
        assert await client.call_tool("web__picture") == "a black pixel\n[image: image/png]"
    [result] = tool_results(model)
    assert result.content == "a black pixel"
    [image] = result.parts
    assert (image.kind, image.media_type, image.size, image.data) == (
        "image",
        "image/png",
        len(PNG),
        None,
    )
    assert await store.get(image.ref or "") == PNG
    completed = next(e for e in events if e.type == "tool.call.completed")
    assert completed.result == ["a black pixel", part_to_dict(image)]
    assert base64.b64encode(PNG).decode("ascii") not in json.dumps(completed.data())


async def test_an_embedded_pdf_is_a_document_and_an_unknown_blob_a_line() -> None:
    blob = base64.b64encode(PDF).decode("ascii")
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.EmbeddedResource(
                resource=mcp_types.BlobResourceContents(
                    uri="file:///docs/paper.pdf", mime_type="application/pdf", blob=blob
                )
            ),
            mcp_types.EmbeddedResource(
                resource=mcp_types.BlobResourceContents(
                    uri="file:///x.bin", mime_type="application/zip", blob="AAAA"
                )
            ),
            mcp_types.ImageContent(data="not base64!", mime_type="image/png"),
        ]
    )
    value = await _value(result)
    assert value == [
        DocumentPart(media_type="application/pdf", data=PDF, filename="paper.pdf"),
        "[resource: file:///x.bin]",
        "[image: image/png, not valid base64]",
    ]


async def test_allowed_tools_limit_what_is_offered(http_server: HttpServerProcess) -> None:
    config = MCPServerConfig.streamable_http("web", http_server.url, allowed_tools=["add"])
    async with MCPClient([config]) as client:
        assert [t.name for t in client.tools()] == ["web__add"]
        with pytest.raises(MCPClientStateError, match="no MCP tool named 'web__fail'"):
            await client.call_tool("web__fail", {"reason": "x"})


async def test_idempotent_tools_are_flagged_for_a_resumed_run(
    http_server: HttpServerProcess,
) -> None:
    config = MCPServerConfig.streamable_http("web", http_server.url, idempotent_tools=["add"])
    async with MCPClient([config]) as client:
        flags = {t.name: t.idempotent for t in client.tools()}
    assert flags["web__add"] is True
    assert not any(flag for name, flag in flags.items() if name != "web__add")
    with pytest.raises(ConfigurationError, match="not among its allowed_tools"):
        MCPServerConfig.streamable_http(
            "web", http_server.url, allowed_tools=["echo_text"], idempotent_tools=["add"]
        )


async def test_the_ask_policy_applies_to_mcp_tools(http_server: HttpServerProcess) -> None:
    client = MCPClient([MCPServerConfig.streamable_http("web", http_server.url)])
    asked: list[tuple[str, dict[str, Any]]] = []

    def approve(context: AgentRunContext, call: ToolCall) -> bool:
        asked.append((call.name, call.arguments))
        return call.arguments.get("text") == "yes"

    model = ScriptedModel(
        [
            AssistantMessage(
                None,
                [
                    ToolCall("c1", "web__echo_text", {"text": "yes"}),
                    ToolCall("c2", "web__echo_text", {"text": "no"}),
                ],
            ),
            "done",
        ]
    )
    agent = await AgentCore.create(
        model, mcp_client=client, tool_policies={"web__*": "ask"}, permission_callback=approve
    )
    try:
        before = (await server_stats(client, "web__stats"))["calls"].get("echo.text", 0)
        await agent.chat("echo twice")
        after = (await server_stats(client, "web__stats"))["calls"].get("echo.text", 0)
    finally:
        await agent.aclose()
        await client.close()
    assert asked == [("web__echo_text", {"text": "yes"}), ("web__echo_text", {"text": "no"})]
    approved, denied = tool_results(model)
    assert (approved.content, approved.is_error) == ("yes", False)
    assert denied.is_error and "denied" in denied.content
    assert after - before == 1  # the denied call never reached the server


async def test_a_pool_of_two_serves_ten_concurrent_calls(
    fresh_http_server: HttpServerProcess,
) -> None:
    url = fresh_http_server.url
    side = MCPClient([MCPServerConfig.streamable_http("side", url)], client_name="side-channel")
    pooled = MCPClient(
        [MCPServerConfig.streamable_http("web", url, session_pool_size=2)],
        client_name="pool-under-test",
    )
    await side.start()
    await pooled.start()
    try:
        calls = [
            asyncio.create_task(pooled.call_tool("web__work", {"tag": str(i)})) for i in range(10)
        ]
        held = await wait_for_stats(side, "side__stats", lambda s: s["in_flight"] == 2)
        assert held["calls"]["work"] == 2  # the other eight wait for an idle session
        assert not any(task.done() for task in calls)
        assert pooled.pool_size("web") == 2
        await side.call_tool("side__open_gate")
        results = await asyncio.gather(*calls)
        stats = await server_stats(side, "side__stats")
    finally:
        await pooled.close()
        await side.close()
    assert sorted(results) == sorted(f"done {i}" for i in range(10))
    assert stats["calls"]["work"] == 10
    assert stats["max_in_flight"] == 2
    # discovery opened the first session, the load a second one; no more
    assert stats["handshakes"]["pool-under-test"] == 2
    assert pooled.pool_size("web") == 0


@pytest.mark.parametrize("pool", [0, 1])
async def test_an_http_server_shut_down_mid_call_is_a_tool_error(
    fresh_http_server: HttpServerProcess, pool: int
) -> None:
    url = fresh_http_server.url
    side = MCPClient([MCPServerConfig.streamable_http("side", url)])
    client = MCPClient(
        [MCPServerConfig.streamable_http("web", url, timeout=30, session_pool_size=pool)]
    )
    model = ScriptedModel(
        [
            tool_call_turn("web__hang", call_id="hung"),
            tool_call_turn("web__add", {"a": 1, "b": 1}, call_id="later"),
            "carried on",
        ]
    )
    await side.start()
    agent = await AgentCore.create(model, mcp_client=client)
    loop = asyncio.get_running_loop()
    try:
        run = asyncio.create_task(agent.chat("hang"))
        await wait_for_stats(side, "side__stats", lambda s: s["in_flight"] == 1)
        killed_at = loop.time()
        fresh_http_server.kill()
        response = await run
        elapsed = loop.time() - killed_at
    finally:
        await agent.aclose()
        await client.close()
        await side.close()
    assert response.content == "carried on"
    hung, later = tool_results(model)
    assert hung.is_error and "MCPServerError" in hung.content
    assert later.is_error and "MCPServerError" in later.content
    assert elapsed < 10  # far below the 30 s call timeout: the failure was seen, not waited out


@pytest.mark.parametrize("pool", [0, 1])
async def test_calls_are_bounded_by_the_server_and_tool_timeouts(
    http_server: HttpServerProcess, pool: int
) -> None:
    # long enough for the listing on a loaded machine, far below the hang
    slow = MCPServerConfig.streamable_http(
        "web", http_server.url, timeout=2.0, session_pool_size=pool
    )
    async with MCPClient([slow]) as client:
        with pytest.raises(MCPServerError, match=r"did not answer 'hang' within 2 s"):
            await client.call_tool("web__hang")
        # a timed-out pooled session is not reused; a fresh one serves the next call
        assert await client.call_tool("web__add", {"a": 2, "b": 2}) == "4"

    patient = MCPServerConfig.streamable_http("web", http_server.url, session_pool_size=pool)
    client = MCPClient([patient])
    model = ScriptedModel([tool_call_turn("web__hang"), "gave up"])
    agent = await AgentCore.create(model, mcp_client=client, tool_timeout=0.3)
    try:
        response = await agent.chat("wait forever")
        assert await client.call_tool("web__add", {"a": 1, "b": 2}) == "3"
    finally:
        await agent.aclose()
        await client.close()
    assert response.content == "gave up"
    (result,) = tool_results(model)
    assert result.is_error and "timed out after 0.3 s" in result.content


async def test_close_stops_every_session_and_leaves_no_task(
    http_server: HttpServerProcess,
) -> None:
    before = asyncio.all_tasks()
    client = MCPClient(
        [
            stdio_server(session_pool_size=1),
            MCPServerConfig.streamable_http("web", http_server.url, session_pool_size=2),
        ]
    )
    await client.start()
    pid = (await server_stats(client, "st__stats"))["pid"]
    results = await asyncio.gather(
        *(client.call_tool("web__add", {"a": i, "b": 1}) for i in range(4))
    )
    assert results == ["1", "2", "3", "4"]
    hangs = (await server_stats(client, "web__stats"))["calls"].get("hang", 0)
    hanging = asyncio.create_task(client.call_tool("web__hang"))
    await wait_for_stats(client, "web__stats", lambda s: s["calls"].get("hang", 0) > hangs)
    assert client.pool_size("st") == 1 and client.pool_size("web") == 2

    await client.close()

    # closing the leased session ends its call at once, as an error
    with pytest.raises(MCPServerError):
        await hanging
    assert asyncio.all_tasks() - before == set()
    assert client.pool_size("st") == client.pool_size("web") == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the stdio server process has exited and was reaped
    await client.close()  # idempotent
    with pytest.raises(MCPClientStateError, match="closed"):
        await client.call_tool("web__add", {"a": 1, "b": 1})
    with pytest.raises(MCPClientStateError, match="closed"):
        await client.start()


async def test_the_client_belongs_to_the_loop_that_started_it(
    http_server: HttpServerProcess,
) -> None:
    client = MCPClient([MCPServerConfig.streamable_http("web", http_server.url)])
    await client.start()
    add = next(t for t in client.tools() if t.name == "web__add")

    def on_another_loop() -> None:
        asyncio.run(add.function(a=1, b=2))

    try:
        with pytest.raises(LoopAffinityError) as caught:
            await asyncio.to_thread(on_another_loop)
        assert caught.value.owner_loop is asyncio.get_running_loop()
        with pytest.raises(LoopAffinityError):
            await asyncio.to_thread(lambda: asyncio.run(client.close()))
    finally:
        await client.close()


async def test_an_unreachable_server_fails_start_and_create() -> None:
    down = MCPServerConfig.streamable_http("down", "http://127.0.0.1:9/mcp", timeout=5)
    with pytest.raises(MCPServerError, match="'down' could not be reached"):
        await MCPClient([down]).start()
    missing = MCPServerConfig.stdio("gone", "/nonexistent/mcp-server", timeout=5)
    client = MCPClient([missing])
    with pytest.raises(MCPServerError, match="'gone' could not be reached"):
        await AgentCore.create(ScriptedModel([]), mcp_client=client)
    assert not client.started
    await client.close()
