"""Sessions to one MCP server: opened per call, or pooled in owner tasks.

The SDK requires a session to be entered and exited by the same task (its transports run anyio
task groups). An ephemeral session is opened and closed inside the calling task. A pooled
session lives in an owner task of its own, which only opens it, waits to be told to stop, and
closes it; calls use the open session from their own tasks, so their timeouts and cancellation
reach them directly.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import importlib.metadata
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from .config import MCPServerConfig
from .errors import MCPClientStateError

__all__ = ["ServerConnection", "TlsContext", "consume", "describe", "leaf", "session_unknown"]

logger = logging.getLogger("agent_runtime.mcp")

# The SDK and the libraries under it import these lazily, inside the first session they open or
# the first tool output they validate; importing them here keeps that work (a tenth of a second
# in all, much more on a busy machine) off the event loop.
for _module in (
    "anyio._backends._asyncio",
    "anyio._core._subprocesses",
    "h11",
    "httpcore2",
    "jsonschema",
    "referencing.exceptions",
):
    importlib.import_module(_module)

_T = TypeVar("_T")
# a pooled session asked to stop gets this long to close before its owner task is cancelled
_CLOSE_GRACE = 5.0
# SSE responses may stay silent while a tool works; the call itself is bounded by `timeout`
_SSE_READ_TIMEOUT = 300.0


def _client_info() -> mcp_types.Implementation:
    try:
        version = importlib.metadata.version("agent-runtime")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
        version = "0"
    return mcp_types.Implementation(name="agent-runtime", version=version)


class TlsContext:
    """One TLS context for every HTTP session of a client.

    Building one reads the CA bundle from disk (tens of milliseconds, more the first time); a
    fresh ``httpx2.AsyncClient`` per session would do that on the event loop for every call.
    """

    def __init__(self) -> None:
        self._context: ssl.SSLContext | None = None

    async def get(self) -> ssl.SSLContext:
        if self._context is None:
            built = await asyncio.to_thread(httpx2.create_ssl_context)
            if self._context is None:
                self._context = built
        return self._context


class SessionWatch:
    """Set when the server answered a request of this session with "unknown session".

    The client SDK turns a 400 into a bare "Server returned an error response", losing the
    body that names the session; the HTTP client's response hook sees it first.
    """

    unknown = False

    async def on_response(self, response: httpx2.Response) -> None:
        status = response.status_code
        if status not in (400, 404) or "mcp-session-id" not in response.request.headers:
            return
        if status == 404:
            self.unknown = True
            return
        body = await response.aread()  # small; kept for the SDK, which reads it again
        if b"session" in body.lower():
            self.unknown = True


@asynccontextmanager
async def _http_transport(
    url: str,
    headers: Mapping[str, str] | None,
    http_timeout: httpx2.Timeout,
    tls: ssl.SSLContext,
    watch: SessionWatch | None,
) -> AsyncIterator[Any]:
    # the SDK takes custom headers only through a client we build; we own it and close it here
    hooks = {"response": [watch.on_response]} if watch is not None else {}
    http = httpx2.AsyncClient(
        headers=dict(headers or {}), timeout=http_timeout, verify=tls, event_hooks=hooks
    )
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


class ServerConnection:
    """One configured server: how to open sessions to it, its tool listing, its pool."""

    def __init__(self, config: MCPServerConfig, client_name: str | None, tls: TlsContext) -> None:
        self.config = config
        self.listing: list[mcp_types.Tool] = []
        info = _client_info()
        if client_name is not None:
            info = mcp_types.Implementation(name=client_name, version=info.version)
        self._info = info
        self._tls = tls
        size = config.session_pool_size
        self.pool = _SessionPool(self) if size else None

    async def connect(self, watch: SessionWatch | None = None) -> Client:
        """An SDK client for one session, not yet entered (``watch``: told if the server
        forgets the session)."""
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None
            target: Any = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) if config.env is not None else None,
                cwd=config.cwd,
            )
        else:
            assert config.url is not None
            limits = httpx2.Timeout(config.timeout, read=max(config.timeout, _SSE_READ_TIMEOUT))
            target = _http_transport(
                config.url, config.headers, limits, await self._tls.get(), watch
            )
        return Client(target, client_info=self._info, cache=None)

    def prime(self, client: Client) -> None:
        """Hand a new session the listing we already hold.

        Without it the SDK lists the tools again after each successful call (to validate output
        schemas), which costs an ephemeral session a second round trip. The hook is private in
        the SDK; when it is missing the SDK just lists again.
        """
        absorb = getattr(client.session, "_absorb_tool_listing", None)
        if self.listing and callable(absorb):
            absorb(mcp_types.ListToolsResult(tools=list(self.listing)), complete=True)

    async def close(self, *, reopen: bool = False) -> None:
        """Close the pooled sessions; ``reopen`` leaves an empty pool ready for new ones."""
        if self.pool is not None:
            await self.pool.close()
            if reopen:
                self.pool = _SessionPool(self)

    async def run(self, operation: Callable[[Client], Awaitable[_T]]) -> _T:
        """Run one operation on a session: a leased pooled one, or one opened for it."""
        if self.pool is not None:
            return await self.pool.run(operation)
        async with asyncio.timeout(self.config.timeout):
            async with await self.connect() as client:
                self.prime(client)
                return await operation(client)


class _PooledSession:
    """A session that lives in an owner task: the task opens it, waits, and closes it."""

    def __init__(self, server: ServerConnection) -> None:
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[Client] = loop.create_future()
        # a failure nobody waits for any more is logged by the owner, not by the loop
        self._ready.add_done_callback(consume)
        self._stop = asyncio.Event()
        self.watch = SessionWatch()
        self.task = loop.create_task(
            self._own(server),
            name=f"mcp-session:{server.config.name}",
            context=contextvars.Context(),  # nothing of the caller's run leaks into the session
        )

    @property
    def usable(self) -> bool:
        return (
            self._ready.done()
            and not self._ready.cancelled()
            and self._ready.exception() is None
            and not self._stop.is_set()
            and not self.task.done()
        )

    async def open(self) -> Client:
        """Wait until the session is open; its failure to open is raised here."""
        return await asyncio.shield(self._ready)

    @property
    def client(self) -> Client:
        return self._ready.result()

    def stop(self) -> None:
        """Close the session (a call still using it fails), or abandon it while it opens."""
        if not self._ready.done():
            self.task.cancel()
        self._stop.set()

    async def _own(self, server: ServerConnection) -> None:
        name = server.config.name
        try:
            async with await server.connect(self.watch) as client:
                server.prime(client)
                if not self._ready.done():
                    self._ready.set_result(client)
                await self._stop.wait()
        except Exception as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                logger.info("MCP session of server %s ended: %s", name, describe(exc))
        finally:
            self._stop.set()
            if not self._ready.done():
                self._ready.cancel()


class _UnknownSession(Exception):
    """The server refused a call because it does not know the session (inside the pool)."""

    def __init__(self, error: MCPError) -> None:
        super().__init__(error.message)
        self.error = error


class _SessionPool:
    """Up to ``session_pool_size`` sessions, each leased to one call at a time."""

    def __init__(self, server: ServerConnection) -> None:
        self._server = server
        self._slots = asyncio.Semaphore(server.config.session_pool_size)
        self._idle: list[_PooledSession] = []
        self._sessions: set[_PooledSession] = set()
        self._closed = False
        self.opened = 0

    @property
    def size(self) -> int:
        """Sessions alive now (open, opening or closing)."""
        return len(self._sessions)

    async def run(self, operation: Callable[[Client], Awaitable[_T]]) -> _T:
        async with self._slots:
            if self._closed:
                raise MCPClientStateError("the MCP client is closed")
            async with asyncio.timeout(self._server.config.timeout):
                try:
                    return await self._run_once(operation, fresh=False)
                except _UnknownSession as unknown:
                    exc = unknown.error
                    # the server forgot the session (restarted, or expired it) and refused
                    # the call before running it: once more, on a session opened now. The
                    # idle ones were opened before the same restart: replaced as well.
                    logger.info(
                        "MCP server %s no longer knows a pooled session (%s): replacing it",
                        self._server.config.name,
                        exc.message,
                    )
                    self._drop_idle()
                    try:
                        return await self._run_once(operation, fresh=True)
                    except _UnknownSession as again:
                        raise again.error from None

    async def _run_once(self, operation: Callable[[Client], Awaitable[_T]], *, fresh: bool) -> _T:
        healthy = False
        session: _PooledSession | None = None
        try:
            session = await self._checkout(fresh=fresh)
            try:
                result = await operation(session.client)
            except MCPError as exc:
                # an error answer leaves the session usable; a lost connection does not, nor
                # an answer saying the server does not know the session (the call did not run)
                if session.watch.unknown or session_unknown(exc):
                    raise _UnknownSession(exc) from exc
                healthy = exc.code != mcp_types.CONNECTION_CLOSED
                raise
            healthy = True
            return result
        finally:
            if session is not None:
                if healthy and session.usable and not self._closed:
                    self._idle.append(session)
                else:
                    session.stop()

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for session in idle:
            session.stop()

    async def _checkout(self, *, fresh: bool = False) -> _PooledSession:
        while self._idle and not fresh:
            candidate = self._idle.pop()
            if candidate.usable:
                return candidate
            candidate.stop()
        session = _PooledSession(self._server)
        self._sessions.add(session)
        session.task.add_done_callback(lambda _: self._sessions.discard(session))
        try:
            await session.open()
        except BaseException:
            session.stop()
            raise
        self.opened += 1
        return session

    async def close(self) -> None:
        self._closed = True
        self._idle.clear()
        sessions = list(self._sessions)
        for session in sessions:
            session.stop()
        tasks = [s.task for s in sessions]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=_CLOSE_GRACE)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


# what servers answer a request naming a session they do not know: the Python SDK 404 "Session
# not found", the TypeScript SDK 400 "Bad Request: No valid session ID provided", and the client
# SDK's own stand-in for a bare 404, "Session terminated"
_UNKNOWN_SESSION = ("not found", "terminated", "no valid", "invalid", "unknown", "expired")


def session_unknown(exc: MCPError) -> bool:
    """Whether ``exc`` is a server's answer that it does not know the request's session.

    Such an answer comes before the request is dispatched, so the call did not run.
    """
    message = exc.message.lower()
    return "session" in message and any(word in message for word in _UNKNOWN_SESSION)


def leaf(exc: BaseException) -> BaseException:
    """The first root failure inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    """One line naming the root failure, looking through exception groups."""
    exc = leaf(exc)
    if isinstance(exc, MCPError):
        return exc.message
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def consume(future: asyncio.Future[Any]) -> None:
    """Mark a future's failure as seen: whoever needs it was told already."""
    if not future.cancelled():
        future.exception()
