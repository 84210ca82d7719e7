"""MCP client: the tools of Model Context Protocol servers, as ordinary runtime tools.

``MCPClient(servers)`` talks to each configured server through the official ``mcp`` SDK, over
stdio (a subprocess) or streamable HTTP. ``await client.start()`` lists every server's tools;
``client.tools()`` returns them as ``Tool`` objects named ``{server}__{tool}``, ready for an
``AgentCore`` registry, where policies, timeouts and confirmations apply to them like to any tool.

Sessions. By default every call opens a session of its own and closes it afterwards (a stdio
server starts a process per call). With ``session_pool_size=N`` a server keeps up to N sessions
open and leases each to one call at a time; a further call waits for an idle session. The SDK
requires a session to be entered and exited in one task, so each pooled session lives in an
owner task of its own that only opens it, waits, and closes it; callers use the open session from
their own task. A session whose call failed at the transport level, timed out or was cancelled
is closed and replaced by a fresh one on a later call.

Exceptions::

    AgentRuntimeError
    └── MCPClientError
        ├── MCPClientStateError (also RuntimeError)  used before start() or after close()
        ├── MCPServerError                           unreachable, died, timed out, refused
        └── MCPToolError                             the tool answered with isError

Inside a run, either error becomes a tool-error result the model reads; the run goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import DEFAULT_TIMEOUT, MCPServerConfig, Transport, mcp_tool_name
from .errors import MCPClientError, MCPClientStateError, MCPServerError, MCPToolError

if TYPE_CHECKING:
    from .client import MCPClient

__all__ = [
    "DEFAULT_TIMEOUT",
    "MCPClient",
    "MCPClientError",
    "MCPClientStateError",
    "MCPServerConfig",
    "MCPServerError",
    "MCPToolError",
    "Transport",
    "mcp_tool_name",
]


def __getattr__(name: str) -> Any:
    # the ``mcp`` SDK takes about a second to import: only a process that talks to an MCP
    # server pays for it, on its first use of ``MCPClient``
    if name == "MCPClient":
        from .client import MCPClient

        return MCPClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
