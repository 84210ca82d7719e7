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
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Unpack

from .capabilities.agent_calls import CapabilityCalls, CapabilityHost
from .capabilities.jobs import MediaJob
from .channel import EMPTY, ChannelClosed
from .checkpoints import CheckpointSink, RunCheckpoint
from .compaction import DEFAULT_MAX_HISTORY_MESSAGES, ContextCompactor
from .content import (
    ContentStore,
    MemoryContentStore,
    Prompt,
    check_prompt,
    content_text,
)
from .conversation import ConversationStore, InMemoryConversationStore
from .core_arguments import ModelLike, as_bindings, as_skills, check_limits, policy_table
from .errors import (
    AgentClosedError,
    ConfigurationError,
    LoopAffinityError,
    RunCancelledError,
    RunError,
    SessionBusyError,
)
from .events import AgentEvent, AgentEventType, EventTap
from .extensions.base import AgentExtension
from .messages import AssistantMessage, Message
from .model import Usage
from .model_calls import ModelCalls
from .run_calls import ChatHost, RunCalls
from .run_context import (
    BARE_CONTEXT,
    CANCELLED_CALL,
    AgentResponse,
    AgentRunConfig,
    AgentRunContext,
    AgentState,
    ModelGate,
    PermissionCallback,
    ToolGate,
    new_id,
)
from .run_loop import RunLoop
from .run_options import RunOptions
from .run_setup import (
    build_run_options,
    run_context,
)
from .skills.catalogue import SkillManager
from .structured import StructuredOutput, aoutput_spec
from .tool_calls import ToolCalls
from .tools.base import Tool, ToolPolicy
from .tools.execution import ToolExecutor
from .tools.registry import ToolRegistry
from .tracing import NO_TRACER, RunTracer

if TYPE_CHECKING:
    from .extensions.external import ExternalEvent
    from .mcp import MCPClient

__all__ = [
    "CANCELLED_CALL",
    "AgentCore",
    "AgentResponse",
    "AgentRunConfig",
    "AgentRunContext",
    "AgentState",
    "ConversationStore",
    "InMemoryConversationStore",
    "ModelGate",
    "ModelLike",
    "PermissionCallback",
    "ToolGate",
]

logger = logging.getLogger("agent_runtime")


DEFAULT_MAX_ITERATIONS = 50
DEFAULT_TOOL_ERROR_LIMIT = 5


class AgentCore(CapabilityCalls, RunCalls, RunLoop):
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
        content_store: ContentStore | None = None,
    ) -> None:
        self.bindings = as_bindings(model)
        # the bytes of images and documents: a run's parts are stored here, messages hold refs
        self.content_store: ContentStore = (
            content_store if content_store is not None else MemoryContentStore()
        )
        # every run's checkpoints go here unless the run names its own (agent_runtime.checkpoints)
        self.checkpoint_sink = checkpoint_sink
        # told of every run, model call and tool call (agent_runtime.tracing); off by default
        self.tracer = tracer if tracer is not None else NO_TRACER
        self.skills: SkillManager | None = as_skills(skills)
        if not self.bindings.llm:
            raise ConfigurationError("an AgentCore needs an llm binding (ModelBindings(llm=...))")
        self._media_jobs: set[MediaJob[Any]] = set()
        self.registry = ToolRegistry()
        for built_in in builtin_tools:
            self.registry.register(built_in)
        for item in tools:
            self.registry.register(item)
        self._extensions: list[AgentExtension] = []
        for extension in extensions:
            self.add_extension(extension)
        check_limits(max_iterations, run_timeout, max_history_messages)
        self.name = name
        self.config = config
        self.system_prompt = system_prompt
        self.run_timeout = run_timeout
        self.max_iterations = max_iterations
        self.tool_timeout = tool_timeout
        self.parallel_tool_calls = parallel_tool_calls
        self.default_policy = ToolPolicy(default_policy)
        self._exact_policies, self._pattern_policies = policy_table(tool_policies or {})
        self.permission_callback = permission_callback
        self.conversation_store = conversation_store
        self.tool_error_limit = tool_error_limit
        self.model_params = dict(model_params or {})
        # compaction runs before each model call; the bound then trims the oldest whole turns
        self.context_compactor = context_compactor
        self.max_history_messages = max_history_messages
        self.state = AgentState()
        self._executor = ToolExecutor()
        self._model_calls = ModelCalls(self.bindings, self.tracer)
        self._tool_calls = ToolCalls(self._extensions, self._executor, self.tracer)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._close_task: asyncio.Future[None] | None = None
        self._runs: dict[str, AgentRunContext] = {}
        self._sessions: dict[str, str] = {}
        # one bound method for every run task's done callback (not a closure per run)
        self._task_done = self._end_unstarted

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
        prompt: Prompt,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Unpack[RunOptions],
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
        prompt: Prompt,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        tap: EventTap | None = None,
        **options: Unpack[RunOptions],
    ) -> AsyncIterator[AgentEvent]:
        """Stream the run's events. The last one is terminal (``run.completed``/``run.failed``).

        ``prompt`` is a string, or content parts (``agent_runtime.content``: text, images,
        documents); parts given as bytes are stored in the agent's ``content_store`` when the
        run starts, and the conversation keeps their references.

        A failed run yields ``run.failed`` and then raises its RunError. Closing the stream early
        cancels the run. Options (``RunOptions``, ``agent_runtime.run_options``) override the
        agent's defaults for this run.

        ``tap``, for a consumer whose work on most events is synchronous: called in the run's
        own task with an event the stream would otherwise wake the consumer for, at a moment
        the consumer waits having taken every earlier event; True takes the event there (the
        stream does not yield it), False leaves it to the stream. It must not block or raise.
        """
        self._check_usable()
        return self._stream(prompt, config, conversation, options, raise_on_fail=True, tap=tap)

    def resume(
        self,
        checkpoint: RunCheckpoint,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        tap: EventTap | None = None,
        **options: Unpack[RunOptions],
    ) -> AsyncIterator[AgentEvent]:
        """Go on with a run from its checkpoint, with the checkpoint's run and session ids.

        The conversation before the run is read as for a new run (``conversation`` or the
        store), then the run's own part is put back; its first event is ``run.resumed``. Open
        calls: a started call of a tool that is not idempotent is not run again (its result
        says the outcome is unknown); approved and denied ones are not asked about again; one
        that waited for an approval asks again (``is_resumed_ask``). Options and ``tap`` as
        ``stream``'s.
        """
        self._check_usable()
        if not isinstance(checkpoint, RunCheckpoint):
            raise ConfigurationError("resume() takes a RunCheckpoint (RunCheckpoint.from_dict)")
        base = config if config is not None else (self.config or AgentRunConfig())
        config = dataclasses.replace(
            base, run_id=checkpoint.run_id, session_id=checkpoint.session_id
        )
        return self._stream(
            checkpoint.prompt,
            config,
            conversation,
            options,
            raise_on_fail=True,
            resume=checkpoint,
            tap=tap,
        )

    def emit_external_event(
        self, event: ExternalEvent, *, config: AgentRunConfig | None = None
    ) -> list[str]:
        """Offer an external answer to the extensions; returns the names of those that took it.

        Safe to call from any thread. An empty list means nobody was waiting for it: it was
        stale, duplicate, unknown or for another request. An answer a waiting run refuses for
        a reason its sender can fix (an approval with edited arguments the tool does not take)
        raises that ``AnswerRefusedError``; the run keeps waiting.
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

    async def _stream(
        self,
        prompt: Prompt,
        config: AgentRunConfig | None,
        conversation: Sequence[Message] | None,
        options: RunOptions,
        *,
        raise_on_fail: bool,
        resume: RunCheckpoint | None = None,
        tap: EventTap | None = None,
    ) -> AsyncIterator[AgentEvent]:  # an async generator: aclose() cancels the run
        self._check_usable()
        self._claim_loop()
        prompt = check_prompt(prompt)
        prompt_text = content_text(prompt)
        # a client's schema is checked off the loop: that takes ~50 µs a JSON value
        output = await aoutput_spec(
            output_type=options.get("output_type"),
            response_format=options.get("response_format"),
            max_retries=options.get("output_retries"),
        )
        run_options = build_run_options(self, options, conversation, output)
        run_options.resume = resume
        config = config if config is not None else (self.config or AgentRunConfig())
        run_id = config.run_id or new_id("run")
        session_id = config.session_id or new_id("anon")
        active = self._sessions.get(session_id)
        if active is not None:
            raise SessionBusyError(session_id, active)
        if run_id in self._runs:
            raise ConfigurationError(f"run id {run_id!r} is already in use")
        context = run_context(
            self, config, run_id, session_id, run_options, prompt_text, options.get("skill")
        )
        channel = context._channel
        channel.tap = tap
        self._sessions[session_id] = run_id
        self._runs[run_id] = context
        self.state = context.state
        # named by the run id it already holds (a default name is a string of its own)
        task = asyncio.get_running_loop().create_task(self._execute(context, prompt), name=run_id)
        context._task = task
        task.add_done_callback(self._task_done, context=BARE_CONTEXT)
        # this generator lives as long as the run (maybe hours): it lets go of its setup
        del prompt, prompt_text, conversation, options, output, run_options
        failure: BaseException | None = None
        try:
            while True:
                try:
                    event = channel.poll()
                except ChannelClosed:
                    break
                if event is EMPTY:  # a future, not a coroutine, while the run waits
                    await channel.readable()
                    continue
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

    def _end_unstarted(self, task: asyncio.Task[None]) -> None:
        """End a run whose task was cancelled before its first step.

        Such a task never runs its body (``_execute``'s handlers included): nothing would put
        the terminal event, close the channel or forget the run, and its consumer would wait
        forever. Nothing of the run happened, so no extension is told.
        """
        context = self._runs.get(task.get_name())  # the task is named by its run's id
        if context is None or context._task is not task or not context.end_unstarted():
            return
        self._runs.pop(context.run_id, None)
        if self._sessions.get(context.session_id) == context.run_id:
            del self._sessions[context.session_id]


if TYPE_CHECKING:
    # AgentCore is the host its mixins name: a member it lacks is a type error here
    def _hosts(agent: AgentCore) -> tuple[CapabilityHost, ChatHost]:
        return agent, agent
