"""Tools: ``@tool`` and ``Tool`` (``base``), the registry, execution, and the built-in tools."""

from __future__ import annotations

from .base import Tool, ToolPolicy, current_tool_call_id, run_state, tool
from .builtin import discover_builtin_tools

__all__ = [
    "Tool",
    "ToolPolicy",
    "current_tool_call_id",
    "discover_builtin_tools",
    "run_state",
    "tool",
]
