"""The MCP client's exceptions.

::

    AgentRuntimeError
    └── MCPClientError
        ├── MCPClientStateError (also RuntimeError)  used before start() or after close()
        ├── MCPServerError                           unreachable, died, timed out, refused
        └── MCPToolError                             the tool answered with isError

Inside a run each of them becomes a tool-error result the model reads; the run goes on.
"""

from __future__ import annotations

from ..errors import AgentRuntimeError

__all__ = ["MCPClientError", "MCPClientStateError", "MCPServerError", "MCPToolError"]


class MCPClientError(AgentRuntimeError):
    """Base class of the MCP client's errors."""


class MCPClientStateError(MCPClientError, RuntimeError):
    """The client was used before ``start()`` or after ``close()``."""


class MCPServerError(MCPClientError):
    """An MCP server could not be reached, died, did not answer in time, or refused a request."""


class MCPToolError(MCPClientError):
    """An MCP tool reported an error (``isError``); the message is the tool's own text."""
