"""Secrets: a canary provider key driven through every error path is seen by the upstream only.

A server at ``AGENT_LOG_LEVEL=debug`` (and the OpenAI SDK's own debug logging on) holds the
canary as ``OPENAI_API_KEY``. The fake upstream answers with every kind of failure (statuses
from 400 to 529, some of them echoing the key back in their error text, resets, drops, error
events, stalls past the client timeout, a stream that never ends) and the test collects
everything the service says: every SSE byte, every problem and run body, ``/metrics``,
``/debug/state`` and the process's whole stdout and stderr. No fragment of the key may appear
in any of it. In-process, the same failures' exceptions, tracebacks and the reprs of the
bindings, providers and settings are checked the same way.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from agent_runtime.agent import AgentCore
from agent_runtime.bindings import ModelBindings, binding_from_spec
from app.auth.keys import Authenticator
from app.settings import Settings
from tests.fakes.upstream import (
    Behaviour,
    Drop,
    Endless,
    FakeUpstream,
    Respond,
    Stall,
    StreamError,
    Text,
    status,
)
from tests.support.auth import API_KEYS, KEYS, auth
from tests.support.probes import wait_idle
from tests.support.server import Server, launch, stop
from tests.support.sse import read_events
from tests.support.upstream import CANARY, demo_like, upstream_env

# every 12-character window of the key: a truncated or partly masked copy is still a leak
WINDOWS = [CANARY[i : i + 12] for i in range(len(CANARY) - 11)]


def leaked(text: str) -> list[str]:
    """The windows of the canary found in ``text`` (none, for a clean text)."""
    return [window for window in WINDOWS if window in text]


ECHO = f"Incorrect API key provided: {CANARY}. Authorization: Bearer {CANARY}"
# how OpenAI quotes a wrong key: masked, most of it still there (17 of its 47 characters)
MASKED_TAIL = CANARY[-8:]
MASKED = f"Incorrect API key provided: {CANARY[:9]}*****{MASKED_TAIL}. You can find your key"
FAULTS: list[tuple[str, Behaviour]] = [
    ("401-masked-key", status(401, MASKED, error_type="invalid_request_error")),
    ("400", status(400, ECHO)),
    ("401-echoing-the-key", status(401, ECHO, error_type="invalid_api_key")),
    ("403", status(403, ECHO)),
    ("404", status(404, f"model not found for key {CANARY}")),
    ("408", status(408)),
    ("409", status(409)),
    ("422", status(422, ECHO)),
    ("429", status(429, ECHO, retry_after=1)),
    ("500", status(500, ECHO)),
    ("502", status(502)),
    ("503", status(503, ECHO)),
    ("529", status(529, ECHO, error_type="overloaded_error")),
    ("header-echo", status(500, "see header", headers={"x-echo": CANARY})),
    ("reset", Drop(reset=True)),
    ("reset-mid-stream", Drop(after_chunks=1, reset=True)),
    ("closed-mid-stream", Drop(after_chunks=1)),
    ("error-event", StreamError("server_error", ECHO)),
    ("error-event-mid-stream", StreamError("invalid_request_error", ECHO, after_chunks=1)),
    ("stall", Stall()),
    ("silent-after-text", Endless(after_chunks=1)),
    ("endless", Endless(after_chunks=1, ping_interval=0.1)),
]


@pytest.fixture(scope="module")
def server(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    failed = request.session.testsfailed
    running = launch(
        tmp_path_factory.mktemp("secrets"),
        upstream_env(
            upstream,
            AGENT_LOG_LEVEL="debug",
            OPENAI_LOG="debug",
            AGENT_API_KEYS=API_KEYS,
            AGENT_DEBUG_ENDPOINTS="1",
            AGENT_CLIENT_TIMEOUT="0.5",
            AGENT_CLIENT_MAX_RETRIES="1",
            AGENT_FALLBACK_MODELS="openai:fake-fallback",
        ),
    )
    yield running
    stop(running, request, failed)


@pytest.mark.slow
async def test_the_canary_appears_nowhere(server: Server, upstream: FakeUpstream) -> None:
    said: list[str] = []  # everything the service answered
    first = len(upstream.requests)
    async with server.client(headers=auth("alice")) as client:
        for name, fault in FAULTS:
            # every call meets the fault: the primary, its SDK retry, the fallback
            upstream.default = Respond(lambda _, fault=fault: fault)  # type: ignore[misc]
            try:
                async with asyncio.timeout(20):
                    events, response = await read_events(
                        client,
                        "POST",
                        f"/v1/sessions/secret-{name}/runs",
                        json={"input": "hello", "run_timeout": 3},
                    )
            finally:
                upstream.default = Respond(demo_like)
            assert response.status_code == 200, name
            run_id = response.headers["x-run-id"]
            assert events[-1].type == "run.failed", (name, events[-1])
            replay = await client.get(f"/v1/runs/{run_id}/events")
            said.append(replay.text)
            said.append((await client.get(f"/v1/runs/{run_id}")).text)
            said.append(
                (
                    await client.post(
                        "/v1/sessions/secret/runs", json={"input": "x", "stream": False}
                    )
                ).text
            )
            await upstream.wait_until(lambda: upstream.active == 0, limit=10)
        # every request upstream carried the canary: the key was in play on every path
        assert {request.api_key for request in upstream.requests[first:]} == {CANARY}
        # a client presenting the canary as its own key is refused without an echo
        for header in (f"Bearer {CANARY}", CANARY, f"Basic {CANARY}", f"Bearer  {CANARY} x"):
            refused = await client.get("/v1/sessions/s", headers={"Authorization": header})
            assert refused.status_code == 401
            said.append(refused.text)
            said.append(str(refused.headers))
        # validation problems do not echo input either
        said.append(
            (await client.post("/v1/sessions/s/runs", json={"input": "x", "key": CANARY})).text
        )
        said.append((await client.get("/metrics")).text)
        said.append((await client.get("/debug/state", params={"gc": "true"})).text)
        said.append((await client.get("/openapi.json")).text)
        await wait_idle(client, headers=auth("alice"))
    server.stop()  # flush and close the log
    log = server.log()
    # debug logging was on: the service logs prompts, the SDK its requests and retries
    assert '"input": "hello"' in log
    assert "openai._base_client" in log and "Retrying request" in log
    # the upstream's own error text reaches no client (status and error type do); the log
    # has it at debug, redacted, masked forms included
    assert any("answered HTTP 401 (invalid_api_key)" in text for text in said)
    assert not any("Incorrect API key" in text for text in said)
    assert "upstream error text: Incorrect API key provided: [REDACTED]" in log
    for text in [*said, log]:
        assert not leaked(text), leaked(text)
        assert MASKED_TAIL not in text
    for key in KEYS.values():  # the service's own API keys neither
        assert key not in log


async def test_exceptions_tracebacks_and_reprs_hold_no_key(upstream: FakeUpstream) -> None:
    binding = binding_from_spec(
        "openai:fake-model",
        OPENAI_API_KEY=CANARY,
        OPENAI_BASE_URL=upstream.openai_url,
        client_timeout=0.5,
        client_max_retries=0,
    )
    # every fault ends within the client timeout; the run's own deadline is only a backstop
    # (the first call also builds the SDK client: seconds on a loaded machine)
    agent = await AgentCore.create(ModelBindings(llm=[binding]), run_timeout=15)
    texts = [repr(binding), repr(agent)]
    try:
        for _, fault in FAULTS:
            upstream.script(fault, model="fake-model")
            with pytest.raises(Exception) as caught:
                await agent.chat("hello")
            texts.append(repr(caught.value))
            texts.append("".join(traceback.format_exception(caught.value)))
            texts.append(repr(binding))
        upstream.script(Text("fine"), model="fake-model")
        await agent.chat("hello")
        texts.extend([repr(binding), repr(agent.bindings)])
        provider = getattr(binding, "_current", None)
        texts.append(repr(provider))
    finally:
        await agent.aclose()
    upstream.assert_consumed()
    settings = Settings(api_keys=SecretStr(f"{CANARY}=alice"))
    texts.extend([repr(settings), str(settings), repr(Authenticator(settings.api_key_map))])
    for text in texts:
        assert not leaked(text), (leaked(text), text[:500])
