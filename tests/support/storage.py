"""Fixtures for the storage contract suite: one fresh database per test, on each backend.

Import `open_backend_fixture` and `store_fixture` into a test module to use the fixtures
`open_backend` and `store` (the names differ so the import does not shadow the arguments).

PostgreSQL tests each get their own schema (selected with `?search_path=` in the URL, which
asyncpg passes on as a server setting), dropped afterwards, so runs can repeat and overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from app.storage import RunRecord, Store, open_store

POSTGRES_URL = os.environ.get(
    "AGENT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

OpenStore = Callable[[], Awaitable[Store]]


def running_run(run_id: str, session_id: str = "s1") -> RunRecord:
    """A running run of alice's, of the default agent, with the input "hello"."""
    return RunRecord(
        run_id=run_id,
        session_id=session_id,
        principal="alice",
        agent="default",
        input="hello",
        status="running",
    )


def with_query(url: str, **params: str) -> str:
    """`url` with `params` added to its query string."""
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{parts.hostname}:{port}"))


@contextlib.asynccontextmanager
async def postgres_schema() -> AsyncIterator[tuple[str, str]]:
    """A fresh schema; yields (url selecting it, schema name) and drops it afterwards."""
    schema = f"test_storage_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            # application_name lets a test find this schema's connections in pg_stat_activity.
            yield with_query(POSTGRES_URL, search_path=schema, application_name=schema), schema
        finally:
            await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await admin.close()


@pytest.fixture(
    name="open_backend",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
async def open_backend_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[OpenStore]:
    """Opens stores on one fresh database of the backend; closes them all afterwards."""
    opened: list[Store] = []
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'agent.db'}"
        else:
            url, _ = await stack.enter_async_context(postgres_schema())

        async def open_one() -> Store:
            store = await open_store(url)
            opened.append(store)
            return store

        try:
            yield open_one
        finally:
            await asyncio.gather(*(store.close() for store in opened))


@pytest.fixture(name="store")
async def store_fixture(open_backend: OpenStore) -> Store:
    """A store on a fresh database (closed by `open_backend`)."""
    return await open_backend()


class TcpProxy:
    """A loopback TCP proxy to PostgreSQL that a test can cut and restore.

    Cutting it is what a database restart or a network failure looks like from the client.
    """

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.port = 0

    def stall(self) -> None:
        """Stop forwarding, connections kept open: a black-holed link (packets dropped)."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again what was held back, and what comes next."""
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Stop listening and drop every open connection."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        pipes = [
            asyncio.create_task(self._pipe(client_r, server_w)),
            asyncio.create_task(self._pipe(server_r, client_w)),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for writer in (client_w, server_w):
                writer.close()
                self._writers.discard(writer)
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._tasks.difference_update(pipes)
            for writer in (client_w, server_w):
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
