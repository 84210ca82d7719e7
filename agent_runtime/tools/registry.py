"""The agent's shared tool registry; each run reads a snapshot of it once, when it starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import ConfigurationError
from .base import Tool, tool

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """Tools by name. Register before serving; a tool added mid-run appears on the next run."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._snapshot: Mapping[str, Tool] | None = None

    def register(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (or a plain function, wrapped with ``@tool``); a taken name is an error."""
        built = item if isinstance(item, Tool) else tool(item)
        if built.name in self._tools:
            raise ConfigurationError(
                f"a tool named {built.name!r} is already registered; tool names must be unique"
            )
        self._tools[built.name] = built
        self._snapshot = None
        return built

    def unregister(self, name: str) -> None:
        """Remove a tool; later runs no longer see it."""
        self._tools.pop(name, None)
        self._snapshot = None

    def get(self, name: str) -> Tool | None:
        """The tool of that name, if registered."""
        return self._tools.get(name)

    def snapshot(self) -> Mapping[str, Tool]:
        """The tools for one run, read-only: later registrations do not reach a run already
        started. One copy is shared by every run started since the last change (a run that
        adds tools of its own copies it then, ``RunOptions.add_tool``)."""
        if self._snapshot is None:
            self._snapshot = MappingProxyType(dict(self._tools))
        return self._snapshot

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)
