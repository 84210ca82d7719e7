"""The state one run owns: its routing identity (``AgentRunConfig``), its progress
(``AgentState``), the options it runs with and the context every extension hook receives.

``AgentCore`` (``agent_runtime.agent``) builds one ``AgentRunContext`` per run; nothing here
outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, cast

from .channel import Channel
from .checkpoints import Checkpointer, CheckpointSink, RunCheckpoint
from .compaction import ContextCompactor
from .content import ContentStore
from .errors import ConfigurationError
from .events import AgentEvent, AgentEventType, AgentPhase
from .messages import AssistantMessage, Message, ToolCall, ToolMessage
from .model import Usage
from .skills.activation import SkillState
from .structured import OutputSpec, StructuredOutput
from .tools.base import Tool, ToolPolicy, tool

if TYPE_CHECKING:
    from .bindings.chains import ModelBindings
    from .skills.catalogue import SkillManager
    from .tools.registry import ToolRegistry

__all__ = [
    "BARE_CONTEXT",
    "CANCELLED_CALL",
    "HANDOVER",
    "UNSET",
    "AgentResponse",
    "AgentRunConfig",
    "AgentRunContext",
    "AgentState",
    "AnswerGate",
    "ModelGate",
    "PermissionCallback",
    "RunHost",
    "RunOptions",
    "ToolGate",
    "new_id",
]

PermissionCallback: TypeAlias = Callable[["AgentRunContext", ToolCall], "bool | Awaitable[bool]"]
ToolGate: TypeAlias = Callable[[ToolCall], "str | None"]
"""A run's last word on a tool call, asked (synchronously) right before the call executes, after
its hooks, policy and approval: None lets it run, a string refuses it with that error."""
ModelGate: TypeAlias = Callable[["AgentRunContext"], Awaitable[None]]
"""Awaited right before each model call of a run's loop; a ``RunError`` it raises ends the run
with that error (its ``code`` the run's failure code), before the call is made."""


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


BARE_CONTEXT = contextvars.Context()
"""The context of callbacks that read no context variable: passed to ``add_done_callback``
(``context=``), it spares the copy of the current one each callback otherwise keeps."""


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
    model call in flight and ``partial_reasoning`` its reasoning; ``approvals`` the decision on
    each ``ask`` call, by call id; ``edits`` the arguments a person approved a call with
    instead of the model's, by call id."""

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
    partial_reasoning: list[str] = field(default_factory=list)
    approvals: dict[str, Literal["approved", "denied"]] = field(default_factory=dict)
    edits: dict[str, dict[str, Any]] = field(default_factory=dict)

    def edit_call(self, call: ToolCall, arguments: Mapping[str, Any]) -> ToolCall:
        """Replace ``call`` by the same call with ``arguments``, in the assistant message that
        made it (a new message object, in ``added`` and ``messages``: a checkpoint already
        handed out keeps what it saw); the edited call."""
        edited = ToolCall(call.id, call.name, dict(arguments))
        for messages in (self.added, self.messages):
            for index in range(len(messages) - 1, -1, -1):
                message = messages[index]
                if not isinstance(message, AssistantMessage):
                    continue
                calls = [edited if c.id == call.id else c for c in message.tool_calls]
                if calls != message.tool_calls:
                    messages[index] = replace(message, tool_calls=calls)
                    break
        self.edits[call.id] = edited.arguments
        return edited

    def stopped_messages(self) -> list[Message]:
        """What the run added, as far as it got, as a conversation that can be carried on.

        The text of a model call cut short (and its reasoning so far) becomes an assistant
        message of its own, and a tool call that had not returned gets an error result
        (``CANCELLED_CALL``), so every call in the list has its result, as every provider
        requires. A cut call's message has no reasoning state: nothing was signed yet.
        """
        messages = list(self.added)
        if self.partial or self.partial_reasoning:
            messages.append(
                AssistantMessage(
                    "".join(self.partial) or None,
                    reasoning="".join(self.partial_reasoning) or None,
                )
            )
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


@dataclass(slots=True)
class RunOptions:
    run_timeout: float | None
    max_iterations: int
    tool_timeout: float | None
    parallel_tool_calls: bool
    system_prompt: str | None
    permission_callback: PermissionCallback | None
    conversation: list[Message] | None
    # the agent's shared snapshot (read-only) until the run adds a tool of its own (add_tool)
    tools: Mapping[str, Tool]
    params: dict[str, Any]
    agent_name: str | None
    context_compactor: ContextCompactor | None = None
    tool_gate: ToolGate | None = None
    model_gate: ModelGate | None = None
    skill_state: SkillState | None = None
    output: OutputSpec | None = None
    tool_filter: Callable[[Tool], bool] | None = None
    checkpoint_sink: CheckpointSink | None = None
    resume: RunCheckpoint | None = None

    def add_tool(self, name: str, built: Tool) -> None:
        """Add a tool to this run only: its tools become a copy of the agent's the first
        time (runs that add none share one)."""
        tools = self.tools if isinstance(self.tools, dict) else dict(self.tools)
        tools[name] = built
        self.tools = tools


class AnswerGate(Protocol):
    """An extension whose waits take external answers (``ExternalEventExtension``): a run
    being handed over asks it to stop taking them, atomically with respect to ``accept``."""

    def suspend_answers(self, context: AgentRunContext) -> bool:
        """Refuse answers to the run's waits from now on; False, changing nothing, if one of
        them already took an answer."""
        ...

    def resume_answers(self, context: AgentRunContext) -> None:
        """Take answers again (the hand-over did not happen)."""
        ...


class _EventTracer(Protocol):
    def event(self, context: AgentRunContext, event: AgentEvent) -> None: ...


class RunHost(Protocol):
    """The agent a run belongs to, as the run sees it (``AgentCore`` is one): its defaults,
    tools, extensions, tracer and content store. A protocol, because ``agent_runtime.agent``
    imports this module."""

    name: str
    bindings: ModelBindings
    registry: ToolRegistry
    skills: SkillManager | None
    system_prompt: str | None
    run_timeout: float | None
    max_iterations: int
    tool_timeout: float | None
    parallel_tool_calls: bool
    permission_callback: PermissionCallback | None
    model_params: dict[str, Any]
    context_compactor: ContextCompactor | None
    checkpoint_sink: CheckpointSink | None
    content_store: ContentStore

    @property
    def tracer(self) -> _EventTracer: ...

    @property
    def extensions(self) -> Sequence[object]: ...

    def policy_for(self, name: str, found: Tool | None = None) -> ToolPolicy: ...


_NO_ASKS: Mapping[str, datetime | None] = MappingProxyType({})


class _Waiting:
    """``AgentRunContext.waiting``: a class, not a generator, since it lives as long as the
    wait and a run may wait for hours."""

    __slots__ = ("_previous", "_state")

    def __init__(self, state: AgentState) -> None:
        self._state = state
        self._previous = state.phase

    def __enter__(self) -> None:
        self._previous = self._state.phase
        self._state.phase = AgentPhase.WAITING

    def __exit__(self, *exc_info: object) -> None:
        if self._state.phase is AgentPhase.WAITING:
            self._state.phase = self._previous


class AgentRunContext:
    """Everything one run owns. Passed to every extension hook.

    Compared and hashed by identity, so it is a safe key for request-local maps.
    """

    __slots__ = (
        "_cancel_reason",
        "_channel",
        "_checkpoints",
        "_decisions",
        "_edits",
        "_options",
        "_resumed_asks",
        "_task",
        "_tool_state",
        "agent",
        "config",
        "run_id",
        "session_id",
        "state",
    )

    def __init__(
        self,
        agent: RunHost,
        config: AgentRunConfig,
        run_id: str,
        session_id: str,
        options: RunOptions,
        channel: Channel[AgentEvent],
    ) -> None:
        self.agent = agent
        self.config = config
        self.run_id = run_id
        self.session_id = session_id
        self.state = AgentState(run_id=run_id, session_id=session_id)
        self._options = options
        self._channel = channel
        # made on the first decision (most runs wait without one)
        self._decisions: dict[str, tuple[bool, str | None]] | None = None
        # arguments an approval edited, by call id, until the runtime runs the call with them
        # (made on the first edit)
        self._edits: dict[str, dict[str, Any]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._cancel_reason: str | None = None
        # with a checkpoint sink: the open calls' states and the saves (agent_runtime.checkpoints)
        self._checkpoints: Checkpointer | None = None
        # calls of a resumed run that were waiting for an approval (asked again, marked so),
        # with the expiry their request was first made with, when it was saved
        self._resumed_asks: Mapping[str, datetime | None] = _NO_ASKS
        # what this run's tools keep for the rest of it (``tools.run_state()``), made on use
        self._tool_state: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<AgentRunContext run_id={self.run_id} session_id={self.session_id}>"

    @property
    def phase(self) -> AgentPhase:
        """The run's current phase."""
        return self.state.phase

    @property
    def undelivered(self) -> int:
        """Events the run emitted that its consumer has not taken yet. A run that reads
        WAITING with events still undelivered has asked a question its reader has not seen."""
        return len(self._channel)

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
        self._options.add_tool(built.name, built)
        return built

    def tool_policy(self, name: str) -> ToolPolicy:
        """The policy that applies to a tool in this run."""
        found = self._options.tools.get(name)
        return self.agent.policy_for(name, found)

    def set_tool_decision(
        self,
        tool_call_id: str,
        approved: bool,
        reason: str | None = None,
        *,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the approval or denial of an ``ask`` call (used by approval extensions).

        ``arguments``: an approval's edited arguments, which the call then runs with; the
        runtime checks them again (the tool must be editable and take them) and denies the
        call if they do not pass.
        """
        if self._decisions is None:
            self._decisions = {}
        self._decisions[tool_call_id] = (approved, reason)
        if approved and arguments is not None:
            if self._edits is None:
                self._edits = {}
            self._edits[tool_call_id] = dict(arguments)
        elif self._edits is not None:
            self._edits.pop(tool_call_id, None)

    def take_tool_decision(self, tool_call_id: str) -> tuple[bool, str | None] | None:
        """Pop the recorded decision for a call, if any."""
        return self._decisions.pop(tool_call_id, None) if self._decisions else None

    def take_tool_edit(self, tool_call_id: str) -> dict[str, Any] | None:
        """Pop the edited arguments an approval recorded for a call, if any."""
        return self._edits.pop(tool_call_id, None) if self._edits else None

    def has_tool_decision(self, tool_call_id: str) -> bool:
        """Whether a call is already decided (a resumed run's approved or denied call)."""
        return self._decisions is not None and tool_call_id in self._decisions

    def is_resumed_ask(self, tool_call_id: str) -> bool:
        """Whether this call's approval was asked for before the run was resumed: the request
        is made again, for the same call, and says so (``resumed``)."""
        return tool_call_id in self._resumed_asks

    def resumed_ask_expiry(self, tool_call_id: str) -> datetime | None:
        """When the request of a resumed ask expires: the ``expires_at`` it was first made
        with, so a run handed over keeps its confirmation's deadline; None if not known."""
        return self._resumed_asks.get(tool_call_id)

    async def record_ask(self, call: ToolCall, expires_at: datetime) -> None:
        """Note when a call's request for an answer expires, in the run's checkpoint (saved
        now, before the request is made), so a resumed run asks with the same expiry."""
        checkpoints = self._checkpoints
        if checkpoints is None or not checkpoints.holds(call.id):
            return
        checkpoints.mark(call, "awaiting_approval", expires_at)
        state = self.state
        await checkpoints.save(state.added, state.iteration, state.usage)

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """Mark the run as WAITING for an external answer for the duration of the block."""
        return _Waiting(self.state)

    def tool_state(self) -> dict[str, Any]:
        """The run's own dict for its tools (``agent_runtime.tools.run_state()``)."""
        if self._tool_state is None:
            self._tool_state = {}
        return self._tool_state

    def end_unstarted(self) -> bool:
        """End the run with ``run.cancelled`` if its task was cancelled before its first step
        (and so ran none of its handlers); False if it had started."""
        task = self._task
        if task is None or not task.cancelled() or self.state.phase is not AgentPhase.IDLE:
            return False
        self.state.phase = AgentPhase.CANCELLED
        self._channel.put_nowait(
            AgentEvent(
                AgentEventType.RUN_CANCELLED,
                self.run_id,
                self.session_id,
                reason=self._cancel_reason or "cancelled",
            )
        )
        self._channel.close()
        return True

    def cancel(self, reason: str = "cancel_requested") -> bool:
        """Cancel the run; False if it already finished.

        With reason ``HANDOVER`` (the run is to go on elsewhere from its checkpoint), False
        also when the run holds an answer its checkpoint does not record yet (claimed, staged,
        or decided and not yet acted on): cancelled now, the answer would be lost, so the run
        goes on here. Otherwise its waits take no answer from now on (a late one is refused,
        and its sender posts it again where the run is resumed).
        """
        task = self._task
        if task is None or task.done():
            return False
        if reason == HANDOVER and self._cancel_reason is None and not self._suspend_answers():
            return False
        if self._cancel_reason is None:
            self._cancel_reason = reason
        task.cancel()
        return True

    def _suspend_answers(self) -> bool:
        """Stop every extension's waits of this run taking answers; False (nothing changed)
        if an answer was taken already."""
        if self._decisions:
            return False
        suspended: list[AnswerGate] = []
        for extension in self.agent.extensions:
            if not callable(getattr(extension, "suspend_answers", None)):
                continue
            gate = cast(AnswerGate, extension)
            if not gate.suspend_answers(self):
                for done in suspended:
                    done.resume_answers(self)
                return False
            suspended.append(gate)
        return True
