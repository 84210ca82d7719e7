"""The runtime's own tools: ``discover_builtin_tools()`` returns them.

The first is a per-run Todo list for a model that plans: ``TodoWrite`` replaces the list,
``TodoRead`` returns it. Its state belongs to one ``chat()``/``stream()`` call (``run_state``):
concurrent runs on one agent each have their own list, and a run starts with an empty one::

    agent = AgentCore(bindings, builtin_tools=discover_builtin_tools())
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from .base import Tool, run_state, tool

__all__ = ["MAX_TODOS", "TodoItem", "discover_builtin_tools", "todo_read", "todo_write"]

#: A list longer than this is refused: a plan, not a dump.
MAX_TODOS = 100
_KEY = "agent_runtime.todos"


class TodoItem(pydantic.BaseModel):
    """One entry of the Todo list."""

    model_config = pydantic.ConfigDict(extra="forbid")

    content: str = pydantic.Field(min_length=1, max_length=2000)
    status: Literal["pending", "in_progress", "completed"] = "pending"


def _listing(items: list[TodoItem]) -> list[dict[str, Any]]:
    return [{"index": i, **item.model_dump()} for i, item in enumerate(items, 1)]


@tool(name="TodoWrite", policy="allow")
async def todo_write(todos: list[TodoItem]) -> dict[str, Any]:
    """Replace this task's Todo list with ``todos`` (each: content, and status pending,
    in_progress or completed). Keep one item in_progress while you work on it."""
    if len(todos) > MAX_TODOS:
        raise ValueError(f"at most {MAX_TODOS} todos; merge some")
    run_state()[_KEY] = list(todos)
    done = sum(item.status == "completed" for item in todos)
    return {"todos": _listing(todos), "completed": done, "total": len(todos)}


@tool(name="TodoRead", policy="allow")
async def todo_read() -> dict[str, Any]:
    """This task's Todo list, as last written with TodoWrite (empty at first)."""
    items: list[TodoItem] = run_state().get(_KEY, [])
    return {"todos": _listing(items), "total": len(items)}


def discover_builtin_tools() -> list[Tool]:
    """Every built-in tool: ``TodoWrite`` and ``TodoRead``."""
    return [todo_write, todo_read]
