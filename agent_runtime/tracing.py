"""Tracing hooks: where a run tells a tracer about itself.

The runtime calls a ``RunTracer`` around each run, each model call (one per attempt: a retry or
a failover is a call of its own) and each tool execution, and hands it the ``custom`` events
extensions emit (a confirmation request, its resolution). The default tracer does nothing and
costs a method call per step. ``agent_runtime.integrations.otel.OTelTracer`` turns the hooks
into OpenTelemetry spans; it needs only ``opentelemetry-api``, and exports nothing until the
host application installs an SDK tracer provider.

Each hook is a context manager entered in the task that does the work, so an implementation may
make its span the current one for the duration (nested spans, and instrumented HTTP clients,
then find their parent on their own).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bindings import ModelBinding
    from .events import AgentEvent
    from .extensions.base import ToolOutcome
    from .messages import ToolCall
    from .model import ModelRequest, ModelResponse
    from .run_context import AgentRunContext

__all__ = ["ModelCallTrace", "RunTracer", "ToolCallTrace"]


class ModelCallTrace:
    """What a model call's hook learns once the answer is whole. The base ignores it."""

    __slots__ = ()

    def response(self, response: ModelResponse) -> None:
        """The call's complete answer (usage, stop reason, message)."""


class ToolCallTrace:
    """What a tool call's hook learns once the call is over. The base ignores it."""

    __slots__ = ()

    def outcome(self, outcome: ToolOutcome, *, refused: bool) -> None:
        """The call's result or error; ``refused`` when it never ran (denied, unknown, gated)."""


class _Quiet(AbstractContextManager[Any]):
    """A reusable context manager that yields one shared value and does nothing else."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def __enter__(self) -> Any:
        return self._value

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_RUN: AbstractContextManager[None] = _Quiet(None)
_NO_MODEL_CALL: AbstractContextManager[ModelCallTrace] = _Quiet(ModelCallTrace())
_NO_TOOL_CALL: AbstractContextManager[ToolCallTrace] = _Quiet(ToolCallTrace())


class RunTracer:
    """Subclass and override the hooks you need; each is entered around the step it names.

    An exception leaving a hook's block is the step's failure (``asyncio.CancelledError`` a
    cancellation); the hook must let it propagate. A hook must not raise on its own: a tracer
    never fails a run.
    """

    def run(self, context: AgentRunContext, prompt: str) -> AbstractContextManager[None]:
        """Around the whole run, in the run's task; ``context.state`` holds its totals at exit."""
        return _NO_RUN

    def model_call(
        self, context: AgentRunContext, binding: ModelBinding, request: ModelRequest
    ) -> AbstractContextManager[ModelCallTrace]:
        """Around one attempt of a model call on ``binding``."""
        return _NO_MODEL_CALL

    def tool_call(
        self, context: AgentRunContext, call: ToolCall
    ) -> AbstractContextManager[ToolCallTrace]:
        """Around one tool call's execution (after its checks and approval)."""
        return _NO_TOOL_CALL

    def event(self, context: AgentRunContext, event: AgentEvent) -> None:
        """A ``custom`` event an extension emitted (``confirmation_requested``...)."""


NO_TRACER = RunTracer()
"""The tracer of an agent given none: every hook does nothing."""
