"""A fake model upstream: real HTTP on loopback, speaking the OpenAI and Anthropic wire formats.

The real SDKs talk to it through their real HTTP stack, so tests exercise exactly what runs in
production: request encoding, SSE decoding, status handling, timeouts and dropped connections.

- ``POST /v1/chat/completions``: OpenAI Chat Completions (``data: {...}`` chunks, ``[DONE]``);
- ``POST /v1/messages``: Anthropic Messages (``event: message_start`` ... ``message_stop``);
- ``POST /v1/responses``: OpenAI Responses (``response.created`` ... ``response.completed``);
- embeddings, ``/rerank``, images, speech, transcriptions and video jobs: see
  ``capability_wire`` (deterministic answers, unless a behaviour is scripted).

Each request takes the next *behaviour* from a queue (per model name first, then the shared
one); the behaviour is rendered in the wire format of the path it arrived on::

    async with FakeUpstream() as upstream:
        upstream.script(Text("Hello there"), status(429, retry_after=2), Drop())
        binding = ModelBinding.llm(model="m", base_url=upstream.openai_url, api_key="k")

An answer may reason first (``Text(..., reasoning=[Reasoning("...")])``: signed Anthropic
thinking, redacted thinking, Responses reasoning items with ``encrypted_content``, Chat
``reasoning_content``) and report cache and reasoning token counts (``details=UsageDetails``).

Every request is recorded (method, path, headers with the credential, JSON body). Tests wait
for observable state with ``await upstream.wait_until(lambda: ...)``, never with sleeps.

The server runs on the current event loop (``async with FakeUpstream()``) or, for tests that
drive another process or block their own loop, on a loop in a daemon thread
(``with FakeUpstream.in_thread() as upstream``).

The modules::

    behaviours      what a test scripts: Text, ToolCalls, Status, Drop, Stall, Endless, ...;
                    Reasoning and UsageDetails inside an answer
    gates           Gate: holds streams until a test opens it
    recording       RecordedRequest: one request as the server received it
    frames          what both wires share: a streamed frame, error types, default usage
    openai_wire     an answer on the OpenAI Chat Completions wire
    anthropic_wire  an answer on the Anthropic Messages wire
    responses_wire  an answer on the OpenAI Responses wire
    cache_accounting  usage as a prompt cache would count it (``FakeUpstream(prompt_cache=True)``)
    answers         a behaviour rendered on a wire (streamed, whole, or a failure)
    http_wire       HTTP/1.1 on an asyncio stream: requests, responses, chunked streams
    server          FakeUpstream: scripting, observation, lifecycle, one answer per request
    collector       freeze_imports: the collector's pauses out of loop-blocking checks
"""

from __future__ import annotations

from ..capability_wire import FakeVideo, Hold
from .behaviours import (
    Behaviour,
    Drop,
    Endless,
    FakeToolCall,
    Malformed,
    Reasoning,
    Respond,
    Stall,
    Status,
    StreamError,
    Text,
    ToolCalls,
    UsageDetails,
    status,
)
from .collector import freeze_imports
from .gates import Gate
from .recording import RecordedRequest
from .server import FakeUpstream

__all__ = [
    "Behaviour",
    "Drop",
    "Endless",
    "FakeToolCall",
    "FakeUpstream",
    "FakeVideo",
    "Gate",
    "Hold",
    "Malformed",
    "Reasoning",
    "RecordedRequest",
    "Respond",
    "Stall",
    "Status",
    "StreamError",
    "Text",
    "ToolCalls",
    "UsageDetails",
    "freeze_imports",
    "status",
]
