"""Protocol SDKs load on the first request to their endpoint (``app.http.protocols.loading``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.http.protocols.loading import DeferredEndpoint


def test_a_worker_starts_without_the_a2a_and_mcp_sdks() -> None:
    # a fresh interpreter: the test process itself has imported both long ago
    script = (
        "import sys, app.main\n"
        "app.main.create_app(configure_logs=False)\n"
        "loaded = sorted({name.split('.')[0] for name in sys.modules} & {'a2a', 'mcp'})\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == ""


class _Endpoint:
    def __init__(self) -> None:
        self.calls = 0
        self.serving = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        assert self.serving
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class _Recorder:
    def __init__(self) -> None:
        self.built: list[_Endpoint] = []
        self.entered = 0
        self.left = 0
        self.entering = asyncio.Event()
        self.release = asyncio.Event()

    def build(self, module: types.ModuleType) -> _Endpoint:
        assert module.__name__ == "json"
        endpoint = _Endpoint()
        self.built.append(endpoint)
        return endpoint

    @asynccontextmanager
    async def serve(self, endpoint: _Endpoint) -> AsyncIterator[None]:
        self.entered += 1
        self.entering.set()
        await self.release.wait()  # the first requests wait until the lifetime is entered
        endpoint.serving = True
        try:
            yield
        finally:
            endpoint.serving = False
            self.left += 1


async def test_concurrent_first_requests_build_and_enter_it_once() -> None:
    recorder = _Recorder()
    deferred = DeferredEndpoint("json", recorder.build, serve=recorder.serve)
    transport = httpx.ASGITransport(app=deferred)
    async with deferred.running():
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            requests = [asyncio.ensure_future(client.get("/")) for _ in range(5)]
            await recorder.entering.wait()
            assert not any(request.done() for request in requests)
            recorder.release.set()
            answers = await asyncio.gather(*requests)
            assert [answer.text for answer in answers] == ["ok"] * 5
            assert (await client.get("/")).status_code == 200
        assert len(recorder.built) == 1 and recorder.built[0].calls == 6
        assert recorder.entered == 1 and recorder.left == 0
    assert recorder.left == 1  # wound down with the service


async def test_a_request_after_the_service_ended_is_503_and_builds_nothing() -> None:
    recorder = _Recorder()
    deferred = DeferredEndpoint("json", recorder.build, serve=recorder.serve)
    async with deferred.running():
        pass
    transport = httpx.ASGITransport(app=deferred)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get("/")
    assert answer.status_code == 503
    assert recorder.built == [] and recorder.entered == 0


async def test_a_request_that_goes_away_does_not_abandon_the_import() -> None:
    recorder = _Recorder()
    recorder.release.set()
    deferred = DeferredEndpoint("json", recorder.build, serve=recorder.serve)
    async with deferred.running():
        first = asyncio.ensure_future(deferred.module())
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        module = await deferred.module()
        assert module.__name__ == "json"
        assert await deferred.endpoint() is recorder.built[0]


async def test_a_request_that_goes_away_while_it_is_entered_leaves_one_lifetime() -> None:
    recorder = _Recorder()
    deferred = DeferredEndpoint("json", recorder.build, serve=recorder.serve)
    async with deferred.running():
        first = asyncio.ensure_future(deferred.endpoint())
        await recorder.entering.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        recorder.release.set()
        endpoint = await deferred.endpoint()
        assert endpoint is recorder.built[0] and endpoint.serving
        assert len(recorder.built) == 1 and recorder.entered == 1
    assert recorder.left == 1 and not endpoint.serving
