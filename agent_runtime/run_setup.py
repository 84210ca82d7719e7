"""A run's settings, resolved: the agent's defaults with the run's own options
(``agent_runtime.run_options``) over them, checked, into the ``RunOptions`` its context holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .channel import Channel
from .checkpoints import Checkpointer
from .errors import ConfigurationError
from .events import AgentEvent, AgentEventType
from .run_context import UNSET, AgentRunConfig, AgentRunContext, RunHost, RunOptions
from .run_options import OPTION_NAMES
from .skills.activation import SkillState
from .tools.base import Tool, tool

if TYPE_CHECKING:
    from .messages import Message
    from .structured import OutputSpec

__all__ = [
    "OPTION_NAMES",
    "build_run_options",
    "first_event",
    "prompt_cache_key",
    "run_context",
    "system_prompt",
]


def run_context(
    agent: RunHost,
    config: AgentRunConfig,
    run_id: str,
    session_id: str,
    options: RunOptions,
    prompt_text: str,
    skill: str | None,
) -> AgentRunContext:
    """A new run's context, on a channel of its own, with its checkpoints' side when its
    options have a sink (a resumed run's go on from its checkpoint's step)."""
    context = AgentRunContext(agent, config, run_id, session_id, options, Channel())
    sink = options.checkpoint_sink
    if sink is not None:
        resume = options.resume
        context._checkpoints = Checkpointer(
            sink,
            run_id,
            session_id,
            prompt_text,
            step=resume.step if resume is not None else 0,
            structured_answers=resume.structured_answers if resume is not None else 0,
            skill=resume.skill if resume is not None else skill,
        )
    return context


def build_run_options(
    agent: RunHost,
    options: Mapping[str, Any],
    conversation: Sequence[Message] | None,
    output: OutputSpec | None = None,
) -> RunOptions:
    """A run's options: the agent's defaults with the run's own ``options`` over them;
    ``output`` is the run's structured output (``structured.aoutput_spec`` of its options)."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise ConfigurationError(f"unknown run option(s): {', '.join(sorted(unknown))}")
    max_iterations = options.get("max_iterations")
    if max_iterations is None:
        max_iterations = agent.max_iterations
    if max_iterations < 1:
        raise ConfigurationError("max_iterations must be at least 1")
    run_timeout = options.get("run_timeout", UNSET)
    if run_timeout is UNSET:
        run_timeout = agent.run_timeout
    if run_timeout is not None and run_timeout <= 0:
        raise ConfigurationError("run_timeout must be positive or None")
    tools = agent.registry.snapshot()  # shared by the runs until one adds a tool
    extras = options.get("extra_tools") or ()
    if extras:
        tools = dict(tools)
        for extra in extras:
            built = extra if isinstance(extra, Tool) else tool(extra)
            if built.name in tools:
                raise ConfigurationError(
                    f"extra tool {built.name!r} collides with a registered tool"
                )
            tools[built.name] = built
    tool_filter = options.get("tool_filter")
    if tool_filter is not None:
        tools = {name: t for name, t in tools.items() if tool_filter(t)}
    params = dict(agent.model_params)
    params.update(options.get("model_params") or {})
    skill = options.get("skill")
    skill_state: SkillState | None = None
    if agent.skills is not None:
        skill_state = SkillState(
            agent.skills,
            requested=skill,
            dispatch=bool(options.get("skill_dispatch", True)),
            system_one=agent.bindings.system_one,
        )
    elif skill is not None:
        raise ConfigurationError(f"skill {skill!r} was asked for, but this agent has no skills")
    return RunOptions(
        run_timeout=run_timeout,
        max_iterations=max_iterations,
        tool_timeout=options.get("tool_timeout", agent.tool_timeout),
        parallel_tool_calls=options.get("parallel_tool_calls", agent.parallel_tool_calls),
        system_prompt=options.get("system_prompt", agent.system_prompt),
        permission_callback=options.get("permission_callback", agent.permission_callback),
        conversation=list(conversation) if conversation is not None else None,
        tools=tools,
        params=params,
        agent_name=options.get("agent_name") or agent.name,
        context_compactor=options.get("context_compactor", agent.context_compactor),
        tool_gate=options.get("tool_gate"),
        model_gate=options.get("model_gate"),
        skill_state=skill_state,
        output=output,
        tool_filter=tool_filter,
        checkpoint_sink=options.get("checkpoint_sink", agent.checkpoint_sink),
    )


def system_prompt(options: RunOptions) -> str | None:
    """The run's system prompt, with its skills' part and its output instructions."""
    system = options.system_prompt
    if options.skill_state is not None:
        system = options.skill_state.system_prompt(system)
    output = options.output
    if output is not None:
        system = f"{system}\n\n{output.instructions()}" if system else output.instructions()
    return system


def prompt_cache_key(options: RunOptions, session_id: str) -> str:
    """The run's ``ModelRequest.cache_key``: a hash of the agent's name and the session id.

    The same for every run of one agent in one session, on any worker, so a provider routes
    the session's calls to the same prompt cache; the session id itself never leaves. Runs
    without a session have an anonymous one of their own, hence a key of their own.
    """
    agent = options.agent_name or ""
    digest = hashlib.sha256(f"agent_runtime prompt cache\0{agent}\0{session_id}".encode())
    return digest.hexdigest()[:32]


def first_event(context: AgentRunContext, model: str) -> AgentEvent:
    """A run's first event: ``run.started``, or ``run.resumed`` with its checkpoint's step."""
    options = context._options
    resume = options.resume
    if resume is None:
        return AgentEvent(
            AgentEventType.RUN_STARTED,
            context.run_id,
            context.session_id,
            agent=options.agent_name,
            model=model,
        )
    return AgentEvent(
        AgentEventType.RUN_RESUMED,
        context.run_id,
        context.session_id,
        agent=options.agent_name,
        model=model,
        payload={"from_step": resume.step},
    )
