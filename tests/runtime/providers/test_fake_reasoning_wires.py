"""The fake upstream's reasoning, usage details and Responses events, read by the SDKs' own
typed parsers: what the providers are tested against is what the real SDKs understand."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from anthropic import AsyncAnthropic
from anthropic.types import RedactedThinkingBlock, ThinkingBlock
from openai import AsyncOpenAI
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
)

from tests.fakes.upstream import (
    FakeToolCall,
    FakeUpstream,
    Reasoning,
    Text,
    ToolCalls,
    UsageDetails,
    freeze_imports,
)

freeze_imports()


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


async def test_responses_events_parse_as_the_sdks_types(upstream: FakeUpstream) -> None:
    upstream.script(
        ToolCalls(
            [FakeToolCall("weather", {"city": "Oslo"}, id="call_1")],
            text="Let me see.",
            reasoning=[Reasoning("Check the weather.", id="rs_1", encrypted="ENC")],
            usage=(100, 20),
            details=UsageDetails(cached=60, reasoning=7),
        )
    )
    client = AsyncOpenAI(api_key="k", base_url=upstream.openai_url, max_retries=0)
    try:
        stream = await client.responses.create(model="m", input="hi", stream=True)
        events = [event async for event in stream]
    finally:
        await client.close()

    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(numbers)))
    summary = [e.delta for e in events if isinstance(e, ResponseReasoningSummaryTextDeltaEvent)]
    assert "".join(summary) == "Check the weather."
    completed = events[-1]
    assert isinstance(completed, ResponseCompletedEvent)
    reasoning, message, call = completed.response.output
    assert isinstance(reasoning, ResponseReasoningItem)
    assert (reasoning.id, reasoning.encrypted_content) == ("rs_1", "ENC")
    assert isinstance(message, ResponseOutputMessage)
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.call_id, call.arguments) == ("call_1", '{"city": "Oslo"}')
    usage = completed.response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (100, 20)
    assert usage.input_tokens_details.cached_tokens == 60
    assert usage.output_tokens_details.reasoning_tokens == 7


async def test_anthropic_thinking_accumulates_in_the_sdks_message(upstream: FakeUpstream) -> None:
    upstream.script(
        Text(
            "Hi.",
            reasoning=[Reasoning("hm", signature="SIG"), Reasoning(redacted="DATA")],
            usage=(10, 5),
            details=UsageDetails(cached=60, cache_write=30, reasoning=3),
        )
    )
    client = AsyncAnthropic(api_key="k", base_url=upstream.anthropic_url, max_retries=0)
    try:
        async with client.messages.stream(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            message = await stream.get_final_message()
    finally:
        await client.close()

    thinking, redacted, text = message.content
    assert isinstance(thinking, ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("hm", "SIG")
    assert isinstance(redacted, RedactedThinkingBlock) and redacted.data == "DATA"
    assert text.type == "text"
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (10, 60)
    assert usage.cache_creation_input_tokens == 30
    assert usage.output_tokens_details is not None
    assert usage.output_tokens_details.thinking_tokens == 3


async def test_chat_usage_details_parse_as_the_sdks_types(upstream: FakeUpstream) -> None:
    upstream.script(Text("ok", usage=(9, 2), details=UsageDetails(cached=4, reasoning=1)))
    client = AsyncOpenAI(api_key="k", base_url=upstream.openai_url, max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 4
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 1
