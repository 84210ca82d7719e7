"""Configured agents: the names a run request's ``agent`` field may take.

Without ``AGENT_CONFIG`` there is one agent, ``default``. A TOML file can define more; each is
a set of per-run options over the worker's one ``AgentCore`` (so all share its model and
tools)::

    [policies]                  # tool name (or glob) -> allow | ask | deny
    delete_file = "ask"

    [agents.default]
    system_prompt = "You are terse."

    [agents.clock]
    system_prompt = "Tell the time."
    tools = ["current_time"]    # a subset of the tools; default: all
    run_timeout = 60            # seconds; default AGENT_RUN_TIMEOUT
    max_iterations = 4
    model_params = { temperature = 0.2 }
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_AGENT", "AgentProfile", "ServiceConfig", "load_config"]

DEFAULT_AGENT = "default"
_POLICIES = frozenset({"allow", "ask", "deny"})


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """One configured agent: options applied to each of its runs."""

    name: str
    system_prompt: str | None = None
    tools: frozenset[str] | None = None
    run_timeout: float | None = None
    max_iterations: int | None = None
    model_params: Mapping[str, Any] = field(default_factory=dict)

    def run_options(self) -> dict[str, Any]:
        """Keyword options for ``AgentCore.stream`` (the request may override some)."""
        options: dict[str, Any] = {"agent_name": self.name}
        if self.system_prompt is not None:
            options["system_prompt"] = self.system_prompt
        if self.tools is not None:
            allowed = self.tools
            options["tool_filter"] = lambda tool: tool.name in allowed
        if self.model_params:
            options["model_params"] = dict(self.model_params)
        return options


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What ``AGENT_CONFIG`` defines: agents by name and tool policies."""

    agents: Mapping[str, AgentProfile]
    policies: Mapping[str, str]


def default_config() -> ServiceConfig:
    """One agent, ``default``; the demo tools' own policies."""
    return ServiceConfig({DEFAULT_AGENT: AgentProfile(DEFAULT_AGENT)}, {})


def _number(where: str, value: Any, *, integer: bool = False) -> Any:
    wrong_kind = isinstance(value, bool) or not isinstance(value, int if integer else int | float)
    if wrong_kind or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{where} must be {kind}, got {value!r}")
    return value


def _profile(name: str, table: Any, path: str) -> AgentProfile:
    where = f"{path}: [agents.{name}]"
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    known = {"system_prompt", "tools", "run_timeout", "max_iterations", "model_params"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; known: {sorted(known)}")
    prompt = table.get("system_prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{where} system_prompt must be a string")
    tools = table.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)
    ):
        raise ValueError(f"{where} tools must be a list of tool names")
    timeout = table.get("run_timeout")
    iterations = table.get("max_iterations")
    params = table.get("model_params", {})
    if not isinstance(params, dict):
        raise ValueError(f"{where} model_params must be a table")
    return AgentProfile(
        name=name,
        system_prompt=prompt,
        tools=None if tools is None else frozenset(tools),
        run_timeout=None if timeout is None else float(_number(f"{where} run_timeout", timeout)),
        max_iterations=None
        if iterations is None
        else int(_number(f"{where} max_iterations", iterations, integer=True)),
        model_params=params,
    )


def load_config(path: str | None) -> ServiceConfig:
    """Read ``AGENT_CONFIG``; raises ValueError with the file and the key at fault."""
    if path is None:
        return default_config()
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"AGENT_CONFIG {path!r} cannot be read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"AGENT_CONFIG {path!r} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - {"agents", "policies"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {unknown}; known: agents, policies")
    agents_table = data.get("agents", {})
    if not isinstance(agents_table, dict):
        raise ValueError(f"{path}: agents must be a table of tables")
    agents = {name: _profile(name, table, path) for name, table in agents_table.items()}
    agents.setdefault(DEFAULT_AGENT, AgentProfile(DEFAULT_AGENT))
    policies_table = data.get("policies", {})
    if not isinstance(policies_table, dict):
        raise ValueError(f"{path}: policies must be a table")
    policies: dict[str, str] = {}
    for tool_name, policy in policies_table.items():
        if policy not in _POLICIES:
            raise ValueError(
                f"{path}: policy of {tool_name!r} must be one of {sorted(_POLICIES)}, "
                f"got {policy!r}"
            )
        policies[tool_name] = policy
    return ServiceConfig(agents, policies)
