"""Exceptions raised by the agent runtime.

Every exception the runtime raises on purpose derives from ``AgentRuntimeError``. A user's
misuse of the API is kept apart from a run that failed::

    AgentRuntimeError
    ├── ConfigurationError (also ValueError)    bad setup: duplicate names, collisions, bad options
    │   ├── OutputSchemaError                   a response_format schema refused: .kind, .path
    │   └── PreflightError                      preflight() found a binding that cannot be built
    │                                           (bindings.binding): .index, .model, .purpose
    ├── InvalidInputError (also ValueError)     a capability call's input it cannot take
    ├── CheckpointError (also ValueError)       a run checkpoint with a bad shape or version
    ├── ContentError (also ValueError)          a content part that cannot be used (content)
    ├── AgentClosedError (also RuntimeError)    an entry point called after aclose()
    ├── LoopAffinityError (also RuntimeError)   an agent or binding used from a second event loop
    ├── SessionBusyError                        a second run on a session that has one active
    ├── SkillResourceError (also ValueError)    a skill resource path that is refused or unreadable
    ├── ExternalEventExpiredError (also TimeoutError)  nobody answered a wait for an external
    │                                           event in time (extensions.external)
    ├── AnswerRefusedError (also ValueError)    an answer a waiting run refuses, saying why; the
    │   │                                       wait stays open for another (.code)
    │   ├── EditNotAllowedError                 edited arguments for a tool that takes none
    │   ├── InvalidEditError                    edited arguments the tool's schema refuses
    │   └── InvalidReplyError                   a reply in the call's place that is not text
    ├── MCPClientError                          an MCP server or its client failed (mcp.errors)
    │   ├── MCPClientStateError (also RuntimeError)  used before start() or after close()
    │   ├── MCPServerError                      unreachable, died, timed out, refused
    │   └── MCPToolError                        the tool answered with isError
    └── RunError                                a run ended in failure; carries .code and .run_id
        ├── RunTimeoutError (also TimeoutError) the run's deadline expired
        ├── MaxIterationsError                  the model kept calling tools past max_iterations
        ├── ToolErrorLimitError                 too many consecutive tool errors or denials
        ├── RunCancelledError                   the run was cancelled by cancel_run or aclose
        ├── SkillNotFoundError (also LookupError) the run named a skill its catalogue lacks
        ├── StructuredOutputError               the answer did not validate against the output
        │                                       type, after the allowed retries
        └── ProviderError                       the model provider failed; .retryable says if
            │                                   another attempt or binding may succeed
            ├── UnsupportedContentError         the model cannot take a kind of part (content)
            ├── ProviderStatusError             the upstream answered with an error status
            ├── ProviderTimeoutError            the upstream did not answer in time
            └── ProviderConnectionError         the connection failed or dropped

A caller's own cancellation is never converted: it stays ``asyncio.CancelledError``.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = [
    "AgentClosedError",
    "AgentRuntimeError",
    "AnswerRefusedError",
    "CheckpointError",
    "ConfigurationError",
    "ContentError",
    "EditNotAllowedError",
    "InvalidEditError",
    "InvalidInputError",
    "InvalidReplyError",
    "LoopAffinityError",
    "MaxIterationsError",
    "OutputSchemaError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderStatusError",
    "ProviderTimeoutError",
    "RunCancelledError",
    "RunError",
    "RunTimeoutError",
    "SessionBusyError",
    "SkillNotFoundError",
    "SkillResourceError",
    "StructuredOutputError",
    "ToolErrorLimitError",
    "UnsupportedContentError",
]


class AgentRuntimeError(Exception):
    """Base class of every exception the runtime raises on purpose."""


class ConfigurationError(AgentRuntimeError, ValueError):
    """The agent, a tool, an extension or a binding was set up wrongly."""


class OutputSchemaError(ConfigurationError):
    """A ``response_format`` schema that cannot be validated safely or at all.

    ``kind`` is a stable literal: ``invalid`` (not a JSON schema), ``too_deep``, ``too_large``,
    ``ref`` (a remote or dangling ``$ref``), ``ref_cycle`` (a reference cycle that never goes
    down into the answer), ``pattern`` (a pattern RE2 refuses or too complex), ``unsupported``
    (a keyword this runtime does not take). ``path`` is where in the schema, as JSON keys and
    indexes (empty: the schema as a whole).
    """

    def __init__(self, message: str, *, kind: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.path = path


class InvalidInputError(AgentRuntimeError, ValueError):
    """A capability call (``embed``, ``rerank``, ``generate_image``...) was given input it
    cannot take: no texts, an empty prompt, unreadable audio."""


class CheckpointError(AgentRuntimeError, ValueError):
    """A run checkpoint cannot be read: a bad shape, or a version this runtime does not know."""


class AgentClosedError(AgentRuntimeError, RuntimeError):
    """The agent was closed; build a new one."""


class LoopAffinityError(AgentRuntimeError, RuntimeError):
    """An object bound to one event loop was used from another.

    ``owner_loop`` is the loop that claimed the object, ``current_loop`` the loop that tried to
    use it, ``model`` the model name when a binding raised it.
    """

    def __init__(
        self,
        message: str,
        *,
        owner_loop: asyncio.AbstractEventLoop | None,
        current_loop: asyncio.AbstractEventLoop | None,
        model: str | None = None,
    ) -> None:
        super().__init__(message)
        self.owner_loop = owner_loop
        self.current_loop = current_loop
        self.model = model


class SessionBusyError(AgentRuntimeError):
    """A run is already active on this session; wait for it or cancel it."""

    def __init__(self, session_id: str, active_run_id: str) -> None:
        super().__init__(
            f"session {session_id!r} already has an active run ({active_run_id}); "
            "wait for it to finish or cancel it"
        )
        self.session_id = session_id
        self.active_run_id = active_run_id


class SkillResourceError(AgentRuntimeError, ValueError):
    """A skill's resource was refused (absolute, ``..``, a symlink out of the skill's folder)
    or could not be read. Raised inside the ``read_skill_resource`` tool, whose call then
    returns this message as its error."""


class AnswerRefusedError(AgentRuntimeError, ValueError):
    """An answer to a waiting run (``AgentCore.emit_external_event``) was refused for a reason
    its sender can fix. Nothing was used up: the wait stays open for a correct answer.
    ``code`` is a stable literal a service may pass on to its clients."""

    code: str = "answer_refused"


class EditNotAllowedError(AnswerRefusedError):
    """An approval carried edited arguments for a tool that does not take them: only a tool
    declared editable (``@tool(editable=True)``) runs with arguments a person changed."""

    code = "edit_not_allowed"

    def __init__(self, tool: str) -> None:
        super().__init__(
            f"the tool {tool!r} does not allow its arguments to be edited: approve or deny the "
            "call as it is (declare the tool editable to allow edits)"
        )
        self.tool = tool


class InvalidEditError(AnswerRefusedError):
    """An approval carried edited arguments its tool cannot run with: not a JSON object, not
    matching the tool's parameters, or sent with a denial. ``problems`` says what is wrong."""

    code = "invalid_arguments"

    def __init__(self, tool: str, problems: str) -> None:
        super().__init__(f"the edited arguments for {tool!r} were refused: {problems}")
        self.tool = tool
        self.problems = problems


class InvalidReplyError(AnswerRefusedError):
    """A denial carried a reply (``response``) the run cannot pass on: not text, empty, too
    long, or sent with an approval. ``problems`` says what is wrong."""

    code = "invalid_response"

    def __init__(self, tool: str, problems: str) -> None:
        super().__init__(f"the reply to the call to {tool!r} was refused: {problems}")
        self.tool = tool
        self.problems = problems


class RunError(AgentRuntimeError):
    """A run ended in failure. ``code`` is the stable failure code of the SSE contract."""

    code: str = "internal"

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunTimeoutError(RunError, TimeoutError):
    """The run's whole-run deadline (``run_timeout``) expired."""

    code = "run_timeout"

    def __init__(self, timeout: float, *, run_id: str | None = None) -> None:
        super().__init__(f"run exceeded its run_timeout of {timeout:g} s", run_id=run_id)
        self.timeout = timeout


class MaxIterationsError(RunError):
    """The model was still calling tools after ``max_iterations`` model calls."""

    code = "max_iterations"


class ToolErrorLimitError(RunError):
    """Too many consecutive tool calls failed or were denied."""

    code = "tool_error_limit"


class RunCancelledError(RunError):
    """The run was cancelled from outside its consumer (``cancel_run``, ``aclose``).

    ``reason`` is the reason given to the cancellation. Not a CancelledError: the consumer's
    own task was not cancelled.
    """

    code = "cancelled"

    def __init__(self, reason: str, *, run_id: str | None = None) -> None:
        super().__init__(f"the run was cancelled ({reason})", run_id=run_id)
        self.reason = reason


class SkillNotFoundError(RunError, LookupError):
    """The run named a skill (``skill=``, ``run_skill``, a pipeline step) that the agent's
    catalogue does not have. ``available`` lists the names it has."""

    code = "skill_not_found"

    def __init__(
        self, name: str, available: tuple[str, ...] = (), *, run_id: str | None = None
    ) -> None:
        known = ", ".join(available) or "none"
        super().__init__(
            f"no skill named {name!r} in the agent's catalogue (skills: {known})", run_id=run_id
        )
        self.name = name
        self.available = available


class StructuredOutputError(RunError):
    """The model's answer did not validate against the requested output type, on every
    attempt. ``problems`` is the last validation error as text, ``attempts`` how many answers
    were checked, ``output`` the last answer's text (the model's: for the developer, never
    part of the message)."""

    code = "invalid_output"

    def __init__(
        self, problems: str, *, attempts: int, output: str, run_id: str | None = None
    ) -> None:
        super().__init__(
            f"the model's answer did not match the output schema after {attempts} "
            f"attempt(s): {problems}",
            run_id=run_id,
        )
        self.problems = problems
        self.attempts = attempts
        self.output = output


class ProviderError(RunError):
    """A model provider failed.

    ``retryable`` is true for failures another attempt may not repeat (429, 5xx, 529, timeouts,
    connection errors). ``retry_after`` is the upstream's Retry-After in seconds, when it sent one.
    ``upstream_detail`` is the upstream's own error text, redacted: for the developer, never part
    of the message (which a service shows its clients), since upstreams quote keys and requests.
    ``reason`` classifies some failures further: ``"malformed_response"`` for a successful
    (200) answer whose body is not the protocol's JSON or SSE (not retryable, no failover).
    """

    code = "provider_error"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        status_code: int | None = None,
        retry_after: float | None = None,
        provider: str | None = None,
        run_id: str | None = None,
        upstream_detail: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.upstream_detail = upstream_detail
        self.reason = reason
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after = retry_after
        self.provider = provider

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_provider_error, (type(self), str(self), self.__dict__))


def _rebuild_provider_error(cls: type[ProviderError], message: str, state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class ProviderStatusError(ProviderError):
    """The upstream answered with an error status."""


class ProviderTimeoutError(ProviderError):
    """The upstream did not answer within the client timeout."""


class ProviderConnectionError(ProviderError):
    """The connection to the upstream failed or dropped."""


class ContentError(AgentRuntimeError, ValueError):
    """A content part that cannot be used: no source or two, a media type of the wrong kind,
    bytes that are not what their media type says, inline bytes where a reference must be."""


class UnsupportedContentError(ProviderError):
    """The model (or its binding) cannot take a kind of part the conversation holds.

    Raised before any request is sent; not retryable. ``kind`` is the part's kind
    (``"image"``, ``"document"``), ``media_type`` its media type.
    """

    code = "unsupported_content"

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        media_type: str | None = None,
        provider: str | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(message, retryable=False, provider=provider, run_id=run_id)
        self.kind = kind
        self.media_type = media_type
