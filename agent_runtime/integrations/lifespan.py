"""``agent_lifespan``: an agent's whole life in an ASGI app's lifespan, in the right order.

Any ASGI framework (FastAPI, Starlette, Quart, aiohttp's cleanup context...) can host it::

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with agent_lifespan(bindings, tools=[...], skills=["./skills"]) as agent:
            app.state.agent = agent
            yield

On entry, on the running loop (the server's): build the agent (``AgentCore.create``, which
starts an ``mcp_client`` and registers its tools), ``preflight()`` every binding (no network
call), read the skill catalogue (in a worker thread), and run one warm-up call
(``max_iterations=1``, ``skill_dispatch=False``, no tool offered) so that the first user does
not pay for it. Any failure closes what was built and propagates: the process refuses to serve
rather than failing its first request. On exit: the agent (its runs, media jobs and providers),
then the MCP client if the lifespan was given ``close_mcp=True``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..agent import AgentCore, AgentResponse, AgentRunConfig, ModelLike

if TYPE_CHECKING:
    from ..mcp import MCPClient

__all__ = ["WARM_UP_PROMPT", "agent_lifespan", "warm_up"]

WARM_UP_PROMPT = "Reply with OK."


async def warm_up(
    agent: AgentCore,
    prompt: str = WARM_UP_PROMPT,
    *,
    session_id: str | None = None,
    run_timeout: float | None = 60.0,
) -> AgentResponse:
    """One short run that pays a first call's one-time costs (provider build, SDK imports,
    the skill catalogue) before traffic arrives: one model call, no skill dispatch, no tool
    offered (nothing may run or wait for an approval), an empty conversation."""
    if agent.skills is not None:
        await agent.skills.aload()
    return await agent.chat(
        prompt,
        config=AgentRunConfig(session_id=session_id) if session_id is not None else None,
        conversation=[],
        max_iterations=1,
        skill_dispatch=False,
        tool_filter=lambda _tool: False,
        run_timeout=run_timeout,
    )


@contextlib.asynccontextmanager
async def agent_lifespan(
    model: ModelLike,
    *,
    mcp_client: MCPClient | None = None,
    close_mcp: bool = False,
    preflight: bool = True,
    warm_up_prompt: str | None = WARM_UP_PROMPT,
    **agent_options: Any,
) -> AsyncIterator[AgentCore]:
    """Build, check and warm up an agent on the running loop; close it in order on exit.

    ``agent_options`` are ``AgentCore``'s (``tools``, ``extensions``, ``skills``,
    ``run_timeout``...). ``preflight=False`` skips the bindings' check (a configuration that is
    incomplete by design); ``warm_up_prompt=None`` skips the warm-up run. The agent never owns
    ``mcp_client``: ``close_mcp=True`` closes it after the agent.
    """
    try:
        agent = await AgentCore.create(model, mcp_client=mcp_client, **agent_options)
        try:
            if preflight:
                await agent.bindings.preflight()
            if warm_up_prompt is not None:
                await warm_up(agent, warm_up_prompt)
            elif agent.skills is not None:
                await agent.skills.aload()
            yield agent
        finally:
            await agent.aclose()
    finally:
        if close_mcp and mcp_client is not None:
            await mcp_client.close()
