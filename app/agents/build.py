"""Configured agents: the ``AgentCore`` of each agent ``AGENT_CONFIG`` defines.

Without ``AGENT_CONFIG`` there is one agent, ``default``: ``AGENT_MODEL`` (and
``AGENT_FALLBACK_MODELS``), the demo tools and ``AGENT_RUN_TIMEOUT``. A TOML file defines named
agents, each with its own model, prompt, limits, tools, MCP servers, policies and compaction;
``app.agents.config`` reads it, this module builds what it describes. Different models, tools and
policies need different cores, so each agent has its own, each with its own
``ConfirmationExtension``; the run manager sends a run's cancellation and answers to its core.

The steps, each apart so that ``agent-server`` can check a file before it starts a worker::

    load_config(path)                the file, validated; nothing imported is called or started
      → build_agents(settings, cfg)  one AgentCore per agent on the running loop, one MCPClient
                                     per MCP server (not started)
        → preflight()                every model binding built (capability models too), no
                                     network call
        → warm_up(prompt)            MCP clients started (tool discovery), their tools
                                     registered, one short run per agent (AGENT_WARMUP=0:
                                     the skills read, no model call)
        → aclose(), close_mcp()      at shutdown, after the runs drained: cores, then clients
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent_runtime.agent import AgentCore
from agent_runtime.bindings import ModelBinding, ModelBindings, binding_from_spec
from agent_runtime.compaction import LlmCompactor
from agent_runtime.content import ContentStore
from agent_runtime.errors import ConfigurationError, ProviderError
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.integrations.lifespan import warm_up
from agent_runtime.providers.demo import DemoModel
from agent_runtime.skills import SkillManager
from agent_runtime.tracing import RunTracer
from app.agents.capabilities import SECTIONS, CapabilitySpec, capability_binding
from app.agents.config import (
    BUILTIN_TOOLS,
    DEFAULT_AGENT,
    PYTHON_MODEL_PREFIX,
    AgentProfile,
    CompactionSpec,
    ConfigError,
    ServiceConfig,
    default_config,
    import_object,
    key_path,
    load_config,
)
from app.agents.health import AgentStates
from app.errors import NotFound
from app.settings import Settings

if TYPE_CHECKING:
    from agent_runtime.mcp import MCPClient

__all__ = [
    "BUILTIN_TOOLS",
    "DEFAULT_AGENT",
    "PYTHON_MODEL_PREFIX",
    "AgentProfile",
    "CompactionSpec",
    "ConfigError",
    "ConfiguredAgents",
    "ServiceConfig",
    "build_agents",
    "build_core",
    "default_config",
    "load_config",
    "model_binding",
]

logger = logging.getLogger("app.agents.build")


def model_binding(spec: str, settings: Settings) -> ModelBinding:
    """A model binding from a setting string, on the running loop.

    ``demo`` uses the settings' demo delays; ``python:package.module:factory`` calls
    ``factory()``, which returns a model (anything with ``stream(request)``) or a
    ``ModelBinding`` (the extension point for custom providers); anything else is
    ``binding_from_spec``: ``openai:MODEL``, ``openai-responses:MODEL``, ``anthropic:MODEL``, a
    preset name.
    """
    text = spec.strip()
    if text.lower() == "demo":
        model = DemoModel(
            token_delay=settings.demo_token_delay, slow_seconds=settings.demo_slow_seconds
        )
        return ModelBinding(provider=model, model="demo")
    if text.lower().startswith(PYTHON_MODEL_PREFIX):
        reference = text[len(PYTHON_MODEL_PREFIX) :]
        factory = import_object(reference)
        if not callable(factory):
            raise ConfigurationError(f"{text!r} does not name a callable factory")
        made = factory()
        if isinstance(made, ModelBinding):
            return made
        if not callable(getattr(made, "stream", None)):
            raise ConfigurationError(
                f"{reference}() returned {type(made).__name__}, not a model (with a "
                "stream(request) method) or a ModelBinding"
            )
        return ModelBinding(provider=made)
    return binding_from_spec(
        text,
        client_timeout=settings.client_timeout,
        client_max_retries=settings.client_max_retries,
    )


# building the agents --------------------------------------------------------------------------


async def build_core(
    settings: Settings,
    profile: AgentProfile,
    owned: list[ModelBinding] | None = None,
    tracer: RunTracer | None = None,
    content_store: ContentStore | None = None,
) -> AgentCore:
    """The ``AgentCore`` of one agent, on the running loop; its MCP tools come at warm-up.

    A compaction model of its own is appended to ``owned``: the caller closes it after the core.
    ``content_store`` keeps the bytes of its messages' images and documents (the service's
    files); None: the runtime's own, in memory.
    """
    if profile.model is None:
        specs = [settings.model, *settings.fallback_model_list]
    else:
        specs = [profile.model, *(profile.fallbacks or ())]
    capabilities = {
        purpose: [_capability(spec, settings) for spec in chain]
        for purpose, chain in profile.capabilities.items()
    }
    if profile.system_one is not None:
        capabilities["system_one"] = [model_binding(profile.system_one, settings)]
    bindings = ModelBindings(llm=[model_binding(spec, settings) for spec in specs], **capabilities)
    compactor: LlmCompactor | None = None
    spec = profile.compaction
    if spec is not None:
        summary: ModelBinding = bindings.primary
        if spec.model is not None:
            summary = model_binding(spec.model, settings)
            if owned is not None:
                owned.append(summary)
        extra: dict[str, Any] = {}
        if spec.instructions is not None:
            extra["instructions"] = spec.instructions
        if spec.max_chars_per_message is not None:
            extra["max_chars_per_message"] = spec.max_chars_per_message
        compactor = LlmCompactor(
            summary,
            keep_last=spec.keep_last,
            trigger_messages=spec.trigger_messages,
            summary_role=spec.summary_role,
            **extra,
        )
    options: dict[str, Any] = {}
    if profile.max_iterations is not None:
        options["max_iterations"] = profile.max_iterations
    if profile.max_history_messages is not None:
        options["max_history_messages"] = profile.max_history_messages
    return await AgentCore.create(
        bindings,
        tools=profile.tools,
        extensions=[ConfirmationExtension(timeout=settings.confirmation_timeout)],
        tool_policies=dict(profile.policies),
        default_policy=profile.default_policy,
        system_prompt=profile.system_prompt,
        run_timeout=profile.run_timeout or settings.run_timeout,
        tool_timeout=profile.tool_timeout,
        parallel_tool_calls=profile.parallel_tool_calls,
        model_params=dict(profile.model_params),
        context_compactor=compactor,
        name=profile.name,
        skills=SkillManager(profile.skills) if profile.skills else None,
        tracer=tracer,
        content_store=content_store,
        **options,
    )


def _capability(spec: CapabilitySpec, settings: Settings) -> ModelBinding:
    return capability_binding(
        spec,
        client_timeout=settings.client_timeout,
        client_max_retries=settings.client_max_retries,
    )


class ConfiguredAgents:
    """A worker's agents: one ``AgentCore`` each, and the MCP clients they share.

    Each MCP server has one client (so one session pool per worker), registered with every
    agent that lists it. The cores do not own the clients: ``close_mcp`` closes them, after
    ``aclose`` closed the cores.
    """

    def __init__(
        self,
        config: ServiceConfig,
        cores: Mapping[str, AgentCore],
        clients: Mapping[str, MCPClient],
        owned: Mapping[str, ModelBinding] | None = None,
        capabilities: Mapping[str, Mapping[str, ModelBinding]] | None = None,
    ) -> None:
        self.config = config
        self.cores: dict[str, AgentCore] = dict(cores)
        self.clients: dict[str, MCPClient] = dict(clients)
        self._owned = dict(owned or {})
        self.capabilities: dict[str, dict[str, ModelBinding]] = {
            purpose: dict(named) for purpose, named in (capabilities or {}).items()
        }
        self._registered: set[tuple[str, str]] = set()
        self._started: set[str] = set()
        self._warm: set[str] = set()
        self._checked = False
        self.states = AgentStates((name, p.required) for name, p in config.agents.items())
        """Each agent's warm-up state (``/readyz``, ``agent_unavailable``)."""

    def __repr__(self) -> str:
        return f"<ConfiguredAgents {sorted(self.cores)} mcp={sorted(self.clients)}>"

    def __iter__(self) -> Iterator[str]:
        return iter(self.cores)

    @property
    def default(self) -> AgentCore:
        """The ``default`` agent."""
        return self.cores[DEFAULT_AGENT]

    @property
    def profiles(self) -> Mapping[str, AgentProfile]:
        """The agents' definitions, by name."""
        return self.config.agents

    def _where(self, name: str, key: str = "") -> str:
        label = key_path("agents", name, key) if key else key_path("agents", name)
        return f"{self.config.path}: {label}" if self.config.path else label

    def capability(self, purpose: str, model: str) -> ModelBinding | ModelBindings:
        """What serves ``model`` for ``purpose``: a capability section of that name, else the
        agent of that name's chain of the purpose. NotFound names what exists."""
        named = self.capabilities.get(purpose, {})
        if model in named:
            return named[model]
        core = self.cores.get(model)
        if core is not None and core.bindings.for_purpose(purpose):
            return core.bindings
        known = sorted(
            {*named, *(n for n, c in self.cores.items() if c.bindings.for_purpose(purpose))}
        )
        raise NotFound(f"no {purpose} model {model!r}; configured: {', '.join(known) or 'none'}")

    async def preflight(self) -> None:
        """Build every model binding (no network call); ConfigurationError names the agent."""
        for name, core in self.cores.items():
            try:
                await core.bindings.preflight()
            except ConfigurationError as exc:
                if self.config.path is None:
                    raise  # the environment's agent: the message as it always was
                raise ConfigurationError(f"{self._where(name)}: {exc}") from exc
        for name, binding in self._owned.items():
            try:
                await binding.preflight()
            except ConfigurationError as exc:
                where = self._where(name, "compaction")
                raise ConfigurationError(f"{where}.model: {exc}") from exc
        for purpose, named in self.capabilities.items():
            for name, binding in named.items():
                try:
                    await binding.preflight()
                except ConfigurationError as exc:
                    label = key_path(SECTIONS[purpose], name)
                    where = f"{self.config.path}: {label}" if self.config.path else label
                    raise ConfigurationError(f"{where}: {exc}") from exc

    async def start_mcp(self) -> None:
        """Start every MCP client (tool discovery) and register its tools with its agents.

        Idempotent; after a failure a later call tries the rest again. Raises the first error
        (``MCPServerError`` for a server that cannot be listed, ``ConfigurationError`` for a
        name collision).
        """
        clients = list(self.clients.values())
        outcomes = await asyncio.gather(*(c.start() for c in clients), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        for name, profile in self.config.agents.items():
            core = self.cores[name]
            for server in profile.mcp_servers:
                if (name, server) in self._registered:
                    continue
                try:
                    await core.add_mcp_client(self.clients[server])
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{self._where(name, 'mcp_servers')}: {exc}") from exc
                self._registered.add((name, server))
        if not self._checked:
            self._checked = True
            self._warn_unknown_policy_names()

    def _warn_unknown_policy_names(self) -> None:
        # a typo in a tool's name would silently leave the tool at another policy; patterns
        # and names some other agent has are fine (the top-level policies reach every agent)
        known = {t.name for core in self.cores.values() for t in core.registry}
        for name in sorted(
            {p for profile in self.profiles.values() for p in profile.policies} - known
        ):
            if not any(ch in name for ch in "*?["):
                logger.warning("a tool policy names no tool of any agent", extra={"tool": name})

    @property
    def warm(self) -> frozenset[str]:
        """The agents whose warm-up succeeded (with ``call_model`` off: their tools and
        skills were loaded)."""
        return frozenset(self._warm)

    async def warm_up(self, prompt: str, *, call_model: bool = True) -> bool:
        """One warm-up round: start the MCP clients not started yet (tool discovery), then
        one short run per agent not warmed up yet (``call_model`` False, ``AGENT_WARMUP=0``:
        its skill catalogue only, and it is ``configured`` rather than ``ready``). Each
        agent's outcome goes to ``states`` (an agent whose MCP server or model fails is
        ``unavailable``, with a reason naming the server or key, the others are
        unaffected). True once every agent is warm."""
        clients = [(name, c) for name, c in self.clients.items() if name not in self._started]
        outcomes = await asyncio.gather(*(c.start() for _, c in clients), return_exceptions=True)
        failures: dict[str, BaseException] = {}
        for (server, _client), outcome in zip(clients, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancellation: not a failure of the server
                failures[server] = outcome
                logger.warning(
                    "MCP server failed at warm-up",
                    extra={"server": server, "error": str(outcome)},
                )
            else:
                self._started.add(server)
        for name, core in self.cores.items():
            if name in self._warm:
                continue
            profile = self.config.agents[name]
            broken = [server for server in profile.mcp_servers if server in failures]
            if broken:
                self.states.mark_failed(name, self._mcp_reason(name, broken[0], failures))
                continue
            try:
                for server in profile.mcp_servers:
                    if (name, server) not in self._registered:
                        await core.add_mcp_client(self.clients[server])
                        self._registered.add((name, server))
            except ConfigurationError as exc:
                # a name collision: ours, safe to show
                self.states.mark_failed(name, f"{key_path('agents', name, 'mcp_servers')}: {exc}")
                continue
            try:
                if call_model:
                    await self._warm_run(name, core, prompt)
                else:
                    await self._load_skills(name, core)
            except Exception as exc:
                reason = (
                    _run_reason(name, exc)
                    if call_model
                    else f"{key_path('agents', name, 'skills')}: the skills could not be read "
                    f"({type(exc).__name__})"
                )
                self.states.mark_failed(name, reason)
                logger.warning(
                    "agent warm-up run failed" if call_model else "agent skills failed to load",
                    extra={"agent": name, "error": str(exc)},
                )
                continue
            self._warm.add(name)
            if call_model:
                self.states.mark_ready(name)
            else:
                self.states.mark_configured(name)
        if not self._checked and not failures:
            self._checked = True
            self._warn_unknown_policy_names()
        return self.states.all_ready

    @staticmethod
    async def _warm_run(name: str, core: AgentCore, prompt: str) -> None:
        # the library's warm-up (agent_runtime.integrations.lifespan): the skill catalogue,
        # then one model call with no tool offered and no skill dispatch
        await warm_up(
            core,
            prompt,
            # not a valid HTTP session id: no client's session can collide with it
            session_id=f"#warm-up-{secrets.token_hex(4)}",
            run_timeout=60.0,
        )
        if core.skills is not None:
            logger.info("skills loaded", extra={"agent": name, "skills": len(core.skills.skills)})

    @staticmethod
    async def _load_skills(name: str, core: AgentCore) -> None:
        # what the warm-up run does besides its model call: read the skill catalogue (in a
        # worker thread), so that a bad skill shows here, not in the first user's run
        if core.skills is not None:
            await core.skills.aload()
            logger.info("skills loaded", extra={"agent": name, "skills": len(core.skills.skills)})

    @staticmethod
    def _mcp_reason(agent: str, server: str, failures: Mapping[str, BaseException]) -> str:
        # the server and the keys that name it; the failure's class, not its text (which
        # may quote a URL with credentials: the log has it)
        error = failures[server]
        root = _root(error)
        what = (
            "did not list its tools in time"
            if isinstance(root, TimeoutError)
            else ("could not be reached")
        )
        where = key_path("agents", agent, "mcp_servers")
        return f"MCP server {server!r} ({where}) {what} ({type(root).__name__})"

    async def aclose(self) -> None:
        """Close every core (cancelling runs and media jobs still in flight), then the bindings
        it owns and the capability models (cancelling their media jobs first)."""
        await _close_all([core.aclose for core in self.cores.values()])
        await _close_all([binding.aclose for binding in self._owned.values()])
        await _close_all([b.aclose for named in self.capabilities.values() for b in named.values()])

    async def close_mcp(self) -> None:
        """Close every MCP client (after the runs that use them ended)."""
        await _close_all([client.close for client in self.clients.values()])


def _root(exc: BaseException) -> BaseException:
    """The innermost cause of ``exc`` (through exception groups too)."""
    seen = 0
    while seen < 16:
        seen += 1
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            return exc
    return exc


def _run_reason(agent: str, exc: Exception) -> str:
    """Why an agent's warm-up run failed, naming its model key; a provider error's message
    is built to be shown (no key, no upstream text), any other failure only by class."""
    where = key_path("agents", agent, "model")
    if isinstance(exc, ProviderError):
        return f"{where}: the warm-up run failed: {exc}"
    code = getattr(exc, "code", None)
    label = f"{code}, {type(exc).__name__}" if isinstance(code, str) else type(exc).__name__
    return f"{where}: the warm-up run failed ({label})"


async def _close_all(closers: Sequence[Callable[[], Any]]) -> None:
    """Call each closer; the first failure is raised once all were called."""
    outcomes = await asyncio.gather(*(closer() for closer in closers), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def build_agents(
    settings: Settings,
    config: ServiceConfig,
    tracer: RunTracer | None = None,
    content_store: ContentStore | None = None,
) -> ConfiguredAgents:
    """Every agent's ``AgentCore`` on the running loop (sharing ``content_store``), and an MCP
    client per server.

    Nothing is started: ``preflight`` and ``warm_up`` do that.
    """
    cores: dict[str, AgentCore] = {}
    owned: dict[str, ModelBinding] = {}
    try:
        for name, profile in config.agents.items():
            own: list[ModelBinding] = []
            try:
                cores[name] = await build_core(settings, profile, own, tracer, content_store)
            except ConfigurationError as exc:
                if config.path is not None:
                    raise ConfigError(config.path, key_path("agents", name), str(exc)) from exc
                raise
            finally:
                owned.update((name, binding) for binding in own)
    except BaseException:
        await _close_all([core.aclose for core in cores.values()])
        await _close_all([binding.aclose for binding in owned.values()])
        raise
    clients: dict[str, MCPClient] = {}
    if config.mcp_servers:
        from agent_runtime.mcp import MCPClient  # the SDK loads only when a server is configured

        clients = {name: MCPClient([server]) for name, server in config.mcp_servers.items()}
    capabilities = {
        purpose: {name: _capability(spec, settings) for name, spec in named.items()}
        for purpose, named in config.capabilities.items()
    }
    return ConfiguredAgents(config, cores, clients, owned, capabilities)
