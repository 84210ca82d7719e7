"""Outages of PostgreSQL and Redis under a real server: bounded calls, readiness that follows.

The server reaches both through loopback proxies (``tests.fakes.tcp_proxy``) that refuse
(a stopped server), black-hole (a dead network path: nothing answers, nothing is refused) and
restore. Through each outage: ``/readyz`` turns 503 ``unavailable`` within a few probe
rounds and back to 200 once the dependency answers again (the hysteresis itself is pinned
in ``tests/app/server/test_readiness.py``); requests that need the dependency answer 503 within
``AGENT_BACKEND_TIMEOUT`` plus a margin, never after the 30 to 60 s of unbounded waits;
``/healthz`` keeps answering; afterwards runs work again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.fakes.tcp_proxy import FaultyProxy
from tests.support.server import Server, launch

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

BACKEND_TIMEOUT = 2.0


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")
    host = f"{netloc[0]}@127.0.0.1:{port}" if netloc[1] else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=host))


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Server, FaultyProxy, FaultyProxy]]:
    from tests.support.services import shared_backend

    with shared_backend() as env:
        pg_port = urlsplit(env["AGENT_DATABASE_URL"]).port or 5432
        redis_port = urlsplit(env["AGENT_REDIS_URL"]).port or 6379
        with FaultyProxy(pg_port) as pg, FaultyProxy(redis_port) as redis:
            server = launch(
                tmp_path,
                {
                    **env,
                    "AGENT_DATABASE_URL": _through(env["AGENT_DATABASE_URL"], pg.port),
                    "AGENT_REDIS_URL": _through(env["AGENT_REDIS_URL"], redis.port),
                    "AGENT_BACKEND_TIMEOUT": str(BACKEND_TIMEOUT),
                },
            )
            try:
                yield server, pg, redis
            finally:
                pg.restore()
                redis.restore()
                server.stop()


async def _ready_becomes(client: httpx.AsyncClient, status: int, within: float) -> float:
    """Seconds until ``/readyz`` answers ``status`` (fails after ``within``)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        response = await client.get("/readyz")
        if response.status_code == status:
            if status == 503:
                assert response.json()["code"] in ("unavailable",), response.text
                assert response.headers["retry-after"] == "1"
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz did not turn {status} within {within} s")


async def _timed(request: object) -> tuple[int, float]:
    started = time.monotonic()
    response: httpx.Response = await request  # type: ignore[misc]
    return response.status_code, time.monotonic() - started


async def test_readiness_and_bounded_calls_through_each_outage(
    outage: tuple[Server, FaultyProxy, FaultyProxy],
) -> None:
    server, pg, redis = outage
    figures: list[str] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        assert (await client.get("/readyz")).status_code == 200
        started = await client.post(
            "/v1/sessions/before/runs", json={"input": "hi", "stream": False}
        )
        assert started.status_code == 200, started.text

        for name, proxy in (("Redis", redis), ("PostgreSQL", pg)):
            for fault in ("refuse", "blackhole"):
                getattr(proxy, fault)()
                down = await _ready_becomes(client, 503, within=10)
                assert (await client.get("/healthz")).status_code == 200
                start_status, start_took = await _timed(
                    client.post(
                        f"/v1/sessions/{name}-{fault}/runs", json={"input": "hi", "stream": False}
                    )
                )
                read_status, read_took = await _timed(client.get("/v1/sessions/before"))
                proxy.restore()
                up = await _ready_becomes(client, 200, within=20)
                figures.append(
                    f"{name} {fault}: /readyz 503 after {down:.1f} s; run start {start_status} "
                    f"in {start_took:.1f} s; GET session {read_status} in {read_took:.1f} s; "
                    f"ready again {up:.1f} s after the restore"
                )
                # bounded: a call waits AGENT_BACKEND_TIMEOUT (its attempts and the pool's
                # wait included), then 503; never the 30-60 s of unbounded waits
                assert start_took < BACKEND_TIMEOUT + 1.5, figures[-1]
                assert read_took < BACKEND_TIMEOUT + 1.5, figures[-1]
                if name == "PostgreSQL" or start_status != 200:
                    assert start_status == 503, figures[-1]
                again = await client.post(
                    f"/v1/sessions/after-{name}-{fault}/runs", json={"input": "hi", "stream": False}
                )
                assert again.status_code == 200, again.text
    print("\n" + "\n".join(figures))
    log = server.log()
    assert "is unreachable" in log and "is reachable again: ready" in log


async def test_a_run_ended_while_redis_is_down_leaves_no_route_entry() -> None:
    # a run ends by releasing its session lock, then its route; with Redis gone (restarting
    # empty) the release failed and the route's entry stayed in an idle worker for good
    from app.bus.base import BusUnavailable
    from app.bus.redis import RedisBus
    from tests.support.services import REDIS_URL, drop_prefix, new_prefix

    prefix = new_prefix()
    redis_port = urlsplit(REDIS_URL).port or 6379
    try:
        with FaultyProxy(redis_port) as proxy:
            bus = RedisBus(_through(REDIS_URL, proxy.port), prefix=prefix, call_timeout=1.5)
            await bus.start()
            try:
                lease = await bus.locks.acquire("s", "run_1", ttl=15)
                assert lease is not None
                await bus.router.register("run_1", "s")
                assert bus.stats()["routed_runs"] == 1
                proxy.refuse()
                with pytest.raises(BusUnavailable):
                    await bus.locks.release(lease)
                assert bus.stats()["routed_runs"] == 0
                assert bus.stats()["locks"] == 0
            finally:
                proxy.restore()
                await bus.aclose()
    finally:
        drop_prefix(prefix)
