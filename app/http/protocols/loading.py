"""Protocol endpoints whose SDKs load on their first request.

The A2A and MCP SDKs take about a second each to import, which every worker would otherwise pay
at start, before it is ready, whether or not anyone speaks those protocols to it. Here each
endpoint's module is imported once, on the first request to it, in a thread: that request (and
any arriving meanwhile) waits for it while the event loop goes on serving everything else.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import ModuleType
from typing import Any, Generic, TypeVar

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["DeferredEndpoint", "DeferredModule"]

T = TypeVar("T", bound=ASGIApp)


class DeferredModule:
    """A module imported on first ``await load()``, in a thread, once."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None
        self._loading: asyncio.Future[ModuleType] | None = None

    async def load(self) -> ModuleType:
        """The module (imported now if it was not yet)."""
        if self._module is not None:
            return self._module
        if self._loading is None:
            self._loading = asyncio.ensure_future(
                asyncio.to_thread(importlib.import_module, self._name)
            )
        # shielded: a request that goes away does not abandon the import for the others
        self._module = await asyncio.shield(self._loading)
        return self._module


class DeferredEndpoint(Generic[T]):
    """An ASGI app built from a deferred module on its first request.

    ``build(module)`` makes the endpoint on the event loop; ``serve(endpoint)``, when given, is
    the lifetime the endpoint needs around its requests (a transport's task group): it is entered
    by a task of its own once built, and left when ``running()`` ends.
    """

    def __init__(
        self,
        module: str,
        build: Callable[[ModuleType], T],
        serve: Callable[[T], AbstractAsyncContextManager[Any]] | None = None,
    ) -> None:
        self._module = DeferredModule(module)
        self._build = build
        self._serve = serve
        self._endpoint: T | None = None
        self._making: asyncio.Future[T] | None = None
        self._stopping = asyncio.Event()
        self._lifetime: asyncio.Task[None] | None = None
        self._closed = False

    async def module(self) -> ModuleType:
        """The endpoint's module (imported now if it was not yet)."""
        return await self._module.load()

    async def endpoint(self) -> T | None:
        """The endpoint, built (and its lifetime entered) on the first call; None once the
        service has ended."""
        if self._endpoint is not None:
            return self._endpoint
        if self._making is None:
            if self._closed:
                return None
            self._making = asyncio.ensure_future(self._make())
        # shielded: a request that goes away does not leave a half-entered lifetime behind
        self._endpoint = await asyncio.shield(self._making)
        return self._endpoint

    async def _make(self) -> T:
        endpoint = self._build(await self._module.load())
        serve = self._serve
        if serve is None:
            return endpoint
        entered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stopping = self._stopping

        async def lifetime() -> None:
            try:
                async with serve(endpoint):
                    entered.set_result(None)
                    await stopping.wait()
            except BaseException as exc:
                if not entered.done():
                    entered.set_exception(exc)
                raise

        self._lifetime = asyncio.get_running_loop().create_task(lifetime())
        await entered
        return endpoint

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The service's lifetime: an endpoint built during it is wound down as it ends."""
        try:
            yield
        finally:
            self._closed = True
            if self._making is not None:
                # one still being made is entered first, then left like the others
                await asyncio.wait([self._making])
            self._stopping.set()
            if self._lifetime is not None:
                await self._lifetime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = await self.endpoint()
        if endpoint is None:
            gone = JSONResponse({"error": "the server is shutting down"}, status_code=503)
            await gone(scope, receive, send)
            return
        await endpoint(scope, receive, send)
