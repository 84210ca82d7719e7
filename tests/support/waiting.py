"""Polling until a condition holds, in-process (``wait_until``) or over HTTP (``wait_for``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_until(check: Callable[[], bool | Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``check`` until it holds."""
    async with asyncio.timeout(within):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(0.01)


async def wait_for(check: Callable[[], Any], *, within: float = 20.0) -> Any:
    """Poll an async ``check`` until it returns something truthy; that value."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.02)
