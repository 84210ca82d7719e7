"""``DedicatedScript``, the appends' call on a connection of its own, against a redis-server of
the test's own: one connection for every call, a flushed script loaded again, a dropped or
restarted server met with a new connection, a call cut short never leaving its reply for the
next call to read; and the bus on a ``unix://`` URL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError

from app.bus.redis.connection import make_client
from app.bus.redis.dedicated import DedicatedScript
from tests.support.buses import Buses, event, read_until_finished
from tests.support.services import RedisServer
from tests.support.storage import TcpProxy

pytestmark = pytest.mark.redis

ECHO = "return ARGV[1] .. ':' .. ARGV[2]"
NAME = "agent-appends:test"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[Redis]:
    client = make_client(server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def _named(client: Redis) -> list[dict[str, str]]:
    return [entry for entry in await client.client_list() if entry.get("name") == NAME]


async def test_every_call_goes_through_one_connection_of_its_own(client: Redis) -> None:
    script = DedicatedScript(client, ECHO, fixed=("f",), per_call=1, name=NAME)
    try:
        assert await script("a") == b"f:a"
        assert await script(b"\x00\r\n\xff") == b"f:\x00\r\n\xff"  # bytes go out as they are
        assert await script(7) == b"f:7"
        assert len(await _named(client)) == 1
        with pytest.raises(TypeError):
            await script("a", "b")
    finally:
        await script.aclose()
    assert await _named(client) == []


async def test_a_flushed_script_is_loaded_again(client: Redis) -> None:
    script = DedicatedScript(client, ECHO, fixed=("f",), per_call=1, name=NAME)
    try:
        assert await script("a") == b"f:a"
        await client.script_flush()
        assert await script("b") == b"f:b"
    finally:
        await script.aclose()


async def test_a_script_error_is_raised_and_the_connection_kept(client: Redis) -> None:
    script = DedicatedScript(client, "return redis.error_reply('refused ' .. ARGV[1])", per_call=1)
    try:
        with pytest.raises(ResponseError, match="refused x"):
            await script("x")
        with pytest.raises(ResponseError, match="refused y"):
            await script("y")
    finally:
        await script.aclose()


async def test_a_killed_connection_is_replaced_for_the_next_call(client: Redis) -> None:
    script = DedicatedScript(client, ECHO, fixed=("f",), per_call=1, name=NAME)
    try:
        assert await script("a") == b"f:a"
        [entry] = await _named(client)
        await client.client_kill_filter(_id=entry["id"])
        assert await script("b") == b"f:b"  # the call is made again on a new connection
        [renewed] = await _named(client)
        assert renewed["id"] != entry["id"]
    finally:
        await script.aclose()


async def test_a_restarted_server_is_met_with_a_new_connection_and_the_script_loaded(
    server: RedisServer, client: Redis
) -> None:
    script = DedicatedScript(client, ECHO, fixed=("f",), per_call=1, name=NAME, retries=0)
    try:
        assert await script("a") == b"f:a"
        server.stop()
        with pytest.raises((ConnectionError, OSError)):
            await script("b")
        server.start()  # its scripts are gone with it
        assert await script("c") == b"f:c"
    finally:
        await script.aclose()


async def test_a_call_cut_short_never_leaves_its_reply_to_the_next(server: RedisServer) -> None:
    proxy = TcpProxy(server.port)
    await proxy.start()
    client = make_client(f"redis://127.0.0.1:{proxy.port}/0")
    script = DedicatedScript(client, ECHO, fixed=("f",), per_call=1, name=NAME)
    try:
        assert await script("warm") == b"f:warm"
        proxy.stall()
        first = asyncio.create_task(script("first"))
        await asyncio.sleep(0.05)  # sent, its reply held back by the stalled link
        assert not first.done()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        proxy.resume()  # the first call's reply arrives, on the connection it dropped
        async with asyncio.timeout(5):
            assert await script("second") == b"f:second"
    finally:
        await script.aclose()
        await client.aclose()
        await proxy.cut()


async def test_a_unix_socket_url_serves_the_bus(server: RedisServer) -> None:
    # keepalive is a TCP option: a unix:// URL must not be given it (it was, and refused)
    buses = Buses("unix:")
    bus = await buses.open(server.unix_url)
    try:
        await bus.events.create("run_1", session_id="s", fence=1)
        subscription = await bus.events.subscribe("run_1")
        await bus.events.append("run_1", event(1), fence=1)  # the appends' own connection
        await bus.events.append("run_1", event(2, "run.completed"), fence=1)
        assert await read_until_finished(subscription) == [1, 2]
        await subscription.aclose()
    finally:
        await bus.aclose()
