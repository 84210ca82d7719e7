"""Real MCP servers, built with the ``mcp`` SDK, for the MCP client's tests.

``python -m tests.fakes.mcp_servers stdio`` serves over stdin/stdout;
``python -m tests.fakes.mcp_servers http`` serves streamable HTTP on a loopback port chosen by
the OS and prints that port as its first line of stdout. ``HttpServerProcess`` starts the latter.

The server is named ``fake``. Its ``stats`` tool exposes what the server saw: handshakes per
client name, calls per tool, and the calls of ``work``/``hang`` in flight now and at most.
``work`` waits until ``open_gate`` is called (on any session), so a test can hold calls open.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, TextContent

from tests.support.content_samples import PNG

ROOT = Path(__file__).resolve().parents[2]
SERVER_NAME = "fake"


def stdio_command() -> tuple[str, list[str], str]:
    """``(command, args, cwd)`` that start the stdio server."""
    return sys.executable, ["-m", "tests.fakes.mcp_servers", "stdio"], str(ROOT)


class HttpServerProcess:
    """The HTTP server in a subprocess, on a loopback port. Blocking: use it from sync fixtures."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.mcp_servers", "http"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the MCP HTTP server did not start (said {line!r})")
        self.port = int(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def kill(self) -> None:
        """Kill the server at once: its connections drop without an answer."""
        self.process.kill()

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def build_server() -> MCPServer:
    """The fake server, with fresh state."""
    handshakes: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    flight = {"now": 0, "max": 0}
    gate = asyncio.Event()

    class CountHandshakes:
        """Counts the handshakes (one per session) by the client name they carry."""

        async def __call__(
            self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
        ) -> HandlerResult:
            params: dict[str, Any] = dict(ctx.params or {})
            if ctx.method == "server/discover":
                info = (params.get("_meta") or {}).get("io.modelcontextprotocol/clientInfo") or {}
                handshakes[str(info.get("name", "?"))] += 1
            elif ctx.method == "initialize":
                info = params.get("clientInfo") or {}
                handshakes[str(info.get("name", "?"))] += 1
            elif ctx.method == "tools/call":
                calls[str(params.get("name"))] += 1
            return await call_next(ctx)

    server = MCPServer(SERVER_NAME, middleware=[CountHandshakes()], log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool(name="echo.text", structured_output=False)
    def echo(text: str) -> str:
        """Return the text unchanged (its name holds a dot, invalid for model APIs)."""
        return text

    @server.tool(structured_output=False)
    def pieces() -> list[TextContent]:
        """Answer with two text blocks."""
        return [TextContent(text="first"), TextContent(text="second")]

    @server.tool(structured_output=False)
    def picture() -> list[TextContent | ImageContent]:
        """Answer with a caption and a 1x1 PNG."""
        return [
            TextContent(text="a black pixel"),
            ImageContent(data=base64.b64encode(PNG).decode("ascii"), mime_type="image/png"),
        ]

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails with the given reason."""
        raise ToolError(reason)

    @server.tool()
    def die() -> str:
        """Kill the server's own process in the middle of the call."""
        os._exit(3)

    @server.tool()
    async def work(tag: str) -> str:
        """Wait until the gate opens, then answer."""
        flight["now"] += 1
        flight["max"] = max(flight["max"], flight["now"])
        try:
            await gate.wait()
        finally:
            flight["now"] -= 1
        return f"done {tag}"

    @server.tool()
    async def hang() -> str:
        """Never answers (gives up after a minute so an abandoned call ends eventually)."""
        flight["now"] += 1
        try:
            await asyncio.sleep(60)
        finally:
            flight["now"] -= 1
        return "late"

    @server.tool()
    def open_gate() -> str:
        """Let every waiting and future ``work`` call finish."""
        gate.set()
        return "open"

    @server.tool()
    def stats() -> dict[str, Any]:
        """What the server saw so far."""
        return {
            "pid": os.getpid(),
            "handshakes": dict(handshakes),
            "calls": dict(calls),
            "in_flight": flight["now"],
            "max_in_flight": flight["max"],
        }

    return server


async def _serve_http(server: MCPServer) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # listening before the port goes out: a client may connect at once, and its connection
    # waits in the backlog until the server has started
    sock.listen(128)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    print(sock.getsockname()[1], flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("transport", choices=["stdio", "http"])
    args = parser.parse_args(argv)
    server = build_server()
    if args.transport == "stdio":
        asyncio.run(server.run_stdio_async())
    else:
        asyncio.run(_serve_http(server))


if __name__ == "__main__":
    main()
