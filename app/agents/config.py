"""``AGENT_CONFIG``: the TOML file of named agents, read and validated.

``load_config(path)`` returns a ``ServiceConfig``: every agent's definition (an
``AgentProfile``) and every MCP server. It imports the tools and ``python:`` model factories the
file names (calling none of them) and checks every model spec; it starts nothing. Building the
agents is ``app.agents.build``'s part. The schema is in ``docs/configuration.md``;
``docs/examples/agents.toml`` uses every key.

Every problem is a ``ConfigError`` (a ``ValueError``) whose message names the file and the key::

    agents.toml: agents.research.max_iterations: expected a positive integer, got 0
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import os
import re
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent_runtime.bindings import binding_from_spec
from agent_runtime.errors import ConfigurationError
from agent_runtime.mcp import MCPServerConfig
from agent_runtime.providers.caching import PROMPT_CACHING
from agent_runtime.providers.demo import current_time, delete_file
from agent_runtime.run_options import RunOptions
from agent_runtime.tools.base import Tool, tool
from app.agents.capabilities import (
    AGENT_KEYS as _CAPABILITY_KEYS,
)
from app.agents.capabilities import (
    SECTIONS as _CAPABILITY_SECTIONS,
)
from app.agents.capabilities import (
    CapabilitySpec,
    agent_capabilities,
    capability_sections,
)
from app.agents.toml import (
    ENV_REFERENCE,
    ConfigError,
    Table,
    describe,
    expand,
    key_path,
)
from app.webhooks.targets import TargetRefused, check_url

__all__ = [
    "BUILTIN_TOOLS",
    "DEFAULT_AGENT",
    "PROMPT_CACHING",
    "PYTHON_MODEL_PREFIX",
    "AgentProfile",
    "CompactionSpec",
    "ConfigError",
    "ServiceConfig",
    "default_config",
    "environment_references",
    "import_object",
    "key_path",
    "load_config",
    "resolve_tool",
]

DEFAULT_AGENT = "default"
PYTHON_MODEL_PREFIX = "python:"
BUILTIN_TOOLS: Mapping[str, Tool] = {"current_time": current_time, "delete_file": delete_file}
"""Tools a configuration names by their bare name; anything else is ``module:function``."""

_DEMO_POLICIES = {"current_time": "allow", "delete_file": "ask"}
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TOP_KEYS = ("agents", "mcp_servers", "policies", *_CAPABILITY_SECTIONS.values())
_AGENT_KEYS = (
    "model",
    "fallbacks",
    "system_prompt",
    "run_timeout",
    "max_iterations",
    "parallel_tool_calls",
    "tool_timeout",
    "tools",
    "mcp_servers",
    "policies",
    "default_policy",
    "model_params",
    "prompt_caching",
    "compaction",
    "max_history_messages",
    "description",
    "skills",
    "system_one",
    "required",
    "tokens_per_day",
    "webhook_url",
    "idempotent_tools",
    "editable_tools",
    *_CAPABILITY_KEYS,
)
_COMPACTION_KEYS = (
    "model",
    "keep_last",
    "trigger_messages",
    "summary_role",
    "instructions",
    "max_chars_per_message",
)
_MCP_KEYS = tuple(name for name in MCPServerConfig.__dataclass_fields__ if name != "name")
_MCP_STRINGS = ("transport", "command", "cwd", "url")
_MCP_STRING_LISTS = ("args", "allowed_tools", "idempotent_tools")
_MCP_STRING_TABLES = ("env", "headers")


# the configuration ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionSpec:
    """``[agents.NAME.compaction]``: an ``LlmCompactor`` for the agent's runs."""

    model: str | None = None
    """Model spec of the summary calls; None uses the agent's own (primary) model."""
    keep_last: int = 10
    trigger_messages: int = 40
    summary_role: Literal["user", "system"] = "user"
    instructions: str | None = None
    max_chars_per_message: int | None = None


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """One configured agent: everything its ``AgentCore`` is built from.

    ``None`` means the environment's value: ``model`` is ``AGENT_MODEL``, ``fallbacks``
    ``AGENT_FALLBACK_MODELS`` (only when ``model`` is None too), ``run_timeout``
    ``AGENT_RUN_TIMEOUT``; ``max_iterations`` and ``max_history_messages`` the runtime's defaults.
    ``policies`` is final: the file's top-level policies are merged in, after the agent's own.
    """

    name: str
    model: str | None = None
    fallbacks: tuple[str, ...] | None = None
    description: str | None = None
    skills: tuple[str, ...] = ()
    """Skill paths (absolute), in override order: a later path's skill replaces an earlier one."""
    system_one: str | None = None
    """Model spec of the agent's ``system_one`` binding (skill dispatch); None: no dispatch."""
    system_prompt: str | None = None
    run_timeout: float | None = None
    max_iterations: int | None = None
    parallel_tool_calls: bool = False
    tool_timeout: float | None = None
    tools: tuple[Tool, ...] = ()
    mcp_servers: tuple[str, ...] = ()
    policies: Mapping[str, str] = field(default_factory=dict)
    default_policy: str = "allow"
    model_params: Mapping[str, Any] = field(default_factory=dict)
    compaction: CompactionSpec | None = None
    max_history_messages: int | None = None
    capabilities: Mapping[str, tuple[CapabilitySpec, ...]] = field(default_factory=dict)
    """Capability models by purpose (``embed``, ``image``...): primary first."""
    tokens_per_day: int | None = None
    """The agent's daily token budget over every principal (``app.admission.budgets``); None:
    none."""
    required: bool = True
    """The worker is ready (``/readyz``) only once this agent warmed up; ``required = false``
    lets the others serve while it cannot (its runs then get 503 ``agent_unavailable``)."""
    webhook_url: str | None = None
    """Where the agent's runs post their end and confirmation requests (``app.webhooks``),
    unless a run's request names its own."""

    def run_options(self) -> RunOptions:
        """Keyword options for ``AgentCore.stream``; the agent's own core holds the rest."""
        return {"agent_name": self.name}


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What ``AGENT_CONFIG`` defines (or the environment's single ``default`` agent)."""

    agents: Mapping[str, AgentProfile]
    policies: Mapping[str, str] = field(default_factory=dict)
    """The file's top-level ``[policies]`` (already merged into every agent's own)."""
    mcp_servers: Mapping[str, MCPServerConfig] = field(default_factory=dict)
    """Every MCP server of the file, top-level and inline, by name."""
    path: str | None = None
    capabilities: Mapping[str, Mapping[str, CapabilitySpec]] = field(default_factory=dict)
    """The file's capability sections (``[embeddings.NAME]``...): purpose -> name -> spec."""


def _env_default_agent(policies: Mapping[str, str] | None = None) -> AgentProfile:
    """``default`` as the environment defines it: the demo tools and their policies (``allow``
    and ``ask``), which the file's top-level ``[policies]`` may override."""
    table = {**_DEMO_POLICIES, **(policies or {})}
    tools = _governed([current_time, delete_file], table)
    return AgentProfile(DEFAULT_AGENT, tools=tools, policies=table)


def default_config() -> ServiceConfig:
    """No ``AGENT_CONFIG``: one agent, ``default``, from the environment."""
    return ServiceConfig({DEFAULT_AGENT: _env_default_agent()})


# imports: tools and python: models -------------------------------------------------------------


def import_object(reference: str) -> Any:
    """``package.module:attribute`` (the attribute may be dotted); raises ValueError."""
    module_name, sep, attribute = reference.strip().partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{reference!r} is not of the form package.module:name")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(
            f"cannot import module {module_name!r} ({type(exc).__name__}: {exc}); "
            "it must be importable by the server (install it, or set PYTHONPATH)"
        ) from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return target


def resolve_tool(reference: str) -> Tool:
    """A builtin tool by name, or ``module:function`` (a ``@tool`` or a plain function)."""
    builtin = BUILTIN_TOOLS.get(reference)
    if builtin is not None:
        return builtin
    if ":" not in reference:
        raise ValueError(
            f"unknown tool {reference!r}: builtin tools are {', '.join(BUILTIN_TOOLS)}; "
            "name any other as package.module:function"
        )
    found = import_object(reference)
    if isinstance(found, Tool):
        return found
    if callable(found):
        try:
            return tool(found)
        except Exception as exc:  # a signature or annotations pydantic cannot describe
            raise ValueError(f"{reference!r} cannot be a tool: {exc}") from exc
    raise ValueError(f"{reference!r} is neither a @tool nor a function")


def _check_model_spec(spec: str) -> None:
    """Raise ValueError if ``spec`` cannot name a model; calls nothing it imports."""
    text = spec.strip()
    if text.lower().startswith(PYTHON_MODEL_PREFIX):
        factory = import_object(text[len(PYTHON_MODEL_PREFIX) :])
        if not callable(factory):
            raise ValueError(f"{text!r} does not name a callable factory")
        return
    binding_from_spec(text)  # a definition only: nothing is built or connected


# reading the file -----------------------------------------------------------------------------


def _mcp_server(
    file: str, where: tuple[str | int, ...], name: str, table: Table, base: Path
) -> MCPServerConfig:
    values: dict[str, Any] = {}
    for key, value in table.data.items():
        if key == "name":
            continue
        if key in _MCP_STRINGS:
            text = table.string(key)
            values[key] = expand(file, (*where, key), text or "")
        elif key in _MCP_STRING_LISTS:
            items = table.strings(key) or []
            values[key] = [expand(file, (*where, key, i), s) for i, s in enumerate(items)]
        elif key in _MCP_STRING_TABLES:
            sub = Table(file, (*where, key), value, None)
            expanded: dict[str, str] = {}
            for item_key, item in sub.data.items():
                if not isinstance(item, str):
                    raise sub.error(item_key, f"expected a string, got {describe(item)}")
                expanded[item_key] = expand(file, (*where, key, item_key), item)
            values[key] = expanded
        elif key == "timeout":
            values[key] = table.seconds(key)
        elif key == "session_pool_size":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise table.error(key, f"expected an integer >= 0, got {describe(value)}")
            values[key] = value
    cwd = values.get("cwd")
    if cwd is not None and not Path(cwd).is_absolute():
        values["cwd"] = str((base / cwd).resolve())
    try:
        config = MCPServerConfig.from_dict({**values, "name": name})
    except ConfigurationError as exc:
        raise ConfigError(file, key_path(*where), str(exc)) from None
    if config.transport == "stdio" and config.command is not None:
        problem = _command_problem(config.command, config.env, config.cwd)
        if problem is not None:
            raise ConfigError(file, key_path(*where, "command"), problem)
    return config


def _command_problem(command: str, env: Mapping[str, str] | None, cwd: str | None) -> str | None:
    """Why a stdio server's ``command`` cannot be started, or None: checked when the
    configuration is read, not when the first session opens (at warm-up, in every worker)."""
    if os.sep in command:
        path = Path(command) if Path(command).is_absolute() else Path(cwd or ".") / command
        if not path.is_file():
            return f"command {command!r} does not exist"
        if not os.access(path, os.X_OK):
            return f"command {command!r} is not executable"
        return None
    search = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(command, path=search) is None:
        return f"command {command!r} is not on PATH; install it or give its full path"
    return None


def _policies(table: Table | None) -> dict[str, str]:
    if table is None:
        return {}
    found: dict[str, str] = {}
    for pattern in table.data:
        if not pattern.strip():
            raise table.error(pattern, "a policy needs a tool name or glob pattern")
        found[pattern] = table.policy(pattern) or ""
    return found


def _compaction(table: Table | None) -> CompactionSpec | None:
    if table is None:
        return None
    model = table.string("model")
    if model is not None:
        try:
            _check_model_spec(model)
        except ValueError as exc:
            raise table.error("model", str(exc)) from None
    keep_last = table.integer("keep_last") or 10
    trigger = table.integer("trigger_messages") or 40
    if trigger <= keep_last:
        raise table.error(
            "trigger_messages", f"must be larger than keep_last ({keep_last}), got {trigger}"
        )
    role = table.data.get("summary_role", "user")
    if role not in ("user", "system"):
        raise table.error("summary_role", f"expected 'user' or 'system', got {describe(role)}")
    return CompactionSpec(
        model=model,
        keep_last=keep_last,
        trigger_messages=trigger,
        summary_role=role,
        instructions=table.string("instructions"),
        max_chars_per_message=table.integer("max_chars_per_message"),
    )


def _matches(name: str, policies: Mapping[str, str]) -> bool:
    return name in policies or any(
        any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(name, pattern)
        for pattern in policies
    )


def _governed(tools: Sequence[Tool], policies: Mapping[str, str]) -> tuple[Tool, ...]:
    """In the file the policy table has the last word, over a tool's own ``@tool(policy=...)``:
    a tool the table matches loses its own policy (the runtime would prefer it)."""
    return tuple(
        dataclasses.replace(t, policy=None) if _matches(t.name, policies) else t for t in tools
    )


def _flagged(
    file: str,
    where: tuple[str | int, ...],
    tools: Sequence[Tool],
    table: Table,
    servers: Sequence[str],
) -> tuple[Tool, ...]:
    """``idempotent_tools``: the named tools may run again when a run is resumed after its
    worker died (``@tool(idempotent=True)`` in the file's words); ``editable_tools``: a person
    approving a call of one may edit its arguments (``@tool(editable=True)``). A name must be
    one of the agent's ``tools`` (an MCP server's tools are named in its own
    ``idempotent_tools``, and cannot be made editable)."""
    known = {t.name for t in tools}
    flags: dict[str, dict[str, Any]] = {}
    for key, flag in (("idempotent_tools", "idempotent"), ("editable_tools", "editable")):
        for index, name in enumerate(table.strings(key) or []):
            if name not in known:
                problem = _unknown_tool(name, known, servers, key)
                raise ConfigError(file, key_path(*where, key, index), problem)
            # the runtime's flag, set as the decorator would
            flags.setdefault(name, {})[flag] = True
    return tuple(dataclasses.replace(t, **flags[t.name]) if t.name in flags else t for t in tools)


def _unknown_tool(name: str, known: set[str], servers: Sequence[str], key: str) -> str:
    server, sep, tool_name = name.partition("__")
    if sep and server in servers:
        if key == "editable_tools":
            return (
                f"{name!r} is a tool of MCP server {server!r}: an MCP tool's arguments cannot "
                "be edited on approval"
            )
        return (
            f"{name!r} is a tool of MCP server {server!r}: name it as {tool_name!r} in "
            f"that server's {key}"
        )
    listed = ", ".join(sorted(known)) or "none"
    return f"{name!r} is not one of the agent's tools ({listed})"


def _agent(
    file: str,
    name: str,
    table: Table,
    servers: dict[str, MCPServerConfig],
    top_policies: Mapping[str, str],
    base: Path,
    sections: Mapping[str, Mapping[str, CapabilitySpec]] | None = None,
) -> AgentProfile:
    where = table.where
    model, fallbacks, system_one = _models(table)
    tools = _tools(file, table)
    server_names = _agent_servers(file, table, servers, base)
    _check_tool_prefixes(file, where, tools, server_names)
    skills = _skills(table, base)
    own = _policies(table.child("policies", None))
    policies = {**own, **{k: v for k, v in top_policies.items() if k not in own}}
    params = table.child("model_params", None)
    model_params = dict(params.data) if params is not None else {}
    caching = table.boolean("prompt_caching")
    if caching is not None and PROMPT_CACHING in model_params:
        raise table.error("prompt_caching", "set it here or in model_params, not in both")
    if caching is False:
        # the providers' own switch (agent_runtime.providers.caching: on unless false), as a
        # key of the agent's own
        model_params[PROMPT_CACHING] = False
    history = table.integer("max_history_messages")
    return AgentProfile(
        name=name,
        model=model,
        fallbacks=None if fallbacks is None else tuple(fallbacks),
        description=table.string("description"),
        skills=tuple(skills),
        system_one=system_one,
        system_prompt=table.string("system_prompt", empty=True),
        run_timeout=table.seconds("run_timeout"),
        max_iterations=table.integer("max_iterations"),
        parallel_tool_calls=bool(table.boolean("parallel_tool_calls")),
        tool_timeout=table.seconds("tool_timeout"),
        tools=_flagged(file, where, _governed(tools, policies), table, server_names),
        mcp_servers=tuple(server_names),
        policies=policies,
        default_policy=table.policy("default_policy") or "allow",
        model_params=model_params,
        compaction=_compaction(table.child("compaction", _COMPACTION_KEYS)),
        max_history_messages=history,
        capabilities=agent_capabilities(table, sections or {}),
        required=table.boolean("required") is not False,
        tokens_per_day=table.integer("tokens_per_day"),
        webhook_url=_webhook_url(table),
    )


def _models(table: Table) -> tuple[str | None, list[str] | None, str | None]:
    """An agent's ``model``, ``fallbacks`` and ``system_one``, each spec checked."""
    model = table.string("model")
    fallbacks = table.strings("fallbacks")
    system_one = table.string("system_one")
    for key, specs in (
        ("model", [model] if model else []),
        ("fallbacks", fallbacks or []),
        ("system_one", [system_one] if system_one else []),
    ):
        for index, spec in enumerate(specs):
            try:
                _check_model_spec(spec)
            except ValueError as exc:
                raise table.error(key, str(exc), index if key == "fallbacks" else None) from None
    if fallbacks is not None and model is None:
        raise table.error("fallbacks", "set model too: fallbacks follow an agent's own model")
    return model, fallbacks, system_one


def _tools(file: str, table: Table) -> list[Tool]:
    """An agent's ``tools``, resolved, each name once."""
    where = table.where
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for index, reference in enumerate(table.strings("tools") or []):
        try:
            found = resolve_tool(reference)
        except (ValueError, ConfigurationError) as exc:
            raise ConfigError(file, key_path(*where, "tools", index), str(exc)) from None
        if found.name in seen:
            raise ConfigError(
                file,
                key_path(*where, "tools", index),
                f"duplicate tool name {found.name!r} (also tools[{seen[found.name]}])",
            )
        seen[found.name] = index
        tools.append(found)
    return tools


def _agent_servers(
    file: str, table: Table, servers: dict[str, MCPServerConfig], base: Path
) -> list[str]:
    """The names of an agent's ``mcp_servers``; an inline one is added to ``servers``."""
    where = table.where
    server_names: list[str] = []
    raw_servers = table.data.get("mcp_servers", [])
    if not isinstance(raw_servers, list):
        raise table.error("mcp_servers", f"expected an array, got {describe(raw_servers)}")
    for index, item in enumerate(raw_servers):
        item_where = (*where, "mcp_servers", index)
        if isinstance(item, str):
            if item not in servers:
                known = ", ".join(servers) or "none"
                raise ConfigError(
                    file,
                    key_path(*item_where),
                    f"unknown MCP server {item!r}; defined under [mcp_servers]: {known}",
                )
            server_name = item
        else:
            inline = Table(file, item_where, item, ("name", *_MCP_KEYS))
            server_name = inline.string("name") or ""
            if not server_name:
                raise inline.error("name", "an inline MCP server needs a name")
            if server_name in servers:
                raise inline.error(
                    "name", f"an MCP server named {server_name!r} is already defined"
                )
            servers[server_name] = _mcp_server(file, item_where, server_name, inline, base)
        if server_name in server_names:
            raise ConfigError(
                file, key_path(*item_where), f"MCP server {server_name!r} is listed twice"
            )
        server_names.append(server_name)
    return server_names


def _check_tool_prefixes(
    file: str, where: tuple[str | int, ...], tools: Sequence[Tool], server_names: Sequence[str]
) -> None:
    """A tool may not take the name prefix of the agent's MCP servers' tools."""
    for index, built in enumerate(tools):
        for server_name in server_names:
            if built.name.startswith(f"{server_name}__"):
                raise ConfigError(
                    file,
                    key_path(*where, "tools", index),
                    f"tool name {built.name!r} takes the prefix of the agent's MCP server "
                    f"{server_name!r}",
                )


def _skills(table: Table, base: Path) -> list[str]:
    """An agent's ``skills`` folders, resolved against the config file's folder."""
    skills: list[str] = []
    for index, entry in enumerate(table.strings("skills") or []):
        folder = Path(os.path.expandvars(entry)).expanduser()
        folder = folder if folder.is_absolute() else (base / folder)
        if not folder.is_dir():
            raise table.error("skills", f"{entry!r} is not a folder (skills or one skill)", index)
        skills.append(str(folder.resolve()))
    return skills


def _webhook_url(table: Table) -> str | None:
    """An agent's ``webhook_url``: its form is checked here, its host when a run ends."""
    url = table.string("webhook_url")
    if url is None:
        return None
    try:
        check_url(url)
    except TargetRefused as exc:
        raise table.error("webhook_url", str(exc)) from None
    return url


def environment_references(path: str | None) -> frozenset[str]:
    """The environment variables ``${NAME}`` the file at ``path`` refers to; none when there
    is no file or it cannot be read (``load_config`` says why)."""
    if path is None:
        return frozenset()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return frozenset()
    return frozenset(match.group(1) for match in ENV_REFERENCE.finditer(text))


def load_config(path: str | None) -> ServiceConfig:
    """Read and validate ``AGENT_CONFIG``; raises ConfigError naming the file and the key.

    Imports the tools and ``python:`` model factories it names (calling none of them) and checks
    every model spec; starts nothing.
    """
    if path is None:
        return default_config()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, "", f"AGENT_CONFIG cannot be read: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"not valid TOML: {exc}") from exc
    base = Path(path).resolve().parent
    root = Table(path, (), data, _TOP_KEYS)
    top_policies = _policies(root.child("policies", None))
    sections = capability_sections(root)

    servers: dict[str, MCPServerConfig] = {}
    server_tables = root.child("mcp_servers", None)
    for name in server_tables.data if server_tables is not None else {}:
        assert server_tables is not None
        table = server_tables.child(name, ("name", *_MCP_KEYS))
        assert table is not None
        if "name" in table.data:
            raise table.error("name", "the server's name is its table's key; remove name")
        servers[name] = _mcp_server(path, table.where, name, table, base)

    agents: dict[str, AgentProfile] = {}
    agent_tables = root.child("agents", None)
    for name in agent_tables.data if agent_tables is not None else {}:
        assert agent_tables is not None
        if not _AGENT_NAME.match(name):
            raise agent_tables.error(
                name, "an agent name is 1 to 64 letters, digits, '.', '_' or '-'"
            )
        table = agent_tables.child(name, _AGENT_KEYS)
        assert table is not None
        agents[name] = _agent(path, name, table, servers, top_policies, base, sections)
    if DEFAULT_AGENT not in agents:
        agents[DEFAULT_AGENT] = _env_default_agent(top_policies)
    return ServiceConfig(agents, top_policies, servers, path, sections)
