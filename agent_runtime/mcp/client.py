"""MCPClient: the tools of MCP servers, as ordinary runtime tools.

A tool's image content (and an embedded resource holding an image or a PDF) reaches the model
as an image or a document part of the tool's result, not as a line of text: see
``agent_runtime.tools.results``. ``call_tool`` answers the text alone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError

from ..content import DOCUMENT_MEDIA_TYPES, IMAGE_MEDIA_TYPES, DocumentPart, ImagePart, MediaPart
from ..errors import ConfigurationError, LoopAffinityError
from ..tools.base import Tool
from .config import MCPServerConfig, mcp_tool_name
from .errors import MCPClientStateError, MCPServerError, MCPToolError
from .sessions import ServerConnection, TlsContext, consume, describe, leaf

__all__ = ["MCPClient"]

logger = logging.getLogger("agent_runtime.mcp")

_MAX_PAGES = 100
# base64 longer than this is decoded in a worker thread
_OFF_LOOP_CHARS = 256 * 1024


def _render(result: mcp_types.CallToolResult) -> str:
    """The text the model reads: text blocks joined, other blocks named, structured data as JSON."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[resource: {resource.uri}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


async def _value(result: mcp_types.CallToolResult) -> str | list[str | MediaPart]:
    """What the tool function returns: its text, or its text and media parts in order."""
    if not any(_media_block(block) for block in result.content):
        return _render(result)
    items: list[str | MediaPart] = []
    for block in result.content:
        media = _media_block(block)
        if media is None:
            items.append(_render(mcp_types.CallToolResult(content=[block])))
            continue
        part_type, media_type, encoded, filename = media
        data = await _decoded(encoded)
        if data is None:
            kind = "image" if part_type is ImagePart else "document"
            items.append(f"[{kind}: {media_type}, not valid base64]")
            continue
        items.append(part_type(media_type=media_type, data=data, filename=filename))
    return items


def _media_block(
    block: mcp_types.ContentBlock,
) -> tuple[type[ImagePart] | type[DocumentPart], str, str, str | None] | None:
    """(part type, media type, base64 data, filename) of a block a model can be sent."""
    if isinstance(block, mcp_types.ImageContent):
        return ImagePart, block.mime_type.lower(), block.data, None
    if isinstance(block, mcp_types.EmbeddedResource) and isinstance(
        block.resource, mcp_types.BlobResourceContents
    ):
        resource = block.resource
        media_type = (resource.mime_type or "").lower()
        name = str(resource.uri).rsplit("/", 1)[-1] or None
        if media_type in IMAGE_MEDIA_TYPES:
            return ImagePart, media_type, resource.blob, name
        if media_type in DOCUMENT_MEDIA_TYPES:
            return DocumentPart, media_type, resource.blob, name
    return None


async def _decoded(encoded: str) -> bytes | None:
    def decode() -> bytes | None:
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return None

    # a server's screenshot may be megabytes: decoded off the loop
    return decode() if len(encoded) <= _OFF_LOOP_CHARS else await asyncio.to_thread(decode)


def _object_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The server's input schema, passed through; it must describe a JSON object."""
    parameters = dict(schema)
    kind = parameters.setdefault("type", "object")
    if kind != "object":
        raise ValueError(f"input schema has type {kind!r}, not 'object'")
    parameters.setdefault("properties", {})
    return parameters


@dataclass(frozen=True, slots=True)
class _Route:
    server: str
    tool: str


# the client -------------------------------------------------------------------------------------


@dataclass(eq=False)
class _State:
    loop: asyncio.AbstractEventLoop | None = None
    closed: bool = False
    start_task: asyncio.Task[None] | None = None
    close_task: asyncio.Task[None] | None = None
    tools: list[Tool] | None = None
    routes: dict[str, _Route] = field(default_factory=dict)


class MCPClient:
    """Tools of MCP servers for an agent. Loop-bound: one client per event loop.

    ``await start()`` (at warm-up) lists every server's tools; ``tools()`` returns them;
    ``await close()`` closes every open session. ``async with MCPClient(...)`` does both.
    An ``AgentCore`` that registers the tools does not own the client: close it yourself once
    the runs using it have finished. ``client_name`` is the name sent to servers in the
    handshake (default ``agent-runtime``).
    """

    def __init__(
        self, servers: Iterable[MCPServerConfig], *, client_name: str | None = None
    ) -> None:
        configs = list(servers)
        names = [c.name for c in configs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"MCP server names must be unique: {', '.join(duplicates)}")
        for config in configs:
            if not isinstance(config, MCPServerConfig):
                raise ConfigurationError(f"{config!r} is not an MCPServerConfig")
        tls = TlsContext()
        self._servers = {c.name: ServerConnection(c, client_name, tls) for c in configs}
        self._state = _State()

    def __repr__(self) -> str:
        status = "closed" if self.closed else "started" if self.started else "new"
        return f"<MCPClient servers={list(self._servers)} {status}>"

    async def __aenter__(self) -> MCPClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def servers(self) -> tuple[MCPServerConfig, ...]:
        """The configured servers."""
        return tuple(s.config for s in self._servers.values())

    @property
    def started(self) -> bool:
        """True once ``start`` listed every server's tools."""
        return self._state.tools is not None

    @property
    def closed(self) -> bool:
        """True once ``close`` began."""
        return self._state.closed

    def pool_size(self, server: str) -> int:
        """Sessions a pooled server holds now (0 for a server without a pool)."""
        pool = self._servers[server].pool
        return pool.size if pool is not None else 0

    async def start(self) -> None:
        """Connect to every server and list its tools. Idempotent; claims the running loop.

        Raises MCPServerError naming the first server that could not be listed.
        """
        self._claim_loop()
        if self.closed:
            raise MCPClientStateError("the MCP client is closed; build a new one")
        state = self._state
        if state.start_task is None:
            state.start_task = asyncio.get_running_loop().create_task(self._start())
            # a failure is raised to the callers waiting; none may be left to read it
            state.start_task.add_done_callback(consume)
        task = state.start_task
        try:
            await asyncio.shield(task)
        except Exception:
            if state.start_task is task:  # let a later start() try again
                state.start_task = None
            raise

    def tools(self) -> list[Tool]:
        """The servers' tools, named ``{server}__{tool}``. Needs ``start()`` first."""
        if self._state.tools is None:
            raise MCPClientStateError("the MCP client has not started: await client.start()")
        return list(self._state.tools)

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Call a tool by its advertised name; returns its text.

        Raises MCPToolError when the tool reports an error and MCPServerError when the server
        fails; neither ever waits longer than the server's ``timeout`` once a session is leased.
        """
        self._claim_loop()
        if self.closed:
            raise MCPClientStateError("the MCP client is closed")
        route = self._state.routes.get(name)
        if route is None:
            raise MCPClientStateError(
                f"no MCP tool named {name!r}"
                + ("" if self.started else ": the client has not started")
            )
        return _render(await self._call(route, dict(arguments or {})))

    async def close(self) -> None:
        """Close every pooled session (a call still using one fails). Idempotent."""
        state = self._state
        state.closed = True
        if state.loop is None:  # never used: nothing to close
            return
        self._claim_loop()
        if state.close_task is None:
            state.close_task = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(state.close_task)

    # internals --------------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        loop = asyncio.get_running_loop()
        owner = self._state.loop
        if owner is None:
            self._state.loop = loop
        elif owner is not loop:
            raise LoopAffinityError(
                "this MCPClient belongs to another event loop; build one client per loop",
                owner_loop=owner,
                current_loop=loop,
            )

    async def _start(self) -> None:
        servers = list(self._servers.values())
        try:
            outcomes = await asyncio.gather(
                *(self._discover(s) for s in servers), return_exceptions=True
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            routes, tools = self._collect(servers)
        except BaseException:
            # sessions opened for discovery go; a later start() begins afresh
            for server in servers:
                await server.close(reopen=True)
            raise
        self._state.routes = routes
        self._state.tools = tools

    def _collect(self, servers: list[ServerConnection]) -> tuple[dict[str, _Route], list[Tool]]:
        tools: list[Tool] = []
        routes: dict[str, _Route] = {}
        for server in servers:
            for spec in server.listing:
                built = self._wrap(server, spec)
                if built is None:
                    continue
                if built.name in routes:
                    taken = routes[built.name]
                    raise ConfigurationError(
                        f"MCP tools {taken.server}:{taken.tool} and {server.config.name}:"
                        f"{spec.name} are both advertised as {built.name!r}; rename the server "
                        "or limit it with allowed_tools"
                    )
                routes[built.name] = _Route(server.config.name, spec.name)
                tools.append(built)
        return routes, tools

    async def _discover(self, server: ServerConnection) -> None:
        async def list_all(client: Client) -> list[mcp_types.Tool]:
            found: list[mcp_types.Tool] = []
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                found.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return found

        name = server.config.name
        try:
            listing = await server.run(list_all)
        except TimeoutError as exc:
            raise MCPServerError(
                f"MCP server {name!r} did not list its tools within {server.config.timeout:g} s"
            ) from exc
        except Exception as exc:
            raise MCPServerError(
                f"MCP server {name!r} could not be reached: {describe(exc)}"
            ) from exc
        allowed = server.config.allowed_tools
        offered = {t.name for t in listing}
        named = set(server.config.idempotent_tools) | set(allowed or ())
        missing = sorted(named - offered)
        if missing:
            logger.warning("MCP server %s does not offer %s", name, ", ".join(missing))
        if allowed is not None:
            listing = [t for t in listing if t.name in allowed]
        server.listing = listing

    def _wrap(self, server: ServerConnection, spec: mcp_types.Tool) -> Tool | None:
        name = mcp_tool_name(server.config.name, spec.name)
        try:
            parameters = _object_schema(spec.input_schema)
        except ValueError as exc:
            logger.warning("MCP tool %s skipped: %s", name, exc)
            return None
        route = _Route(server.config.name, spec.name)

        async def call(**arguments: Any) -> str | list[str | MediaPart]:
            self._claim_loop()
            if self.closed:
                raise MCPClientStateError("the MCP client is closed")
            return await _value(await self._call(route, arguments))

        call.__name__ = name
        return Tool(
            name=name,
            description=spec.description or spec.title or "",
            function=call,
            parameters=parameters,
            is_async=True,
            idempotent=spec.name in server.config.idempotent_tools,
        )

    async def _call(self, route: _Route, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        server = self._servers[route.server]
        label = f"MCP server {route.server!r}"

        async def call(client: Client) -> mcp_types.CallToolResult:
            return await client.call_tool(route.tool, arguments)

        try:
            result = await server.run(call)
        except TimeoutError as exc:
            raise MCPServerError(
                f"{label} did not answer {route.tool!r} within {server.config.timeout:g} s"
            ) from exc
        except MCPClientStateError:
            raise
        except Exception as exc:
            root = leaf(exc)
            if isinstance(root, MCPError) and root.code != mcp_types.CONNECTION_CLOSED:
                raise MCPServerError(f"{label} refused {route.tool!r}: {root.message}") from exc
            if isinstance(root, MCPError):
                raise MCPServerError(
                    f"{label} closed the connection during {route.tool!r}; it may have crashed"
                ) from exc
            raise MCPServerError(f"{label} failed during {route.tool!r}: {describe(exc)}") from exc
        if result.is_error:
            raise MCPToolError(_render(result) or f"MCP tool {route.tool!r} reported an error")
        return result

    async def _close(self) -> None:
        await asyncio.gather(*(server.close() for server in self._servers.values()))
