"""The shared engines for tests: a Redis key prefix or a PostgreSQL schema of one's own, and
a dedicated ``redis-server`` a test may stop and start.

The machine's Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, database ``test``) are
shared by every test run: each test takes a fresh key prefix and a fresh schema (selected with
``?search_path=`` on the URL) and removes them afterwards, so runs can repeat and overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import redis

REDIS_URL = os.environ.get("AGENT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "AGENT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

T = TypeVar("T")


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end from synchronous code, on a thread of its own (so that it
    never meets the event loop of the test that called it)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        async def main() -> T:
            return await factory()

        try:
            result.append(asyncio.run(main()))
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=target, name="run-async")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def new_prefix() -> str:
    """A Redis key prefix no other test uses."""
    return f"test:{uuid.uuid4().hex[:12]}:"


def drop_prefix(prefix: str, url: str = REDIS_URL) -> int:
    """Delete every key under ``prefix``; how many there were."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.unlink(*keys[start : start + 500])
        return len(keys)
    finally:
        client.close()


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query string."""
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


def create_schema() -> tuple[str, str]:
    """A fresh PostgreSQL schema: (URL selecting it, its name)."""
    schema = f"test_scale_{uuid.uuid4().hex[:16]}"

    async def create() -> None:
        connection = await asyncpg.connect(POSTGRES_URL)
        try:
            await connection.execute(f'CREATE SCHEMA "{schema}"')
        finally:
            await connection.close()

    run_async(create)
    return with_query(POSTGRES_URL, search_path=schema), schema


def drop_schema(schema: str) -> None:
    """Drop a schema made by ``create_schema`` (its connections may still be closing)."""

    async def drop() -> None:
        connection = await asyncpg.connect(POSTGRES_URL)
        try:
            await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await connection.close()

    run_async(drop)


@contextlib.contextmanager
def shared_backend() -> Iterator[dict[str, str]]:
    """The environment of a service on Redis and PostgreSQL, private to the caller: a fresh
    key prefix and schema, removed afterwards."""
    url, schema = create_schema()
    prefix = new_prefix()
    try:
        yield {
            "AGENT_REDIS_URL": REDIS_URL,
            "AGENT_REDIS_PREFIX": prefix,
            "AGENT_DATABASE_URL": url,
        }
    finally:
        drop_prefix(prefix)
        drop_schema(schema)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A ``redis-server`` of the test's own, on a spare port, without persistence: stopping
    it loses its data, as a crashed cache would."""

    def __init__(self, directory: Path) -> None:
        executable = shutil.which("redis-server")
        if executable is None:  # pragma: no cover - the CI machine has it
            raise RuntimeError("redis-server is not installed")
        self.executable = executable
        self.directory = directory
        self.port = free_port()
        # a Unix socket too, under a short path (the kernel takes 107 bytes at most); Redis
        # replaces a stale one at its start
        self.socket = Path(tempfile.gettempdir()) / f"agent-test-redis-{self.port}.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def start(self) -> None:
        """Start (or restart, on the same port) and wait until it answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        log = (self.directory / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Kill it at once (its clients see their connections drop)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
