"""agent_lifespan: build on the running loop, preflight, warm up, close in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_runtime import ModelBinding, ModelBindings, PreflightError, ProviderError, tool
from agent_runtime.integrations.lifespan import agent_lifespan
from agent_runtime.mcp import MCPClient, MCPServerConfig
from agent_runtime.skills import SkillManager
from agent_runtime.testing import ScriptedModel
from tests.fakes.mcp_servers import stdio_command
from tests.fakes.upstream import FakeUpstream, Text, freeze_imports, status

freeze_imports()


@tool
def never() -> str:
    """Must not run during a warm-up."""
    raise AssertionError("a tool ran during the warm-up")


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


async def test_enter_builds_checks_and_warms_up_then_exit_closes(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    (tmp_path / "a-skill").mkdir()
    (tmp_path / "a-skill" / "SKILL.md").write_text("---\nname: a-skill\ndescription: A.\n---\nB\n")
    upstream.script(Text("OK"), Text("hello"))
    binding = ModelBinding.llm(
        model="gpt-test", api_key="sk-test", base_url=upstream.openai_url, client_max_retries=0
    )
    router = ScriptedModel([])  # dispatch is off in the warm-up: never asked
    skills = SkillManager([tmp_path])
    bindings = ModelBindings(llm=binding, system_one=router)
    async with agent_lifespan(bindings, tools=[never], skills=skills) as agent:
        assert binding.built  # preflight built it on this loop
        assert binding.owner_loop is asyncio.get_running_loop()
        assert skills.loaded
        [warm] = upstream.requests
        body = warm.json
        assert body["messages"][-1] == {"role": "user", "content": "Reply with OK."}
        assert "tools" not in body  # no tool offered: none may run
        assert (await agent.chat("hi", skill_dispatch=False)).content == "hello"
    assert agent.closed
    assert binding.providers_closed == 1  # the provider it built is closed
    assert router.requests == []


async def test_a_failing_preflight_refuses_to_serve() -> None:
    binding = ModelBinding.llm(model="gpt-test", api_key_env="NO_SUCH_KEY_VARIABLE_X")
    with pytest.raises(PreflightError):
        async with agent_lifespan(binding):
            pytest.fail("served after a failed preflight")


async def test_a_failing_warm_up_refuses_to_serve_and_closes_the_agent(
    upstream: FakeUpstream,
) -> None:
    upstream.script(status(401))
    binding = ModelBinding.llm(
        model="gpt-test", api_key="sk-test", base_url=upstream.openai_url, client_max_retries=0
    )
    with pytest.raises(ProviderError):
        async with agent_lifespan(binding):
            pytest.fail("served after a failed warm-up")
    assert not binding.built


async def test_the_mcp_client_is_started_and_closed_after_the_agent() -> None:
    command, args, cwd = stdio_command()
    client = MCPClient([MCPServerConfig.stdio("st", command, args, cwd=cwd)])
    model = ScriptedModel(["OK"])
    async with agent_lifespan(model, mcp_client=client, close_mcp=True) as agent:
        assert client.started
        assert any(t.name.startswith("st__") for t in agent.registry)
        assert model.requests[0].tools == []
    assert agent.closed
    assert client.closed
