"""The extension base class: hooks around every step of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..messages import AssistantMessage, ToolCall
from .events import ExtensionEvent, ExternalEvent

if TYPE_CHECKING:
    from ..run_context import AgentRunConfig, AgentRunContext

__all__ = ["AgentExtension", "ToolOutcome"]


class ToolOutcome:
    """What ``after_tool`` learns of a finished call: its result or its error."""

    __slots__ = ("error", "is_error", "result")

    def __init__(self, result: Any = None, error: str | None = None) -> None:
        self.result = result
        self.error = error
        self.is_error = error is not None

    def __repr__(self) -> str:
        if self.is_error:
            return f"ToolOutcome(error={self.error!r})"
        return f"ToolOutcome(result={self.result!r})"


class AgentExtension:
    """Subclass and override the hooks you need; every hook is optional.

    One extension instance serves every run of its agent, concurrently. Keep request-local state
    in maps keyed by the ``AgentRunContext`` passed to each hook and remove it on every terminal
    path: ``on_success``, ``on_error`` and ``on_event`` with ``RunCancelledEvent``.

    Hooks run in order of ``priority`` (higher first), then registration order. ``name``
    (default: the class name) must be unique among an agent's extensions.
    """

    priority: int = 0

    @property
    def name(self) -> str:
        """The extension's unique name; reported by ``emit_external_event``."""
        return type(self).__name__

    async def before_run(self, context: AgentRunContext) -> None:
        """The run starts; nothing has been sent to the model yet."""

    async def on_tool(self, context: AgentRunContext) -> None:
        """Register run-scoped tools with ``context.register_tool``."""

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        """A tool call is about to be checked and executed."""

    async def after_tool(
        self, context: AgentRunContext, call: ToolCall, outcome: ToolOutcome
    ) -> None:
        """A tool call finished (successfully or not)."""

    async def on_event(self, context: AgentRunContext, event: ExtensionEvent) -> None:
        """A lifecycle notice, such as ``RunCancelledEvent``."""

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        """The run completed with ``result``."""

    async def on_error(self, context: AgentRunContext, error: Exception) -> None:
        """The run failed with ``error`` (never called for cancellation)."""

    def accept(self, config: AgentRunConfig | None, event: ExternalEvent) -> bool:
        """Claim an external event; return True if this extension took delivery of it."""
        return False
