"""Failover across bindings with real SDKs over loopback, and keys that never leak."""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentEventType, ModelBinding, ModelBindings, tool
from agent_runtime.bindings import PreflightError
from agent_runtime.errors import LoopAffinityError, ProviderError, RunTimeoutError
from agent_runtime.model import RetryOptions
from agent_runtime.providers.errors import parse_retry_after, redact
from tests.fakes.upstream import (
    Behaviour,
    Drop,
    Endless,
    FakeToolCall,
    FakeUpstream,
    Malformed,
    Respond,
    Stall,
    StreamError,
    Text,
    ToolCalls,
    freeze_imports,
    status,
)

freeze_imports()  # keep full collections short: see its docstring

KEY = "sk-failover-0123456789abcdef"
TIMEOUT = 0.3  # client_timeout of the stall tests: short, and only the stall waits for it


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server


def binding(
    upstream: FakeUpstream,
    model: str,
    protocol: str = "openai",
    *,
    key: str = KEY,
    **options: Any,
) -> ModelBinding:
    url = upstream.openai_url if protocol == "openai" else upstream.anthropic_url
    options.setdefault("client_max_retries", 0)
    return ModelBinding.llm(model=model, protocol=protocol, api_key=key, base_url=url, **options)


def chain(upstream: FakeUpstream, protocol: str = "openai", **options: Any) -> ModelBindings:
    return ModelBindings(
        llm=[
            binding(upstream, "primary", protocol, **options),
            binding(upstream, "fallback", protocol, **options),
        ]
    )


async def run(agent: AgentCore, prompt: str = "hello") -> list[AgentEvent]:
    return [event async for event in agent.stream(prompt)]


async def run_to_failure(
    agent: AgentCore, prompt: str = "hello"
) -> tuple[list[AgentEvent], ProviderError]:
    events: list[AgentEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in agent.stream(prompt):
            events.append(event)
    return events, caught.value


def text_of(events: list[AgentEvent]) -> str:
    return "".join(e.delta or "" for e in events if e.type is AgentEventType.TEXT_DELTA)


FAULTS: dict[str, Behaviour] = {
    "429-retry-after": status(429, retry_after=30),
    "500": status(500),
    "529-overloaded": status(529),
    "drop-before-first-chunk": Drop(),
    "drop-after-headers": Drop(send_headers=True),
    "body-ends-without-end-marker": Drop(clean=True),
    "stall-past-client-timeout": Stall(),
    "error-event-before-text": StreamError("overloaded_error"),
}


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_retryable_failure_before_any_text_fails_over(
    upstream: FakeUpstream, protocol: str, fault: str
) -> None:
    upstream.script(FAULTS[fault], model="primary")
    upstream.script(Text("answer from the fallback"), model="fallback")

    async with AgentCore.open(chain(upstream, protocol, client_timeout=TIMEOUT)) as agent:
        events = await run(agent)

    assert events[0].type is AgentEventType.RUN_STARTED and events[0].model == "primary"
    assert events[-1].type is AgentEventType.RUN_COMPLETED
    assert text_of(events) == "answer from the fallback"
    assert [r.model for r in upstream.requests] == ["primary", "fallback"]
    upstream.assert_consumed()


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "fault",
    [
        Drop(after_chunks=1, text="Half an answer"),
        Drop(after_chunks=1, text="Half an answer", clean=True),
        Endless(text="Half an answer", after_chunks=1),
    ],
    ids=["drop-after-first-chunk", "body-ends-after-first-chunk", "stall-after-first-chunk"],
)
async def test_a_failure_after_text_reached_the_consumer_fails_the_run(
    upstream: FakeUpstream, protocol: str, fault: Behaviour
) -> None:
    upstream.script(fault, model="primary")
    upstream.script(Text("never used"), model="fallback")

    async with AgentCore.open(chain(upstream, protocol, client_timeout=TIMEOUT)) as agent:
        events, error = await run_to_failure(agent)

    assert text_of(events) == "Half "
    failed = events[-1]
    assert failed.type is AgentEventType.RUN_FAILED
    assert failed.error_code == "provider_error" and error.code == "provider_error"
    assert error.retryable  # retryable, yet too late: the consumer already has text
    assert [r.model for r in upstream.requests] == ["primary"]
    assert upstream.remaining == 1


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize("code", [400, 401, 404, 422])
async def test_a_non_retryable_status_does_not_fail_over(
    upstream: FakeUpstream, protocol: str, code: int
) -> None:
    upstream.script(status(code, "your request is wrong"), model="primary")
    upstream.script(Text("never used"), model="fallback")

    async with AgentCore.open(chain(upstream, protocol)) as agent:
        events, error = await run_to_failure(agent)

    assert events[-1].type is AgentEventType.RUN_FAILED
    assert events[-1].error_code == "provider_error"
    assert (error.status_code, error.retryable) == (code, False)
    assert "your request is wrong" not in str(error)  # the upstream's text is not the message
    assert error.upstream_detail == "your request is wrong"
    assert [r.model for r in upstream.requests] == ["primary"]


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "answer",
    [Malformed(), Malformed(sse=True), Malformed(b"<html>502</html>", "text/html")],
    ids=["json-body", "sse-event", "html-body"],
)
async def test_a_malformed_200_is_a_provider_error_and_does_not_fail_over(
    upstream: FakeUpstream, protocol: str, answer: Malformed
) -> None:
    # the upstream answered, and what it answered is broken: not a dropped connection
    # (which would fail over), a provider_error with reason malformed_response
    upstream.script(answer, model="primary")
    upstream.script(Text("never used"), model="fallback")

    async with AgentCore.open(chain(upstream, protocol)) as agent:
        events, error = await run_to_failure(agent)

    assert type(error) is ProviderError
    assert (error.retryable, error.reason) == (False, "malformed_response")
    assert "malformed response" in str(error)
    failed = events[-1]
    assert failed.type is AgentEventType.RUN_FAILED
    assert failed.data()["error"]["code"] == "provider_error"
    assert failed.data()["error"]["reason"] == "malformed_response"
    assert [r.model for r in upstream.requests] == ["primary"]
    assert upstream.remaining == 1


async def test_a_stream_cut_cleanly_still_fails_over(upstream: FakeUpstream) -> None:
    # an event stream that ends before its end marker is a cut connection, not malformed
    upstream.script(Drop(clean=True), model="primary")
    upstream.script(Text("from the fallback"), model="fallback")

    async with AgentCore.open(chain(upstream)) as agent:
        events = await run(agent)

    assert events[-1].type is AgentEventType.RUN_COMPLETED
    assert [r.model for r in upstream.requests] == ["primary", "fallback"]


async def test_when_every_binding_fails_the_run_fails_with_the_last_error(
    upstream: FakeUpstream,
) -> None:
    upstream.script(status(500), model="primary")
    upstream.script(status(503, retry_after=1), model="fallback")

    async with AgentCore.open(chain(upstream)) as agent:
        events, error = await run_to_failure(agent)

    assert events[-1].error_code == "provider_error"
    assert (error.status_code, error.retry_after) == (503, 1.0)
    assert "fallback" in str(error)


async def test_failover_crosses_protocols(upstream: FakeUpstream) -> None:
    upstream.script(status(529), model="gpt-primary")
    upstream.script(Text("Claude took over"), model="claude-fallback")
    bindings = ModelBindings(
        llm=[
            binding(upstream, "gpt-primary", "openai"),
            binding(upstream, "claude-fallback", "anthropic"),
        ]
    )
    async with AgentCore.open(bindings) as agent:
        events = [event async for event in agent.stream("hi")]
    assert events[0].data()["model"] == "gpt-primary"  # run.started names the primary...
    usage = next(e for e in events if e.type is AgentEventType.USAGE)
    assert usage.data()["model"] == "claude-fallback"  # ...usage the model that answered
    assert events[-1].data()["usage"]["model"] == "claude-fallback"
    assert events[-1].data()["output"]["content"] == "Claude took over"
    assert [r.path for r in upstream.requests] == ["/v1/chat/completions", "/v1/messages"]


async def test_every_run_and_every_model_call_starts_at_the_primary(
    upstream: FakeUpstream,
) -> None:
    @tool
    def lookup(term: str) -> str:
        """Look a term up."""
        return f"{term} means yes"

    upstream.script(
        status(500),  # run 1, call 1
        Text("primary is back"),  # run 1, call 2 (after the tool)
        Text("run two on the primary"),  # run 2
        model="primary",
    )
    upstream.script(ToolCalls([FakeToolCall("lookup", {"term": "x"})]), model="fallback")

    async with AgentCore.open(chain(upstream), tools=[lookup]) as agent:
        first = await agent.chat("one")
        second = await agent.chat("two")

    assert first.content == "primary is back"
    assert second.content == "run two on the primary"
    assert [r.model for r in upstream.requests] == ["primary", "fallback", "primary", "primary"]
    upstream.assert_consumed()


async def test_retry_after_is_honoured_when_retrying_the_same_binding(
    upstream: FakeUpstream,
) -> None:
    delays: list[tuple[int, float | None]] = []

    class Recording(RetryOptions):
        def delay(self, attempt: int, retry_after: float | None = None) -> float:
            delays.append((attempt, retry_after))
            return 0.0  # the computed wait is checked below; the test itself never sleeps

    upstream.script(status(429, retry_after=7), Text("second attempt"), model="primary")
    bindings = ModelBindings(
        llm=[
            binding(upstream, "primary", retry=Recording(max_retries=1)),
            binding(upstream, "fallback"),
        ]
    )
    async with AgentCore.open(bindings) as agent:
        response = await agent.chat("hi")

    assert response.content == "second attempt"
    assert delays == [(1, 7.0)]
    assert [r.model for r in upstream.requests] == ["primary", "primary"]
    options = RetryOptions(max_retries=1, initial_delay=0.5, max_retry_after=60)
    assert options.delay(1, 7.0) == 7.0  # the upstream's wait wins over the backoff
    assert options.delay(1, 600.0) == 60.0  # and is capped


async def test_a_stream_that_never_ends_is_closed_at_the_run_deadline(
    upstream: FakeUpstream,
) -> None:
    upstream.script(Endless(text="endless", after_chunks=1, ping_interval=0.05))
    async with AgentCore.open(binding(upstream, "primary"), run_timeout=0.5) as agent:
        with pytest.raises(RunTimeoutError):
            await agent.chat("hi")
    await upstream.wait_until(lambda: upstream.active == 0)
    assert upstream.requests[0].outcome == "client disconnected"


def test_retry_after_parsing() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-3"}) is None
    assert parse_retry_after({}) is None
    date = "Wed, 21 Oct 2015 07:28:30 GMT"
    assert parse_retry_after({"retry-after": date}, now=1445412500.0) == 10.0


# keys never leak ------------------------------------------------------------------------------

CANARY = "sk-canary-" + secrets.token_hex(16)


def _chain_of(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def assert_clean(error: BaseException) -> None:
    text = "".join(traceback.format_exception(error))
    assert CANARY not in text
    for item in _chain_of(error):
        assert CANARY not in str(item)
        assert CANARY not in repr(item)
        assert CANARY not in repr(item.args)
        assert CANARY not in repr(getattr(item, "__dict__", {}))
        for name in ("request", "_request"):
            request = getattr(item, name, None)
            headers = getattr(request, "headers", None)
            if headers is not None:
                assert CANARY not in repr(dict(headers))


ECHO = f"Incorrect API key provided: {CANARY}. Authorization: Bearer {CANARY}"
LEAKY_FAULTS: dict[str, Behaviour] = {
    "401-echo": status(401, ECHO),
    "400-echo": status(400, ECHO),
    "429": status(429, ECHO, retry_after=1),
    "500": status(500, ECHO),
    "529": status(529, ECHO),
    "error-event": StreamError("invalid_request_error", ECHO),
    "error-event-after-text": StreamError("api_error", ECHO, after_chunks=1),
    "drop": Drop(),
    "drop-after-chunk": Drop(after_chunks=1),
    "reset": Drop(reset=True),
    "stall": Stall(),
    "bad-arguments": ToolCalls([FakeToolCall("lookup", '{"key": "' + CANARY)]),
}


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize("fault", list(LEAKY_FAULTS))
async def test_the_key_never_leaks_through_an_error_path(
    upstream: FakeUpstream, caplog: pytest.LogCaptureFixture, protocol: str, fault: str
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in (
        "openai",
        "anthropic",
        "httpx",
        "httpx2",
        "httpcore",
        "httpcore2",
        "agent_runtime",
    ):
        caplog.set_level(logging.DEBUG, logger=name)
    upstream.script(LEAKY_FAULTS[fault])
    bound = binding(upstream, "primary", protocol, key=CANARY, client_timeout=TIMEOUT)

    async with AgentCore.open(bound) as agent:
        events: list[AgentEvent] = []
        with pytest.raises(ProviderError) as caught:
            async for event in agent.stream("hello"):
                events.append(event)
        assert CANARY not in repr(bound) and CANARY not in repr(bound.provider)

    assert upstream.requests[0].api_key == CANARY  # the key did reach the upstream
    assert_clean(caught.value)
    assert events[-1].type is AgentEventType.RUN_FAILED
    assert CANARY not in (events[-1].error or "")
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in caplog.records:
        assert CANARY not in formatter.format(record)
        assert CANARY not in repr(record.__dict__)


async def test_the_key_never_leaks_from_refused_connections_or_setup_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = ModelBinding.llm(
        model="m", api_key=CANARY, base_url=f"http://127.0.0.1:{port}/v1", client_max_retries=0
    )
    async with AgentCore.open(refused) as agent:
        with pytest.raises(ProviderError) as caught:
            await agent.chat("hi")
    assert_clean(caught.value)

    def leaky_vault() -> str:
        raise RuntimeError(f"vault refused token {CANARY}")

    rotating = ModelBinding.llm(
        model="m", api_key=CANARY, base_url="http://127.0.0.1:9/v1", credential_provider=leaky_vault
    )
    await rotating.build_provider()
    with pytest.raises(ValueError, match="credential_provider") as refresh_error:
        await rotating.arefresh()
    assert_clean(refresh_error.value)
    await rotating.aclose()

    with pytest.raises(PreflightError) as preflight_error:
        await ModelBindings(llm=[rotating]).preflight()
    assert_clean(preflight_error.value)

    owner = ModelBinding.llm(model="m", api_key=CANARY, base_url="http://127.0.0.1:9/v1")
    await owner.preflight()

    async def elsewhere() -> LoopAffinityError:
        with pytest.raises(LoopAffinityError) as caught:
            await owner.preflight()
        return caught.value

    assert_clean(await asyncio.to_thread(asyncio.run, elsewhere()))
    assert CANARY not in repr(owner) and CANARY not in repr(owner.provider)
    await owner.aclose()
    for record in caplog.records:
        assert CANARY not in logging.Formatter().format(record)


def test_redact_covers_known_secrets_and_credential_shapes() -> None:
    text = f"key {CANARY}; Authorization: Bearer abc.def; api_key=xyz12345; sk-abcdefghijkl"
    cleaned = redact(text, [CANARY])
    assert CANARY not in cleaned and "abc.def" not in cleaned and "xyz12345" not in cleaned
    assert "sk-abcdefghijkl" not in cleaned
    assert redact("ollama is fine", ["ollama"]) == "ollama is fine"  # placeholders stay


async def test_the_fake_upstream_also_runs_on_a_thread_of_its_own() -> None:
    """Other suites drive a server process against it: it must not need the test's loop."""
    from openai import AsyncOpenAI

    echo = Respond(lambda request: Text(f"echo: {request.messages[-1]['content']}"))
    with FakeUpstream.in_thread(default=echo) as upstream:
        client = AsyncOpenAI(api_key=KEY, base_url=upstream.openai_url, max_retries=0)
        try:
            whole = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "ping"}]
            )
        finally:
            await client.close()
        async with AgentCore.open(binding(upstream, "m")) as agent:
            response = await agent.chat("pong")
        await upstream.wait_for_requests(2)
    assert whole.choices[0].message.content == "echo: ping"
    assert response.content == "echo: pong"
    assert [r.stream for r in upstream.requests] == [False, True]
