"""The agent's shared tool registry; each run reads a snapshot of it once, when it starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ConfigurationError
from .base import Tool, tool

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """Tools by name. Register before serving; a tool added mid-run appears on the next run."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (or a plain function, wrapped with ``@tool``); a taken name is an error."""
        built = item if isinstance(item, Tool) else tool(item)
        if built.name in self._tools:
            raise ConfigurationError(
                f"a tool named {built.name!r} is already registered; tool names must be unique"
            )
        self._tools[built.name] = built
        return built

    def unregister(self, name: str) -> None:
        """Remove a tool; later runs no longer see it."""
        self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        """The tool of that name, if registered."""
        return self._tools.get(name)

    def snapshot(self) -> dict[str, Tool]:
        """A copy for one run: later registrations do not reach a run already started."""
        return dict(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)
