"""agent_runtime: an async agent core that serves many concurrent conversations per event loop."""

from __future__ import annotations

from . import presets
from .agent import (
    AgentCore,
    AgentResponse,
    AgentRunConfig,
    AgentRunContext,
    AgentState,
    ConversationStore,
    InMemoryConversationStore,
)
from .bindings import (
    ModelBinding,
    ModelBindings,
    PreflightError,
    binding_from_spec,
    bindings_from_spec,
)
from .checkpoints import CheckpointedCall, CheckpointSink, RunCheckpoint
from .client import AgentClient, create_agent
from .errors import (
    AgentClosedError,
    AgentRuntimeError,
    CheckpointError,
    ConfigurationError,
    LoopAffinityError,
    MaxIterationsError,
    ProviderError,
    RunCancelledError,
    RunError,
    RunTimeoutError,
    SessionBusyError,
    SkillNotFoundError,
    StructuredOutputError,
    ToolErrorLimitError,
)
from .events import AgentEvent, AgentEventType, AgentPhase
from .extensions.base import AgentExtension
from .messages import AssistantMessage, ToolCall
from .model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from .run_calls import StructuredResponse
from .tools.base import Tool, ToolPolicy, current_tool_call_id, tool

__all__ = [
    "AgentClient",
    "AgentClosedError",
    "AgentCore",
    "AgentEvent",
    "AgentEventType",
    "AgentExtension",
    "AgentPhase",
    "AgentResponse",
    "AgentRunConfig",
    "AgentRunContext",
    "AgentRuntimeError",
    "AgentState",
    "AssistantMessage",
    "CheckpointError",
    "CheckpointSink",
    "CheckpointedCall",
    "ConfigurationError",
    "ConversationStore",
    "InMemoryConversationStore",
    "LoopAffinityError",
    "MaxIterationsError",
    "ModelBinding",
    "ModelBindings",
    "ModelEvent",
    "ModelRequest",
    "ModelResponse",
    "PreflightError",
    "ProviderError",
    "RetryOptions",
    "RunCancelledError",
    "RunCheckpoint",
    "RunError",
    "RunTimeoutError",
    "SessionBusyError",
    "SkillNotFoundError",
    "StructuredOutputError",
    "StructuredResponse",
    "Tool",
    "ToolCall",
    "ToolErrorLimitError",
    "ToolPolicy",
    "Usage",
    "binding_from_spec",
    "bindings_from_spec",
    "create_agent",
    "current_tool_call_id",
    "presets",
    "tool",
]
