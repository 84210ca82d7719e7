"""Each agent's warm-up state: what ``/readyz`` reports and what refuses an agent's runs.

An agent is ``starting`` until its first warm-up attempt ended, then ``ready`` (its model
answered the warm-up call), ``configured`` (``AGENT_WARMUP=0``: its bindings passed their
preflight and its MCP tools were discovered, but no model call was made) or ``unavailable``
(with the reason: which MCP server, which configuration key, which model). ``ready`` and
``configured`` both take runs. The worker is ready when every *required* agent is
(``required = false`` in ``AGENT_CONFIG`` makes one optional): one agent whose upstream always
fails no longer keeps a worker that serves the others out of a readiness-gated load balancer.
Runs of an ``unavailable`` agent get 503 ``agent_unavailable`` with the reason; the warm-up
keeps retrying it, and it serves again once an attempt succeeds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["AgentHealth", "AgentStates"]

AgentState = Literal["starting", "ready", "configured", "unavailable"]
# the states of an agent that takes runs
_SERVING: frozenset[AgentState] = frozenset({"ready", "configured"})


@dataclass(slots=True)
class AgentHealth:
    """One agent's warm-up state; ``reason`` says why it is unavailable."""

    name: str
    required: bool = True
    state: AgentState = "starting"
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The agent's entry in ``/readyz``."""
        entry: dict[str, Any] = {"status": self.state, "required": self.required}
        if self.reason:
            entry["reason"] = self.reason
        return entry


class AgentStates:
    """Every agent's ``AgentHealth``, by name (see the module docstring)."""

    def __init__(self, agents: Iterable[tuple[str, bool]]) -> None:
        self._agents = {name: AgentHealth(name, required) for name, required in agents}

    def __iter__(self) -> Any:
        return iter(self._agents.values())

    def get(self, name: str) -> AgentHealth | None:
        """The state of agent ``name`` (None for an agent that does not exist)."""
        return self._agents.get(name)

    def mark_ready(self, name: str) -> None:
        health = self._agents[name]
        health.state, health.reason = "ready", ""

    def mark_configured(self, name: str) -> None:
        """The agent takes runs without a warm-up call (``AGENT_WARMUP=0``)."""
        health = self._agents[name]
        health.state, health.reason = "configured", ""

    def mark_failed(self, name: str, reason: str) -> None:
        health = self._agents[name]
        health.state, health.reason = "unavailable", reason

    @property
    def all_ready(self) -> bool:
        """True when every agent, optional ones included, warmed up."""
        return all(health.state in _SERVING for health in self._agents.values())

    @property
    def ready(self) -> bool:
        """True when every required agent warmed up: the worker may take traffic."""
        return all(h.state in _SERVING for h in self._agents.values() if h.required)

    def unavailable(self, name: str) -> str | None:
        """Why agent ``name`` cannot take runs, or None when it can (or is still starting)."""
        health = self._agents.get(name)
        if health is None or health.state != "unavailable":
            return None
        return health.reason

    @property
    def problem(self) -> str:
        """What keeps the worker from being ready: the required agents not ready, and why."""
        waiting = [h for h in self._agents.values() if h.required and h.state not in _SERVING]
        parts = [
            f"agent {h.name!r} is {h.state}" + (f" ({h.reason})" if h.reason else "")
            for h in waiting
        ]
        return "; ".join(parts)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every agent's entry in ``/readyz``, by name."""
        return {name: health.to_dict() for name, health in self._agents.items()}
