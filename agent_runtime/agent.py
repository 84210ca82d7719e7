"""AgentCore: one instance per event loop serves many concurrent runs.

A run is one call of ``stream`` or ``chat``. It executes in a task of its own that pushes events
into a bounded channel; ``stream`` reads that channel. Keeping the run in its own task lets an
extension emit an event while it waits (a confirmation request), bounds the whole run with one
deadline, and turns a consumer that closes its stream into a cancellation of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import logging
import os
import secrets
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from .bindings import ModelBinding, ModelBindings
from .capabilities.agent_calls import CapabilityCalls
from .channel import Channel, ChannelClosed
from .checkpoints import Checkpointer, CheckpointSink, RunCheckpoint, unknown_outcome
from .compaction import DEFAULT_MAX_HISTORY_MESSAGES, ContextCompactor, prepare_context
from .errors import (
    AgentClosedError,
    ConfigurationError,
    LoopAffinityError,
    MaxIterationsError,
    ProviderError,
    RunCancelledError,
    RunError,
    RunTimeoutError,
    SessionBusyError,
    StructuredOutputError,
    ToolErrorLimitError,
)
from .events import AgentEvent, AgentEventType, AgentPhase
from .extensions.base import AgentExtension, ToolOutcome
from .extensions.events import RunCancelledEvent
from .messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from .model import Model, ModelEventKind, ModelRequest, ModelResponse, RetryOptions, Usage
from .run_calls import RunCalls
from .skills.activation import SkillState
from .skills.catalogue import SkillManager
from .structured import OutputSpec, StructuredOutput, output_spec
from .tools.base import Tool, ToolPolicy, _run_state, tool
from .tools.execution import ToolExecutor
from .tools.registry import ToolRegistry
from .tracing import NO_TRACER, RunTracer

if TYPE_CHECKING:
    from .extensions.external import ExternalEvent
    from .mcp import MCPClient

__all__ = [
    "AgentCore",
    "AgentResponse",
    "AgentRunConfig",
    "AgentRunContext",
    "AgentState",
    "ConversationStore",
    "InMemoryConversationStore",
    "PermissionCallback",
    "ToolGate",
]

logger = logging.getLogger("agent_runtime")

PermissionCallback: TypeAlias = Callable[["AgentRunContext", ToolCall], "bool | Awaitable[bool]"]
ToolGate: TypeAlias = Callable[[ToolCall], "str | None"]
"""A run's last word on a tool call, asked (synchronously) right before the call executes, after
its hooks, policy and approval: None lets it run, a string refuses it with that error."""
ModelLike: TypeAlias = "Model | ModelBinding | ModelBindings"

DEFAULT_MAX_ITERATIONS = 50
DEFAULT_TOOL_ERROR_LIMIT = 5
_DEFAULT_RETRY = RetryOptions()


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


HANDOVER = "handover"
"""The cancel reason of a run that stops here to go on elsewhere from its checkpoint."""


def new_id(prefix: str) -> str:
    """A random id with 128 bits of entropy."""
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass(frozen=True, slots=True)
class AgentRunConfig:
    """Routing identity of a run: its session, the caller's request id and an optional run id.

    Without a ``session_id`` the run gets an anonymous session of its own.
    """

    session_id: str | None = None
    request_id: str | None = None
    run_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class AgentState:
    """The state of one run. ``messages`` is the conversation as the model last saw it;
    ``added`` what this run added to it so far (its prompt first); ``partial`` the text of the
    model call in flight; ``approvals`` the decision on each ``ask`` call, by call id."""

    run_id: str = ""
    session_id: str = ""
    phase: AgentPhase = AgentPhase.IDLE
    messages: list[Message] = field(default_factory=list)
    iteration: int = 0
    usage: Usage = field(default_factory=Usage)
    consecutive_tool_errors: int = 0
    error: BaseException | None = None
    added: list[Message] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    approvals: dict[str, Literal["approved", "denied"]] = field(default_factory=dict)

    def stopped_messages(self) -> list[Message]:
        """What the run added, as far as it got, as a conversation that can be carried on.

        The text of a model call cut short becomes an assistant message of its own, and a tool
        call that had not returned gets an error result (``CANCELLED_CALL``), so every call in
        the list has its result, as every provider requires.
        """
        messages = list(self.added)
        if self.partial:
            messages.append(AssistantMessage("".join(self.partial)))
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        for message in list(messages):
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls:
                    if call.id not in answered:
                        messages.append(
                            ToolMessage(call.id, call.name, f"Error: {CANCELLED_CALL}", True)
                        )
        return messages


CANCELLED_CALL = "the run was cancelled before this call returned"
"""The error result a cancelled run's unfinished tool call gets in ``run.cancelled``'s
``messages`` (after ``"Error: "``, as every failed call's result reads)."""


@dataclass(slots=True)
class AgentResponse:
    """The outcome of ``chat``: the final message, the run's id, usage and new messages
    (and ``structured``, the validated answer, when the run asked for structured output)."""

    message: AssistantMessage
    run_id: str
    session_id: str
    usage: Usage
    messages: list[Message]
    structured: StructuredOutput | None = None

    @property
    def content(self) -> str:
        """The final message's text."""
        return self.message.content or ""


class ConversationStore(Protocol):
    """Where a session's conversation lives between runs."""

    async def load(self, session_id: str) -> list[Message]:
        """The session's messages, oldest first."""
        ...

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add one completed run's messages atomically."""
        ...


class InMemoryConversationStore:
    """A ConversationStore in a dict; for scripts and tests."""

    def __init__(self) -> None:
        self._sessions: dict[str, list[Message]] = {}

    async def load(self, session_id: str) -> list[Message]:
        return list(self._sessions.get(session_id, ()))

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self._sessions.setdefault(session_id, []).extend(messages)

    def clear(self, session_id: str) -> None:
        """Forget a session."""
        self._sessions.pop(session_id, None)


@dataclass(slots=True)
class _RunOptions:
    run_timeout: float | None
    max_iterations: int
    tool_timeout: float | None
    parallel_tool_calls: bool
    system_prompt: str | None
    permission_callback: PermissionCallback | None
    conversation: list[Message] | None
    tools: dict[str, Tool]
    params: dict[str, Any]
    agent_name: str | None
    context_compactor: ContextCompactor | None = None
    tool_gate: ToolGate | None = None
    skill_state: SkillState | None = None
    output: OutputSpec | None = None
    tool_filter: Callable[[Tool], bool] | None = None
    checkpoint_sink: CheckpointSink | None = None
    resume: RunCheckpoint | None = None


class AgentRunContext:
    """Everything one run owns. Passed to every extension hook.

    Compared and hashed by identity, so it is a safe key for request-local maps.
    """

    __slots__ = (
        "_cancel_reason",
        "_channel",
        "_checkpoints",
        "_decisions",
        "_options",
        "_resumed_asks",
        "_task",
        "agent",
        "config",
        "run_id",
        "session_id",
        "state",
    )

    def __init__(
        self,
        agent: AgentCore,
        config: AgentRunConfig,
        run_id: str,
        session_id: str,
        options: _RunOptions,
        channel: Channel[AgentEvent],
    ) -> None:
        self.agent = agent
        self.config = config
        self.run_id = run_id
        self.session_id = session_id
        self.state = AgentState(run_id=run_id, session_id=session_id)
        self._options = options
        self._channel = channel
        self._decisions: dict[str, tuple[bool, str | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._cancel_reason: str | None = None
        # with a checkpoint sink: the open calls' states and the saves (agent_runtime.checkpoints)
        self._checkpoints: Checkpointer | None = None
        # calls of a resumed run that were waiting for an approval: asked again, marked so
        self._resumed_asks: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        return f"<AgentRunContext run_id={self.run_id} session_id={self.session_id}>"

    @property
    def phase(self) -> AgentPhase:
        """The run's current phase."""
        return self.state.phase

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The tools of this run (read once when it started; the active skills may advertise
        fewer, see ``skill_state``)."""
        return self._options.tools

    @property
    def skill_state(self) -> SkillState | None:
        """This run's skills (catalogue, active skills); None for an agent without skills."""
        return self._options.skill_state

    async def emit(self, event: AgentEvent) -> None:
        """Send an event to the run's consumer; run and session ids are filled in if empty."""
        if not event.run_id:
            event.run_id = self.run_id
        if event.session_id is None:
            event.session_id = self.session_id
        if event.type is AgentEventType.CUSTOM:
            self.agent.tracer.event(self, event)
        await self._channel.put(event)

    def register_tool(self, new_tool: Tool | Callable[..., Any]) -> Tool:
        """Add a tool to this run only. A name already taken raises ConfigurationError."""
        built = new_tool if isinstance(new_tool, Tool) else tool(new_tool)
        if built.name in self._options.tools:
            raise ConfigurationError(
                f"tool {built.name!r} is already registered for this run; choose another name"
            )
        self._options.tools[built.name] = built
        return built

    def tool_policy(self, name: str) -> ToolPolicy:
        """The policy that applies to a tool in this run."""
        found = self._options.tools.get(name)
        return self.agent.policy_for(name, found)

    def set_tool_decision(
        self, tool_call_id: str, approved: bool, reason: str | None = None
    ) -> None:
        """Record the approval or denial of an ``ask`` call (used by approval extensions)."""
        self._decisions[tool_call_id] = (approved, reason)

    def take_tool_decision(self, tool_call_id: str) -> tuple[bool, str | None] | None:
        """Pop the recorded decision for a call, if any."""
        return self._decisions.pop(tool_call_id, None)

    def has_tool_decision(self, tool_call_id: str) -> bool:
        """Whether a call is already decided (a resumed run's approved or denied call)."""
        return tool_call_id in self._decisions

    def is_resumed_ask(self, tool_call_id: str) -> bool:
        """Whether this call's approval was asked for before the run was resumed: the request
        is made again, for the same call, and says so (``resumed``)."""
        return tool_call_id in self._resumed_asks

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Mark the run as WAITING for an external answer for the duration of the block."""
        previous = self.state.phase
        self.state.phase = AgentPhase.WAITING
        try:
            yield
        finally:
            if self.state.phase is AgentPhase.WAITING:
                self.state.phase = previous

    def cancel(self, reason: str = "cancel_requested") -> bool:
        """Cancel the run; False if it already finished."""
        task = self._task
        if task is None or task.done():
            return False
        if self._cancel_reason is None:
            self._cancel_reason = reason
        task.cancel()
        return True


class AgentCore(CapabilityCalls, RunCalls):
    """An agent: a model (or bindings), tools and extensions, serving concurrent runs.

    One instance belongs to one event loop. It claims the loop of its first use; use from another
    loop raises LoopAffinityError. After ``aclose()`` every entry point raises AgentClosedError.
    Besides runs it offers the capability calls of its bindings (``embed``, ``rerank``,
    ``generate_image``, ``synthesize_speech``, ``transcribe``) and media jobs (``submit_image``,
    ``submit_video``), which ``aclose()`` cancels and awaits before it closes the providers.
    ``skills`` (a ``SkillManager`` or its paths) gives runs a skill catalogue; ``chat_structured``
    and ``run_skill`` are in ``RunCalls``.
    """

    def __init__(
        self,
        model: ModelLike,
        *,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        extensions: Iterable[AgentExtension] = (),
        config: AgentRunConfig | None = None,
        system_prompt: str | None = None,
        run_timeout: float | None = None,
        max_iterations: int = DEFAULT_MAX_ITERATIONS,
        tool_timeout: float | None = None,
        parallel_tool_calls: bool = False,
        tool_policies: Mapping[str, ToolPolicy | str] | None = None,
        default_policy: ToolPolicy | str = ToolPolicy.ALLOW,
        permission_callback: PermissionCallback | None = None,
        conversation_store: ConversationStore | None = None,
        tool_error_limit: int = DEFAULT_TOOL_ERROR_LIMIT,
        name: str = "default",
        model_params: Mapping[str, Any] | None = None,
        context_compactor: ContextCompactor | None = None,
        max_history_messages: int | None = DEFAULT_MAX_HISTORY_MESSAGES,
        skills: SkillManager | Iterable[str | os.PathLike[str]] | None = None,
        builtin_tools: Iterable[Tool] = (),
        tracer: RunTracer | None = None,
        checkpoint_sink: CheckpointSink | None = None,
    ) -> None:
        self.bindings = _as_bindings(model)
        # every run's checkpoints go here unless the run names its own (agent_runtime.checkpoints)
        self.checkpoint_sink = checkpoint_sink
        # told of every run, model call and tool call (agent_runtime.tracing); off by default
        self.tracer = tracer if tracer is not None else NO_TRACER
        if skills is None or isinstance(skills, SkillManager):
            self.skills: SkillManager | None = skills
        elif isinstance(skills, str | os.PathLike):
            raise ConfigurationError("skills= takes a SkillManager or a list of paths")
        else:
            self.skills = SkillManager(skills)
        if not self.bindings.llm:
            raise ConfigurationError("an AgentCore needs an llm binding (ModelBindings(llm=...))")
        self._media_jobs = set()
        self.registry = ToolRegistry()
        for built_in in builtin_tools:
            self.registry.register(built_in)
        for item in tools:
            self.registry.register(item)
        self._extensions: list[AgentExtension] = []
        for extension in extensions:
            self.add_extension(extension)
        if max_iterations < 1:
            raise ConfigurationError("max_iterations must be at least 1")
        if run_timeout is not None and run_timeout <= 0:
            raise ConfigurationError("run_timeout must be positive or None")
        self.name = name
        self.config = config
        self.system_prompt = system_prompt
        self.run_timeout = run_timeout
        self.max_iterations = max_iterations
        self.tool_timeout = tool_timeout
        self.parallel_tool_calls = parallel_tool_calls
        self.default_policy = ToolPolicy(default_policy)
        self._exact_policies: dict[str, ToolPolicy] = {}
        self._pattern_policies: list[tuple[str, ToolPolicy]] = []
        for pattern, policy in (tool_policies or {}).items():
            if any(ch in pattern for ch in "*?["):
                self._pattern_policies.append((pattern, ToolPolicy(policy)))
            else:
                self._exact_policies[pattern] = ToolPolicy(policy)
        self.permission_callback = permission_callback
        self.conversation_store = conversation_store
        self.tool_error_limit = tool_error_limit
        self.model_params = dict(model_params or {})
        if max_history_messages is not None and max_history_messages < 1:
            raise ConfigurationError("max_history_messages must be at least 1 or None")
        # compaction runs before each model call; the bound then trims the oldest whole turns
        self.context_compactor = context_compactor
        self.max_history_messages = max_history_messages
        self.state = AgentState()
        self._executor = ToolExecutor()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._close_task: asyncio.Future[None] | None = None
        self._runs: dict[str, AgentRunContext] = {}
        self._sessions: dict[str, str] = {}

    # construction helpers -----------------------------------------------------------------

    @classmethod
    async def create(
        cls, model: ModelLike, *, mcp_client: MCPClient | None = None, **kwargs: Any
    ) -> AgentCore:
        """Build an agent on the running loop (the async factory form).

        ``mcp_client`` is started and its tools registered (see ``add_mcp_client``).
        """
        agent = cls(model, **kwargs)
        agent._claim_loop()
        if mcp_client is not None:
            try:
                await agent.add_mcp_client(mcp_client)
            except BaseException:
                await agent.aclose()
                raise
        return agent

    async def add_mcp_client(self, client: MCPClient) -> None:
        """Start an MCP client (idempotent) and register its tools, named ``server__tool``.

        The agent does not own the client: ``aclose`` leaves it open. Close it yourself once
        the runs using it have finished.
        """
        await client.start()
        found = client.tools()
        taken = sorted(t.name for t in found if t.name in self.registry)
        if taken:
            raise ConfigurationError(f"MCP tool names already registered: {', '.join(taken)}")
        for item in found:
            self.registry.register(item)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, model: ModelLike, **kwargs: Any) -> AsyncIterator[AgentCore]:
        """``async with AgentCore.open(...) as agent``: closes the agent on exit."""
        agent = await cls.create(model, **kwargs)
        try:
            yield agent
        finally:
            await agent.aclose()

    def add_extension(self, extension: AgentExtension) -> None:
        """Register an extension; a second one with the same name raises ConfigurationError."""
        if not isinstance(extension, AgentExtension):
            raise ConfigurationError(f"{extension!r} is not an AgentExtension")
        if any(existing.name == extension.name for existing in self._extensions):
            raise ConfigurationError(
                f"an extension named {extension.name!r} is already registered; "
                "give each extension a unique name"
            )
        self._extensions.append(extension)
        # sort is stable: equal priorities keep registration order
        self._extensions.sort(key=lambda ext: -ext.priority)

    @property
    def extensions(self) -> tuple[AgentExtension, ...]:
        """Extensions in the order their hooks run."""
        return tuple(self._extensions)

    @property
    def active_runs(self) -> Mapping[str, AgentRunContext]:
        """Runs in flight, by run id."""
        return self._runs

    @property
    def active_sessions(self) -> Mapping[str, str]:
        """Sessions with a run in flight, mapped to that run's id."""
        return self._sessions

    @property
    def closed(self) -> bool:
        """True once ``aclose`` started."""
        return self._closed

    def policy_for(self, name: str, found: Tool | None = None) -> ToolPolicy:
        """The policy of a tool: its own, else the policy table, else the default."""
        if found is not None and found.policy is not None:
            return found.policy
        exact = self._exact_policies.get(name)
        if exact is not None:
            return exact
        for pattern, policy in self._pattern_policies:
            if fnmatch.fnmatchcase(name, pattern):
                return policy
        return self.default_policy

    # entry points ---------------------------------------------------------------------------

    async def chat(
        self,
        prompt: str,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Any,
    ) -> AgentResponse:
        """Run to completion and return the response; a failure raises its RunError."""
        message: AssistantMessage | None = None
        run_id = session_id = ""
        usage = Usage()
        new_messages: list[Message] = []
        structured: StructuredOutput | None = None
        async for event in self._stream(prompt, config, conversation, options, raise_on_fail=True):
            if event.type is AgentEventType.RUN_COMPLETED:
                message = event.message
                run_id = event.run_id
                session_id = event.session_id or ""
                usage = event.usage or Usage()
                new_messages = list(event.messages or ())
                structured = event.structured
        if message is None:  # pragma: no cover - the stream always ends with a terminal event
            raise RunError("run ended without a result")
        return AgentResponse(message, run_id, session_id, usage, new_messages, structured)

    def stream(
        self,
        prompt: str,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Any,
    ) -> AsyncIterator[AgentEvent]:
        """Stream the run's events. The last one is terminal (``run.completed``/``run.failed``).

        A failed run yields ``run.failed`` and then raises its RunError. Closing the stream early
        cancels the run. Options override the agent's defaults for this run: ``run_timeout``,
        ``max_iterations``, ``tool_timeout``, ``parallel_tool_calls``, ``system_prompt``,
        ``permission_callback``, ``extra_tools``, ``tool_filter``, ``model_params``,
        ``agent_name``, ``context_compactor``, ``tool_gate`` (a ``ToolGate``); ``skill`` (a
        skill of the catalogue, active from the start), ``skill_dispatch`` (False: no
        ``system_one`` routing), ``output_type`` or ``response_format`` and ``output_retries``
        (structured output, see ``structured``).
        """
        self._check_usable()
        return self._stream(prompt, config, conversation, options, raise_on_fail=True)

    def resume(
        self,
        checkpoint: RunCheckpoint,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Any,
    ) -> AsyncIterator[AgentEvent]:
        """Go on with a run from its checkpoint, with the checkpoint's run and session ids.

        The conversation before the run is read as for a new run (``conversation`` or the
        store), then the run's own part is put back; its first event is ``run.resumed``. Open
        calls: a started call of a tool that is not idempotent is not run again (its result
        says the outcome is unknown); approved and denied ones are not asked about again; one
        that waited for an approval asks again (``is_resumed_ask``). Options as ``stream``'s.
        """
        self._check_usable()
        if not isinstance(checkpoint, RunCheckpoint):
            raise ConfigurationError("resume() takes a RunCheckpoint (RunCheckpoint.from_dict)")
        base = config if config is not None else (self.config or AgentRunConfig())
        config = dataclasses.replace(
            base, run_id=checkpoint.run_id, session_id=checkpoint.session_id
        )
        return self._stream(
            checkpoint.prompt, config, conversation, options, raise_on_fail=True, resume=checkpoint
        )

    def emit_external_event(
        self, event: ExternalEvent, *, config: AgentRunConfig | None = None
    ) -> list[str]:
        """Offer an external answer to the extensions; returns the names of those that took it.

        Safe to call from any thread. An empty list means nobody was waiting for it: it was
        stale, duplicate, unknown or for another request.
        """
        if self._closed:
            raise AgentClosedError("the agent is closed")
        target = config if config is not None else self.config
        return [ext.name for ext in self._extensions if ext.accept(target, event)]

    def cancel_run(self, run_id: str, reason: str = "cancel_requested") -> bool:
        """Cancel a run in flight; False if no such run is active."""
        context = self._runs.get(run_id)
        return context.cancel(reason) if context is not None else False

    async def arefresh_credentials(self) -> None:
        """Rebuild every binding's provider (of every purpose) with a fresh credential."""
        self._check_usable()
        await self.bindings.arefresh()

    async def aclose(self) -> None:
        """Cancel runs still in flight, then cancel and await the media jobs, then close the
        providers the bindings built.

        Idempotent; concurrent callers wait for the same close.
        """
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._do_close())
        await asyncio.shield(self._close_task)

    async def _do_close(self) -> None:
        contexts = list(self._runs.values())
        for context in contexts:
            context.cancel("shutdown")
        tasks = [c._task for c in contexts if c._task is not None]
        if tasks:
            await asyncio.wait(tasks)
        # the jobs hold leases on the providers: they end before the providers close
        await self._drain_media_jobs()
        await self.bindings.aclose()
        self._executor.shutdown()

    # internals ------------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise LoopAffinityError(
                "this AgentCore belongs to another event loop; build one agent per loop",
                owner_loop=self._loop,
                current_loop=loop,
            )

    def _check_usable(self) -> None:
        if self._closed:
            raise AgentClosedError("the agent is closed; build a new one")
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no running loop yet: the loop is claimed at the first pull
            return
        self._claim_loop()

    def _options(
        self, options: Mapping[str, Any], conversation: Sequence[Message] | None
    ) -> _RunOptions:
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise ConfigurationError(f"unknown run option(s): {', '.join(sorted(unknown))}")
        max_iterations = options.get("max_iterations")
        if max_iterations is None:
            max_iterations = self.max_iterations
        if max_iterations < 1:
            raise ConfigurationError("max_iterations must be at least 1")
        run_timeout = options.get("run_timeout", UNSET)
        if run_timeout is UNSET:
            run_timeout = self.run_timeout
        if run_timeout is not None and run_timeout <= 0:
            raise ConfigurationError("run_timeout must be positive or None")
        tools = self.registry.snapshot()
        for extra in options.get("extra_tools") or ():
            built = extra if isinstance(extra, Tool) else tool(extra)
            if built.name in tools:
                raise ConfigurationError(
                    f"extra tool {built.name!r} collides with a registered tool"
                )
            tools[built.name] = built
        tool_filter = options.get("tool_filter")
        if tool_filter is not None:
            tools = {name: t for name, t in tools.items() if tool_filter(t)}
        params = dict(self.model_params)
        params.update(options.get("model_params") or {})
        skill = options.get("skill")
        skill_state: SkillState | None = None
        if self.skills is not None:
            skill_state = SkillState(
                self.skills,
                requested=skill,
                dispatch=bool(options.get("skill_dispatch", True)),
                system_one=self.bindings.system_one,
            )
        elif skill is not None:
            raise ConfigurationError(f"skill {skill!r} was asked for, but this agent has no skills")
        output = output_spec(
            output_type=options.get("output_type"),
            response_format=options.get("response_format"),
            max_retries=options.get("output_retries"),
        )
        return _RunOptions(
            run_timeout=run_timeout,
            max_iterations=max_iterations,
            tool_timeout=options.get("tool_timeout", self.tool_timeout),
            parallel_tool_calls=options.get("parallel_tool_calls", self.parallel_tool_calls),
            system_prompt=options.get("system_prompt", self.system_prompt),
            permission_callback=options.get("permission_callback", self.permission_callback),
            conversation=list(conversation) if conversation is not None else None,
            tools=tools,
            params=params,
            agent_name=options.get("agent_name") or self.name,
            context_compactor=options.get("context_compactor", self.context_compactor),
            tool_gate=options.get("tool_gate"),
            skill_state=skill_state,
            output=output,
            tool_filter=tool_filter,
            checkpoint_sink=options.get("checkpoint_sink", self.checkpoint_sink),
        )

    async def _stream(
        self,
        prompt: str,
        config: AgentRunConfig | None,
        conversation: Sequence[Message] | None,
        options: Mapping[str, Any],
        *,
        raise_on_fail: bool,
        resume: RunCheckpoint | None = None,
    ) -> AsyncIterator[AgentEvent]:  # an async generator: aclose() cancels the run
        self._check_usable()
        self._claim_loop()
        if not isinstance(prompt, str):
            raise ConfigurationError("prompt must be a string")
        run_options = self._options(options, conversation)
        run_options.resume = resume
        config = config if config is not None else (self.config or AgentRunConfig())
        run_id = config.run_id or new_id("run")
        session_id = config.session_id or new_id("anon")
        active = self._sessions.get(session_id)
        if active is not None:
            raise SessionBusyError(session_id, active)
        if run_id in self._runs:
            raise ConfigurationError(f"run id {run_id!r} is already in use")
        channel: Channel[AgentEvent] = Channel()
        context = AgentRunContext(self, config, run_id, session_id, run_options, channel)
        sink = run_options.checkpoint_sink
        if sink is not None:
            context._checkpoints = Checkpointer(
                sink,
                run_id,
                session_id,
                prompt,
                step=resume.step if resume is not None else 0,
                structured_answers=resume.structured_answers if resume is not None else 0,
                skill=resume.skill if resume is not None else options.get("skill"),
            )
        self._sessions[session_id] = run_id
        self._runs[run_id] = context
        self.state = context.state
        task = asyncio.get_running_loop().create_task(self._execute(context, prompt))
        context._task = task
        task.add_done_callback(lambda done: self._end_unstarted(context, done))
        failure: BaseException | None = None
        try:
            while True:
                try:
                    event = await channel.get()
                except ChannelClosed:
                    break
                yield event
            # the task closed the channel: it has finished or is about to
            await asyncio.wait([task])
            if not task.cancelled():
                failure = task.exception()
        finally:
            if not task.done():
                if context._cancel_reason is None:
                    context._cancel_reason = "consumer_closed"
                task.cancel()
                # wait for the run's cleanup; our own cancellation still propagates from here
                await asyncio.wait([task])
            if task.done() and not task.cancelled():
                task.exception()  # mark retrieved: the failure was reported as run.failed
        if failure is not None and raise_on_fail:
            raise failure
        if task.cancelled():
            # cancelled from elsewhere (cancel_run or aclose) while our consumer is still here:
            # not the consumer's own cancellation, so not a CancelledError
            raise RunCancelledError(context._cancel_reason or "cancelled", run_id=context.run_id)

    def _end_unstarted(self, context: AgentRunContext, task: asyncio.Task[None]) -> None:
        """End a run whose task was cancelled before its first step.

        Such a task never runs its body (``_execute``'s handlers included): nothing would put
        the terminal event, close the channel or forget the run, and its consumer would wait
        forever. Nothing of the run happened, so no extension is told.
        """
        if not task.cancelled() or context.state.phase is not AgentPhase.IDLE:
            return
        context.state.phase = AgentPhase.CANCELLED
        context._channel.put_nowait(
            AgentEvent(
                AgentEventType.RUN_CANCELLED,
                context.run_id,
                context.session_id,
                reason=context._cancel_reason or "cancelled",
            )
        )
        context._channel.close()
        self._runs.pop(context.run_id, None)
        if self._sessions.get(context.session_id) == context.run_id:
            del self._sessions[context.session_id]

    async def _execute(self, context: AgentRunContext, prompt: str) -> None:
        state = context.state
        options = context._options
        channel = context._channel
        # the run's task has its own context: tools of this run see this dict, no other run does
        _run_state.set({})
        try:
            with self.tracer.run(context, prompt):
                try:
                    async with asyncio.timeout(options.run_timeout) as deadline:
                        await self._run_loop(context, prompt)
                except TimeoutError as exc:
                    if deadline.expired():
                        raise RunTimeoutError(
                            options.run_timeout or 0.0, run_id=context.run_id
                        ) from exc
                    raise
        except asyncio.CancelledError:
            state.phase = AgentPhase.CANCELLED
            reason = context._cancel_reason or "cancelled"
            await self._notify_cancelled(context, reason)
            channel.put_nowait(
                AgentEvent(
                    AgentEventType.RUN_CANCELLED,
                    context.run_id,
                    context.session_id,
                    usage=state.usage,
                    # handed over: the run goes on elsewhere, so it leaves no stopped turn
                    messages=[] if reason == HANDOVER else state.stopped_messages(),
                    reason=reason,
                )
            )
            channel.close()
            raise
        except Exception as error:
            if isinstance(error, RunError) and error.run_id is None:
                error.run_id = context.run_id
            state.phase = AgentPhase.FAILED
            state.error = error
            await self._notify_error(context, error)
            channel.put_nowait(
                AgentEvent(
                    AgentEventType.RUN_FAILED,
                    context.run_id,
                    context.session_id,
                    error_code=getattr(error, "code", "internal"),
                    error=str(error),
                    usage=state.usage,
                    # a finer class of the failure (ProviderError: "malformed_response")
                    reason=getattr(error, "reason", None),
                )
            )
            channel.close()
            raise
        else:
            channel.close()
        finally:
            self._runs.pop(context.run_id, None)
            if self._sessions.get(context.session_id) == context.run_id:
                del self._sessions[context.session_id]

    async def _run_loop(self, context: AgentRunContext, prompt: str) -> None:
        state = context.state
        options = context._options
        channel = context._channel
        state.phase = AgentPhase.STARTING
        for extension in self._extensions:
            await extension.before_run(context)
        for extension in self._extensions:
            await extension.on_tool(context)
        if options.conversation is not None:
            history = options.conversation
        elif self.conversation_store is not None:
            history = await self.conversation_store.load(context.session_id)
        else:
            history = []
        resume = options.resume
        new_messages = state.added
        primary = self.bindings.llm[0]
        if resume is None:
            user = UserMessage(prompt)
            state.messages = [*history, user]
            new_messages.append(user)
            await channel.put(
                AgentEvent(
                    AgentEventType.RUN_STARTED,
                    context.run_id,
                    context.session_id,
                    agent=options.agent_name,
                    model=primary.model,
                )
            )
        else:
            # the run's own part of the conversation is put back after what came before it
            state.messages = [*history, *resume.added]
            new_messages.extend(resume.added)
            state.iteration = resume.iteration
            state.usage = Usage(
                resume.usage.input_tokens, resume.usage.output_tokens, resume.usage.model
            )
            await channel.put(
                AgentEvent(
                    AgentEventType.RUN_RESUMED,
                    context.run_id,
                    context.session_id,
                    agent=options.agent_name,
                    model=primary.model,
                    payload={"from_step": resume.step},
                )
            )
        skills = options.skill_state
        if skills is not None:
            await skills.start(context, prompt)
            for name, built in skills.tools().items():
                if options.tool_filter is not None and not options.tool_filter(built):
                    continue  # the run's filter reaches the skill tools too
                if name in options.tools:
                    raise ConfigurationError(
                        f"tool {name!r} collides with the skill tool of that name; rename it"
                    )
                options.tools[name] = built
        system = options.system_prompt
        if skills is not None:
            system = skills.system_prompt(system)
        output = options.output
        if output is not None:
            system = f"{system}\n\n{output.instructions()}" if system else output.instructions()
        structured: StructuredOutput | None = None
        answers = resume.structured_answers if resume is not None else 0
        checkpoints = context._checkpoints
        if resume is not None and resume.calls:
            # the last model response's calls that have no result yet, each by its state
            results = await self._resume_tools(context, resume)
            state.messages.extend(results)
            new_messages.extend(results)
            if checkpoints is not None:
                checkpoints.close()
                await checkpoints.save(new_messages, state.iteration, state.usage)
        while True:
            if state.iteration >= options.max_iterations:
                raise MaxIterationsError(
                    f"the model was still calling tools after {options.max_iterations} model "
                    "calls; raise max_iterations or check the tools' results",
                    run_id=context.run_id,
                )
            state.iteration += 1
            state.phase = AgentPhase.MODEL
            state.messages = await prepare_context(
                state.messages,
                compactor=options.context_compactor,
                max_messages=self.max_history_messages,
                run_id=context.run_id,
            )
            # read each time: a skill activated by the last batch narrows what is advertised
            if skills is not None:
                specs = skills.advertised(options.tools)
            else:
                specs = [t.spec for t in options.tools.values()]
            request = ModelRequest(
                messages=list(state.messages),
                tools=specs,
                system=system,
                run_id=context.run_id,
                session_id=context.session_id,
                params=options.params,
                output_schema=output.schema if output is not None else None,
            )
            response = await self._call_model(context, request)
            message = response.message
            state.messages.append(message)
            if not message.tool_calls and output is not None:
                answers += 1
                # in a thread: a large answer, or a client's schema with a costly pattern, must
                # not hold up the loop's other runs
                verdict = await asyncio.to_thread(output.check, message.content or "")
                if verdict.ok:
                    structured = StructuredOutput(verdict.value, verdict.json)
                elif answers > output.max_retries:
                    raise StructuredOutputError(
                        verdict.summary,
                        attempts=answers,
                        output=message.content or "",
                        run_id=context.run_id,
                    )
                else:
                    # the rejected answer and the correction stay out of the stored turn
                    state.messages.append(UserMessage(output.retry_prompt(verdict.feedback)))
                    if checkpoints is not None:
                        checkpoints.structured_answers = answers
                    continue
            new_messages.append(message)
            if checkpoints is not None:
                checkpoints.structured_answers = answers
                checkpoints.open(message.tool_calls)
                await checkpoints.save(new_messages, state.iteration, state.usage)
            if not message.tool_calls:
                break
            state.phase = AgentPhase.TOOLS
            # tools have side effects: run them only once the consumer has seen the calls
            # coming, so a consumer that already left cancels instead
            await channel.wait_consumer_idle()
            results = await self._run_tools(context, message.tool_calls)
            state.messages.extend(results)
            new_messages.extend(results)
            if checkpoints is not None:
                checkpoints.close()
            if state.consecutive_tool_errors >= self.tool_error_limit:
                raise ToolErrorLimitError(
                    f"{state.consecutive_tool_errors} consecutive tool calls failed or were "
                    "denied; the run was stopped",
                    run_id=context.run_id,
                )
        # the run counts as completed only once its consumer has taken every event
        await channel.wait_consumer_idle()
        if self.conversation_store is not None and options.conversation is None:
            await self.conversation_store.append(context.session_id, new_messages)
        for extension in self._extensions:
            await extension.on_success(context, message)
        state.phase = AgentPhase.COMPLETED
        channel.put_nowait(
            AgentEvent(
                AgentEventType.RUN_COMPLETED,
                context.run_id,
                context.session_id,
                message=message,
                usage=state.usage,
                messages=new_messages,
                structured=structured,
            )
        )

    async def _call_model(self, context: AgentRunContext, request: ModelRequest) -> ModelResponse:
        """One model call, with retries on the same binding and failover to the next one."""
        channel = context._channel
        run_id = context.run_id
        session_id = context.session_id
        last_error: ProviderError | None = None
        partial = context.state.partial
        tracer = self.tracer
        for binding in self.bindings.llm:
            attempt = 0
            while True:
                model_call_id = new_id("mcall")
                request.model_call_id = model_call_id
                emitted = False
                response: ModelResponse | None = None
                retry = _DEFAULT_RETRY
                try:
                    with tracer.model_call(context, binding, request) as trace:
                        async with binding.lease_provider() as provider:
                            retry = getattr(provider, "retry", None) or _DEFAULT_RETRY
                            stream = provider.stream(request)
                            try:
                                async for item in stream:
                                    kind = item.kind
                                    if kind is ModelEventKind.TEXT:
                                        if item.delta:
                                            emitted = True
                                            partial.append(item.delta)
                                            await channel.put(
                                                AgentEvent(
                                                    AgentEventType.TEXT_DELTA,
                                                    run_id,
                                                    session_id,
                                                    model_call_id,
                                                    delta=item.delta,
                                                )
                                            )
                                    elif kind is ModelEventKind.COMPLETED:
                                        response = item.response
                            finally:
                                aclose = getattr(stream, "aclose", None)
                                if aclose is not None:
                                    await aclose()
                        if response is None:
                            raise ProviderError(
                                f"model {binding.model} ended its stream without a completed event"
                            )
                        trace.response(response)
                except ProviderError as exc:
                    exc.run_id = run_id
                    if emitted or not exc.retryable:
                        raise
                    last_error = exc
                    attempt += 1
                    if attempt <= retry.max_retries:
                        await asyncio.sleep(retry.delay(attempt, exc.retry_after))
                        continue
                    logger.warning(
                        "model binding failed, trying the next one",
                        extra={"run_id": run_id, "model": binding.model, "status": exc.status_code},
                    )
                    break
                # the answer is whole: it joins the conversation, its text is no longer partial
                partial.clear()
                if response.usage is not None:
                    # the binding that answered, which after a failover is not the primary
                    usage = Usage(
                        response.usage.input_tokens,
                        response.usage.output_tokens,
                        response.usage.model or binding.model,
                    )
                    context.state.usage.add(usage)
                    await channel.put(
                        AgentEvent(
                            AgentEventType.USAGE,
                            run_id,
                            session_id,
                            model_call_id,
                            usage=usage,
                            model=usage.model,
                        )
                    )
                return response
        assert last_error is not None
        raise last_error

    async def _resume_tools(
        self, context: AgentRunContext, checkpoint: RunCheckpoint
    ) -> list[ToolMessage]:
        """The open calls of a resumed run: each goes on from the state it was saved in."""
        calls: list[ToolCall] = []
        settled: dict[str, str] = {}  # a started call of a tool that must not run twice
        asks: set[str] = set()
        tools = context._options.tools
        for call, call_state in checkpoint.open_calls():
            calls.append(call)
            found = tools.get(call.name)
            if call_state == "started":
                if found is not None and found.idempotent:
                    context.set_tool_decision(call.id, True)  # it was allowed to start
                else:
                    settled[call.id] = unknown_outcome(call)
            elif call_state == "approved":
                context.set_tool_decision(call.id, True)
                context.state.approvals[call.id] = "approved"
            elif call_state == "denied":
                context.set_tool_decision(
                    call.id, False, f"the call to {call.name!r} was denied by the user"
                )
                context.state.approvals[call.id] = "denied"
            elif call_state == "awaiting_approval":
                asks.add(call.id)
        context._resumed_asks = frozenset(asks)
        checkpoints = context._checkpoints
        if checkpoints is not None:
            checkpoints.open(calls)
            for call, call_state in checkpoint.open_calls():
                checkpoints.mark(call, call_state)
        return await self._run_tools(context, calls, settled=settled, announced=True)

    async def _run_tools(
        self,
        context: AgentRunContext,
        calls: list[ToolCall],
        *,
        settled: Mapping[str, str] | None = None,
        announced: bool = False,
    ) -> list[ToolMessage]:
        """Run one model response's calls. ``settled``: calls whose result is this error, not
        run (a resumed run's unknown outcomes); ``announced``: a resumed run's calls, whose
        ``tool.call.started`` its consumer already saw unless they were still pending."""
        options = context._options
        if settled or announced:
            pending = {
                c.call_id
                for c in (options.resume.calls if options.resume is not None else ())
                if c.state == "pending"
            }
            results = []
            for call in calls:
                refusal = (settled or {}).get(call.id)
                if refusal is not None:
                    ready: Tool | str = refusal
                else:
                    ready = await self._prepare_call(
                        context, call, announce=not announced or call.id in pending
                    )
                results.append(await self._finish_call(context, call, ready))
            self._count_errors(context, results)
            return results
        if options.parallel_tool_calls and len(calls) > 1:
            # checks (hooks, permissions) stay sequential in call order; execution overlaps
            prepared = [await self._prepare_call(context, call) for call in calls]
            finished = await asyncio.gather(
                *(
                    self._finish_call(context, call, ready)
                    for call, ready in zip(calls, prepared, strict=True)
                )
            )
            results = list(finished)
        else:
            results = []
            for call in calls:
                ready = await self._prepare_call(context, call)
                results.append(await self._finish_call(context, call, ready))
        self._count_errors(context, results)
        return results

    @staticmethod
    def _count_errors(context: AgentRunContext, results: Sequence[ToolMessage]) -> None:
        state = context.state
        for result in results:
            if result.is_error:
                state.consecutive_tool_errors += 1
            else:
                state.consecutive_tool_errors = 0

    async def _prepare_call(
        self, context: AgentRunContext, call: ToolCall, *, announce: bool = True
    ) -> Tool | str:
        """Announce a call, run before_tool hooks and checks; a string is the refusal."""
        if announce:
            await context._channel.put(
                AgentEvent(
                    AgentEventType.TOOL_CALL_STARTED,
                    context.run_id,
                    context.session_id,
                    tool_call_id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                )
            )
        found = context._options.tools.get(call.name)
        if found is None:
            return f"unknown tool {call.name!r}: it is not available in this run"
        skills = context._options.skill_state
        if skills is not None and not skills.allows(call.name):
            # refused before any hook or approval: an unadvertised tool never asks anyone
            return skills.refusal(call.name)
        checkpoints = context._checkpoints
        asks = (
            checkpoints is not None
            and not context.has_tool_decision(call.id)
            and context.tool_policy(call.name) is ToolPolicy.ASK
        )
        if asks and checkpoints is not None:
            # saved before the wait: a run parked or lost while it waits is resumed waiting
            checkpoints.mark(call, "awaiting_approval")
            await self._save_checkpoint(context)
        for extension in self._extensions:
            await extension.before_tool(context, call)
        policy = context.tool_policy(call.name)
        if policy is ToolPolicy.DENY:
            return f"tool {call.name!r} is not allowed by policy"
        if policy is ToolPolicy.ASK:
            approved, reason = await self._ask(context, call)
            context.state.approvals[call.id] = "approved" if approved else "denied"
            if asks and checkpoints is not None:
                checkpoints.mark(call, "approved" if approved else "denied")
                await self._save_checkpoint(context)
            if not approved:
                return reason or f"the call to {call.name!r} was denied"
        return found

    async def _save_checkpoint(self, context: AgentRunContext) -> None:
        checkpoints = context._checkpoints
        if checkpoints is not None:
            state = context.state
            await checkpoints.save(state.added, state.iteration, state.usage)

    async def _ask(self, context: AgentRunContext, call: ToolCall) -> tuple[bool, str | None]:
        decision = context.take_tool_decision(call.id)
        if decision is not None:
            return decision
        callback = context._options.permission_callback
        if callback is None:
            return False, (
                f"the call to {call.name!r} was denied: it needs approval and no approver "
                "is configured"
            )
        try:
            verdict = callback(context, call)
            if asyncio.iscoroutine(verdict) or isinstance(verdict, Awaitable):
                verdict = await verdict
        except Exception as exc:  # a failing approver fails closed
            logger.warning(
                "permission callback raised; the call is denied",
                extra={"run_id": context.run_id, "tool": call.name, "error": type(exc).__name__},
            )
            return False, f"the call to {call.name!r} was denied (approval check failed)"
        if verdict is True:
            return True, None
        return False, f"the call to {call.name!r} was denied"

    async def _finish_call(
        self, context: AgentRunContext, call: ToolCall, ready: Tool | str
    ) -> ToolMessage:
        checkpoints = context._checkpoints
        if checkpoints is not None and not isinstance(ready, str) and not ready.idempotent:
            # saved before the body starts: a resumed run does not run it a second time
            checkpoints.mark(call, "started")
            await self._save_checkpoint(context)
        gate = context._options.tool_gate
        if gate is not None and not isinstance(ready, str):
            # asked here, with nothing awaited before the call starts: what it says holds
            ready = gate(call) or ready
        with self.tracer.tool_call(context, call) as trace:
            if isinstance(ready, str):
                outcome_error: str | None = ready
                result: Any = None
            else:
                timeout = (
                    ready.timeout if ready.timeout is not None else context._options.tool_timeout
                )
                result, outcome_error = await self._executor.execute(ready, call, timeout)
            outcome = ToolOutcome(result, outcome_error)
            trace.outcome(outcome, refused=isinstance(ready, str))
            for extension in self._extensions:
                await extension.after_tool(context, call, outcome)
        is_error = outcome_error is not None
        content = f"Error: {outcome_error}" if is_error else self._executor.render(result)
        approval = context.state.approvals.get(call.id)
        message = ToolMessage(call.id, call.name, content, is_error, approval=approval)
        if checkpoints is not None:
            # saved before it is told: a reader never sees a result a resume would not know
            checkpoints.finished(message)
            await self._save_checkpoint(context)
        await context._channel.put(
            AgentEvent(
                AgentEventType.TOOL_CALL_COMPLETED,
                context.run_id,
                context.session_id,
                tool_call_id=call.id,
                name=call.name,
                result=None if is_error else result,
                error=outcome_error,
                is_error=is_error,
            )
        )
        return message

    async def _notify_cancelled(self, context: AgentRunContext, reason: str) -> None:
        notice = RunCancelledEvent(reason)
        for extension in self._extensions:
            try:
                await extension.on_event(context, notice)
            except Exception:
                logger.exception(
                    "extension %s failed while handling cancellation",
                    extension.name,
                    extra={"run_id": context.run_id},
                )

    async def _notify_error(self, context: AgentRunContext, error: Exception) -> None:
        for extension in self._extensions:
            try:
                await extension.on_error(context, error)
            except Exception:
                logger.exception(
                    "extension %s failed in on_error",
                    extension.name,
                    extra={"run_id": context.run_id},
                )


_OPTION_NAMES = frozenset(
    {
        "run_timeout",
        "max_iterations",
        "tool_timeout",
        "parallel_tool_calls",
        "system_prompt",
        "permission_callback",
        "extra_tools",
        "tool_filter",
        "model_params",
        "agent_name",
        "context_compactor",
        "tool_gate",
        "skill",
        "skill_dispatch",
        "output_type",
        "response_format",
        "output_retries",
        "checkpoint_sink",
    }
)


def _as_bindings(model: ModelLike) -> ModelBindings:
    if isinstance(model, ModelBindings):
        return model
    if isinstance(model, ModelBinding):
        return ModelBindings(llm=[model])
    if callable(getattr(model, "stream", None)):
        return ModelBindings(llm=[ModelBinding(provider=model)])
    raise ConfigurationError(
        f"{model!r} is not a model: pass an object with stream(request), a ModelBinding or "
        "ModelBindings"
    )
