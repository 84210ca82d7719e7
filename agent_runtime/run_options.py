"""``RunOptions``: the keyword options of one run (``AgentCore.stream``, ``chat``, ``resume``).

Each key overrides the agent's default for that run only; a key left out keeps the default.
Written once here: ``OPTION_NAMES`` and the service's per-run options derive from it, and
``**options: Unpack[RunOptions]`` lets a type checker refuse a misspelt option.

A leaf module: the types it names are imported for type checking only, so every module of the
runtime (``run_context`` first) can import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from .checkpoints import CheckpointSink
    from .compaction import ContextCompactor
    from .run_context import ModelGate, PermissionCallback, ToolGate
    from .tools.base import Tool

__all__ = ["OPTION_NAMES", "RunOptions", "SkillRunOptions", "StructuredRunOptions"]


class _SharedRunOptions(TypedDict, total=False):
    """The options every entry point takes."""

    run_timeout: float | None
    """Seconds for the whole run; None: no limit."""
    max_iterations: int | None
    """Model calls at most (at least 1); None: the agent's."""
    tool_timeout: float | None
    """Seconds for one tool call; None: no limit."""
    parallel_tool_calls: bool
    """Run the tool calls of one model response concurrently."""
    system_prompt: str | None
    """Replaces the agent's system prompt."""
    permission_callback: PermissionCallback | None
    """Asked before a tool call its policy says to ask about."""
    extra_tools: Sequence[Tool | Callable[..., Any]] | None
    """Tools for this run only, beside the registered ones (a function becomes a ``tool``)."""
    tool_filter: Callable[[Tool], bool] | None
    """Offers only the tools it returns True for."""
    model_params: Mapping[str, Any] | None
    """Provider parameters over the agent's ``model_params``."""
    agent_name: str | None
    """The name the run's events and traces carry; None: the agent's."""
    context_compactor: ContextCompactor | None
    """Shortens the history before a model call."""
    tool_gate: ToolGate | None
    """The run's last word on each tool call, right before it executes."""
    model_gate: ModelGate | None
    """Awaited right before each model call."""
    response_format: Mapping[str, Any] | None
    """Structured output: an OpenAI-style ``response_format`` (a JSON schema)."""
    checkpoint_sink: CheckpointSink | None
    """Where the run's checkpoints go; None: the agent's."""


class StructuredRunOptions(_SharedRunOptions, total=False):
    """The options ``chat_structured`` takes beside its own ``output_type`` and
    ``output_retries``."""

    skill: str | None
    """A skill of the catalogue, active from the start."""
    skill_dispatch: bool
    """False: no ``system_one`` routing to a skill."""


class SkillRunOptions(_SharedRunOptions, total=False):
    """The options ``run_skill`` takes beside the skill it names."""

    output_type: Any
    """Structured output: a pydantic model or any type a ``TypeAdapter`` accepts."""
    output_retries: int | None
    """How often an answer that does not validate is given back (default 2)."""


class RunOptions(StructuredRunOptions, SkillRunOptions, total=False):
    """A run's own settings over the agent's defaults: every option."""


OPTION_NAMES: frozenset[str] = RunOptions.__optional_keys__
"""Every option a run takes."""
