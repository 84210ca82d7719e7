"""The public surface: module paths and names users import. Changing it breaks their code."""

from __future__ import annotations

import importlib

import pytest

import agent_runtime

PUBLIC = {
    "agent_runtime": [
        "AgentCore",
        "ModelBinding",
        "ModelBindings",
        "presets",
        "RunTimeoutError",
        "LoopAffinityError",
        "create_agent",
    ],
    "agent_runtime.agent": ["AgentCore", "AgentRunConfig", "AgentRunContext"],
    "agent_runtime.client": ["create_agent"],
    "agent_runtime.events": ["AgentEvent", "AgentEventType", "AgentPhase"],
    "agent_runtime.extensions.base": ["AgentExtension"],
    "agent_runtime.extensions.events": ["ExtensionEvent", "RunCancelledEvent"],
    "agent_runtime.extensions.external": ["ExternalEvent", "ExternalEventExtension"],
    "agent_runtime.extensions.confirmation": ["ConfirmationExtension"],
    "agent_runtime.messages": ["AssistantMessage", "ToolCall"],
    "agent_runtime.model": ["ModelEvent", "ModelRequest", "ModelResponse", "RetryOptions"],
    "agent_runtime.tools.base": ["tool", "current_tool_call_id"],
    "agent_runtime.testing": ["ScriptedModel", "FunctionModel"],
    "agent_runtime.tools": ["discover_builtin_tools", "run_state"],
    "agent_runtime.integrations.lifespan": ["agent_lifespan", "warm_up"],
    "agent_runtime.tools.builtin": ["discover_builtin_tools", "TodoItem"],
    "agent_runtime.skills": [
        "SkillManager",
        "Skill",
        "SkillPipeline",
        "PipelineContext",
        "PipelineResult",
    ],
}

EXPECTED_ALL = {
    "CheckpointError",
    "CheckpointSink",
    "CheckpointedCall",
    "RunCheckpoint",
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
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_module_exposes_its_names(module: str) -> None:
    loaded = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(loaded, name)]
    assert not missing


def test_package_all_is_pinned() -> None:
    assert set(agent_runtime.__all__) == EXPECTED_ALL
    for name in agent_runtime.__all__:
        assert hasattr(agent_runtime, name)


def test_event_type_names_are_the_wire_names() -> None:
    from agent_runtime.events import AgentEventType

    assert {t.value for t in AgentEventType} == {
        "run.started",
        "run.resumed",
        "text.delta",
        "reasoning.delta",
        "tool.call.started",
        "tool.call.completed",
        "custom",
        "usage",
        "run.completed",
        "run.failed",
        "run.cancelled",
    }


def test_run_timeout_error_is_a_timeout_error() -> None:
    error = agent_runtime.RunTimeoutError(1.5, run_id="r")
    assert isinstance(error, TimeoutError)
    assert (error.timeout, error.run_id, error.code) == (1.5, "r", "run_timeout")
