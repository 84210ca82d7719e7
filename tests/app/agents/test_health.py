"""Each agent's warm-up state and what the worker's readiness makes of it."""

from __future__ import annotations

from app.agents.health import AgentStates


def verdict(states: AgentStates) -> tuple[bool, bool, str]:
    return states.ready, states.all_ready, states.problem


def test_the_worker_is_ready_when_its_required_agents_are() -> None:
    states = AgentStates([("default", True), ("extra", False)])
    assert not states.ready and states.problem == "agent 'default' is starting"
    assert states.unavailable("extra") is None  # starting: its runs are not refused yet
    states.mark_failed("extra", "MCP server 'x' (agents.extra.mcp_servers) could not be reached")
    states.mark_ready("default")
    # (read again through a function: mypy would keep the narrowing of the assert above)
    assert verdict(states) == (True, False, "")
    assert states.unavailable("extra") == (
        "MCP server 'x' (agents.extra.mcp_servers) could not be reached"
    )
    assert states.to_dict() == {
        "default": {"status": "ready", "required": True},
        "extra": {
            "status": "unavailable",
            "required": False,
            "reason": "MCP server 'x' (agents.extra.mcp_servers) could not be reached",
        },
    }
    states.mark_ready("extra")  # a later warm-up round succeeded
    assert verdict(states) == (True, True, "")
    assert states.unavailable("extra") is None
    assert states.unavailable("nobody") is None


def test_a_required_agent_that_failed_is_the_problem() -> None:
    states = AgentStates([("default", True), ("files", True)])
    states.mark_ready("default")
    states.mark_failed("files", "boom")
    assert not states.ready
    assert states.problem == "agent 'files' is unavailable (boom)"
