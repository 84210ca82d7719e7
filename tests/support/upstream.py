"""A server whose model is the fake upstream: its environment, and a demo-like script for it.

Servers that talk to a model use ``AGENT_MODEL=openai:fake-model`` (or ``anthropic:fake-model``)
against ``FakeUpstream``, which speaks both wires, with the provider's API key set to a canary
key that must never show up anywhere but in the upstream's own request headers.
"""

from __future__ import annotations

import re
import secrets
from typing import Literal, TypeAlias

from tests.fakes.upstream import (
    Behaviour,
    Endless,
    FakeToolCall,
    FakeUpstream,
    RecordedRequest,
    Text,
    ToolCalls,
)

Provider: TypeAlias = Literal["openai", "anthropic"]
# the wires a server's model can speak to the fake upstream
PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic")

# a recognisable key without the "sk-" shape, so that only exact-secret redaction can hide it
CANARY = f"canary-{secrets.token_hex(20)}"

_DELETE = re.compile(r"\bdelete\s+(\S+)", re.IGNORECASE)


def last_message(request: RecordedRequest) -> tuple[bool, str]:
    """Whether the request's last message is a tool's result, and its text, on either wire.

    OpenAI sends a ``tool`` message with string content; Anthropic a ``user`` turn of blocks,
    ``tool_result`` or ``text``.
    """
    messages = request.messages
    last = messages[-1] if messages else {}
    if not isinstance(last, dict):
        return False, ""
    content = last.get("content")
    if not isinstance(content, list):
        return last.get("role") == "tool", str(content or "")
    blocks = [block for block in content if isinstance(block, dict)]
    results = [block for block in blocks if block.get("type") == "tool_result"]
    if results:
        return True, str(results[-1].get("content"))
    return False, "".join(str(block.get("text", "")) for block in blocks)


def demo_like(request: RecordedRequest) -> Behaviour:
    """The demo model's behaviour over either wire: ``delete NAME`` calls ``delete_file``
    (policy ``ask``), ``endless`` streams one chunk and then only keep-alives, anything else
    is echoed. A tool's result is answered with a sentence."""
    tool_result, prompt = last_message(request)
    if tool_result:
        return Text(f"The tool said: {prompt[:60]}")
    if "endless" in prompt:
        return Endless(text="this stream never ends", after_chunks=1, ping_interval=0.05)
    deletion = _DELETE.search(prompt)
    if deletion is not None:
        return ToolCalls([FakeToolCall("delete_file", {"path": deletion.group(1)})])
    return Text(f"You said: {prompt}")


def upstream_env(
    upstream: FakeUpstream, provider: Provider = "openai", **extra: str
) -> dict[str, str]:
    """The environment of a server whose model, ``PROVIDER:fake-model``, is the fake upstream
    (the provider's SDK, base URL and the canary as its key)."""
    if provider == "openai":
        wire = {"OPENAI_BASE_URL": upstream.openai_url, "OPENAI_API_KEY": CANARY}
    else:
        wire = {"ANTHROPIC_BASE_URL": upstream.anthropic_url, "ANTHROPIC_API_KEY": CANARY}
    return {
        "AGENT_MODEL": f"{provider}:fake-model",
        **wire,
        "AGENT_CLIENT_MAX_RETRIES": "0",
        "AGENT_CLIENT_TIMEOUT": "2",
        **extra,
    }
