"""Reasoning from the providers' own wires through a real server: an agent on
``anthropic:MODEL`` with thinking on, and one on ``openai-responses:MODEL``, both answered by
the fake upstream (real SDKs, real HTTP). The service streams the reasoning as
``reasoning.delta``, stores its text with the turn, reports the cache and reasoning counts,
and hands the signed state (an Anthropic signature, a Responses ``encrypted_content``) back to
the provider within the run, and to no client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.upstream import (
    FakeToolCall,
    FakeUpstream,
    Reasoning,
    Text,
    ToolCalls,
    UsageDetails,
)
from tests.support.server import Server, launch
from tests.support.sse import read_events

AGENTS = """
[agents.claude]
model = "anthropic:claude-test"
tools = ["current_time"]
model_params = { thinking = { type = "enabled", budget_tokens = 1024 } }

[agents.reasoner]
model = "openai-responses:o-test"
tools = ["current_time"]

[agents.uncached]
model = "anthropic:claude-uncached"
prompt_caching = false
"""
FIRST = Reasoning("I need the clock first.", signature="SIGNED-claude-1", encrypted="ENC-o-1")
SECOND = Reasoning("The tool gave the time.", signature="SIGNED-claude-2", encrypted="ENC-o-2")
SECRETS = ("SIGNED-claude", "ENC-o")
MODELS = {"claude": "claude-test", "reasoner": "o-test"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def provider_server(
    tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("reasoning-providers")
    config = directory / "agents.toml"
    config.write_text(AGENTS, encoding="utf-8")
    server = launch(
        directory / "server",
        {
            "AGENT_CONFIG": str(config),
            "AGENT_WARMUP": "0",
            "ANTHROPIC_BASE_URL": upstream.anthropic_url,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "OPENAI_BASE_URL": upstream.openai_url,
            "OPENAI_API_KEY": "sk-openai-test",
        },
    )
    yield server
    server.stop()


def _sent_back(body: dict[str, Any]) -> str:
    """What a request sent the model, as text (to look for the signed state in it)."""
    return json.dumps(body.get("messages") or body.get("input") or [])


@pytest.mark.parametrize("agent", ["claude", "reasoner"])
async def test_a_provider_s_reasoning_through_the_service(
    agent: str, upstream: FakeUpstream, provider_server: Server
) -> None:
    model = MODELS[agent]
    details = UsageDetails(cached=900, cache_write=100, reasoning=12)
    upstream.script(
        ToolCalls(
            [FakeToolCall("current_time", {})], reasoning=[FIRST], usage=(1200, 30), details=details
        ),
        Text("It is noon.", reasoning=[SECOND], usage=(1300, 20), details=details),
        Text("You are welcome."),
        model=model,
    )
    before = len(upstream.requests)
    session = f"providers-{agent}"
    async with provider_server.client() as http:
        events, _ = await read_events(
            http,
            "POST",
            f"/v1/sessions/{session}/runs",
            json={"input": "what time is it?", "agent": agent},
        )
        assert events[-1].type == "run.completed", events[-1].data
        said = "".join(e.data["data"]["delta"] for e in events if e.type == "reasoning.delta")
        assert said == FIRST.text + SECOND.text
        kinds = [e.type for e in events]
        assert kinds.index("reasoning.delta") < kinds.index("tool.call.started")
        usage = events[-1].data["data"]["usage"]
        assert usage["cached_input_tokens"] == 2 * 900
        assert usage["cache_write_tokens"] == 2 * 100
        assert usage["reasoning_tokens"] == 2 * 12
        if agent == "claude":  # Anthropic's input_tokens leave the cached part out; ours not
            assert usage["input_tokens"] == 1200 + 1300 + 2 * (900 + 100)
        else:
            assert usage["input_tokens"] == 1200 + 1300

        # the second call of the run got the first call's signed state back, as it was made
        first_call, second_call = upstream.requests[before : before + 2]
        assert all(secret not in _sent_back(first_call.json) for secret in SECRETS)
        signed = FIRST.signature_value if agent == "claude" else FIRST.encrypted_value
        assert signed in _sent_back(second_call.json)

        listed = await http.get(f"/v1/sessions/{session}/messages")
        assistants = [m for m in listed.json()["messages"] if m["role"] == "assistant"]
        assert [m.get("reasoning") for m in assistants] == [FIRST.text, SECOND.text]
        record = await http.get(f"/v1/runs/{events[-1].data['run_id']}")
        for client_sees in (listed.text, record.text, json.dumps([e.data for e in events])):
            assert all(secret not in client_sees for secret in SECRETS)

        # the next run of the session sends the earlier turns without their signed state
        again = await http.post(
            f"/v1/sessions/{session}/runs",
            json={"input": "thanks", "agent": agent, "stream": False},
        )
        assert again.json()["output"]["content"] == "You are welcome."
        assert all(secret not in _sent_back(upstream.requests[-1].json) for secret in SECRETS)


async def test_an_agent_s_prompt_caching_switch_reaches_its_requests(
    upstream: FakeUpstream, provider_server: Server
) -> None:
    upstream.script(Text("Cached."), model="claude-test")
    upstream.script(Text("Not cached."), model="claude-uncached")
    async with provider_server.client() as http:
        for agent in ("claude", "uncached"):
            done = await http.post(
                f"/v1/sessions/caching-{agent}/runs",
                json={"input": "hello", "agent": agent, "stream": False},
            )
            assert done.json()["status"] == "completed", done.text
    bodies = {r.model: json.dumps(r.json) for r in upstream.requests[-2:]}
    # on by default: cache_control breakpoints; off for the agent that says so
    assert "cache_control" in bodies["claude-test"]
    assert "cache_control" not in bodies["claude-uncached"]
    assert "prompt_caching" not in bodies["claude-test"] + bodies["claude-uncached"]
