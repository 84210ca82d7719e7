"""Running one tool call: validation, thread or loop, timeout, and rendering its result."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..messages import ToolCall
from .base import RunStateOwner, Tool, ToolArgumentsError, _current_tool_call_id, _run_state

__all__ = ["ToolExecutor"]

logger = logging.getLogger("agent_runtime.tools")


class ToolExecutor:
    """Executes tool calls; sync tools go to the loop's default thread pool."""

    def __init__(self, executor: ThreadPoolExecutor | None = None) -> None:
        self._executor = executor

    async def execute(
        self,
        found: Tool,
        call: ToolCall,
        time_limit: float | None,
        run: RunStateOwner | None = None,
    ) -> tuple[Any, str | None]:
        """Run a call; returns ``(result, None)`` or ``(None, error message for the model)``.

        The timeout covers time spent waiting for a worker thread too. A sync tool that times
        out keeps running in its thread (threads cannot be killed); its result is dropped.
        """
        try:
            arguments = found.validate(call.arguments)
        except ToolArgumentsError as exc:
            return None, str(exc)
        token = _current_tool_call_id.set(call.id)
        state_token = _run_state.set(run)  # ``run_state()`` inside the call
        try:
            async with asyncio.timeout(time_limit) as deadline:
                if found.is_async:
                    result = await found.function(**arguments)
                else:
                    loop = asyncio.get_running_loop()
                    # the thread sees this call's context, so current_tool_call_id() works there
                    ctx = contextvars.copy_context()
                    result = await loop.run_in_executor(
                        self._executor, functools.partial(ctx.run, found.function, **arguments)
                    )
        except TimeoutError as exc:
            if time_limit is not None and deadline.expired():
                return None, f"tool {found.name!r} timed out after {time_limit:g} s"
            return None, f"TimeoutError: {exc}"
        except Exception as exc:
            logger.info("tool %s raised %s", found.name, type(exc).__name__)
            return None, f"{type(exc).__name__}: {exc}"
        finally:
            _run_state.reset(state_token)
            _current_tool_call_id.reset(token)
        return result, None

    @staticmethod
    def render(result: Any) -> str:
        """The text the model reads for a result."""
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(result)

    def shutdown(self) -> None:
        """Release an executor this object was given (the loop's default one is not ours)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
