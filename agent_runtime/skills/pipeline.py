"""``SkillPipeline``: skills run one after another, as one run.

Each step is a run of the agent with one skill active (``run_skill``); a step's prompt is built
from the ``PipelineContext``: the pipeline's prompt and the results so far. The whole pipeline
is one run: one ``run_id`` on every step's events and on the context and result, and one
``run_timeout`` clock for all steps. ``on_event`` sees every step's events, and the pipeline's
own ``custom`` events ``pipeline_step_started`` / ``pipeline_step_completed`` (payload ``step``,
``skill``).
"""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from ..errors import ConfigurationError, RunTimeoutError
from ..events import AgentEvent, AgentEventType
from ..model import Usage

if TYPE_CHECKING:
    from ..agent import AgentCore, AgentResponse

__all__ = [
    "PIPELINE_STEP_COMPLETED",
    "PIPELINE_STEP_STARTED",
    "PipelineContext",
    "PipelineResult",
    "PipelineStep",
    "SkillPipeline",
    "StepResult",
]

PIPELINE_STEP_STARTED = "pipeline_step_started"
PIPELINE_STEP_COMPLETED = "pipeline_step_completed"

EventHandler: TypeAlias = Callable[[AgentEvent], "Awaitable[None] | None"]


@dataclass(slots=True)
class StepResult:
    """One finished step: its skill and the run's response."""

    skill: str
    response: AgentResponse

    @property
    def content(self) -> str:
        """The step's answer text."""
        return self.response.content


@dataclass(slots=True)
class PipelineContext:
    """What a step's prompt is built from: the run's id, its prompt and the results so far."""

    run_id: str
    prompt: str
    results: list[StepResult] = field(default_factory=list)

    @property
    def last(self) -> StepResult | None:
        """The latest finished step, if any."""
        return self.results[-1] if self.results else None


PromptBuilder: TypeAlias = Callable[[PipelineContext], str]


def default_prompt(context: PipelineContext) -> str:
    """The pipeline's prompt, then the previous step's answer (from the second step on)."""
    last = context.last
    if last is None:
        return context.prompt
    return f"{context.prompt}\n\nThe previous step ({last.skill}) produced:\n{last.content}"


@dataclass(frozen=True, slots=True)
class PipelineStep:
    """A step: the skill to run, and how its prompt is built (``default_prompt`` if None)."""

    skill: str
    prompt: PromptBuilder | None = None


@dataclass(slots=True)
class PipelineResult:
    """The pipeline's outcome: its run id, every step's result, the summed usage."""

    run_id: str
    steps: list[StepResult]
    usage: Usage

    @property
    def output(self) -> str:
        """The last step's answer text."""
        return self.steps[-1].content if self.steps else ""


class SkillPipeline:
    """Runs ``steps`` (skill names or ``PipelineStep``) in order on ``agent``."""

    def __init__(self, agent: AgentCore, steps: Sequence[str | PipelineStep]) -> None:
        if not steps:
            raise ConfigurationError("a SkillPipeline needs at least one step")
        self.agent = agent
        self.steps = tuple(s if isinstance(s, PipelineStep) else PipelineStep(s) for s in steps)

    async def run(
        self,
        prompt: str,
        *,
        run_id: str | None = None,
        run_timeout: float | None = None,
        on_event: EventHandler | None = None,
        **options: Any,
    ) -> PipelineResult:
        """Run every step; the first failure (a ``RunError``) ends the pipeline.

        ``run_timeout`` (default: the agent's) bounds the whole pipeline. Other options go to
        every step's run.
        """
        from ..agent import AgentRunConfig

        run_id = run_id or f"run_{secrets.token_hex(16)}"
        budget = self.agent.run_timeout if run_timeout is None else run_timeout
        started = time.monotonic()
        context = PipelineContext(run_id, prompt)
        usage = Usage()
        for index, step in enumerate(self.steps):
            step_prompt = (step.prompt or default_prompt)(context)
            await _notify(on_event, _step_event(PIPELINE_STEP_STARTED, run_id, index, step.skill))
            remaining: float | None = None
            if budget is not None:
                remaining = budget - (time.monotonic() - started)
                if remaining <= 0:
                    raise RunTimeoutError(budget, run_id=run_id)
            try:
                response = await self._step(
                    step, step_prompt, AgentRunConfig(run_id=run_id), remaining, on_event, options
                )
            except RunTimeoutError as exc:
                # the step's clock was what was left of the pipeline's: report the pipeline's
                raise RunTimeoutError(budget or exc.timeout, run_id=run_id) from exc
            usage.add(response.usage)
            context.results.append(StepResult(step.skill, response))
            await _notify(on_event, _step_event(PIPELINE_STEP_COMPLETED, run_id, index, step.skill))
        return PipelineResult(run_id, list(context.results), usage)

    async def _step(
        self,
        step: PipelineStep,
        prompt: str,
        config: Any,
        remaining: float | None,
        on_event: EventHandler | None,
        options: dict[str, Any],
    ) -> AgentResponse:
        if on_event is None:
            return await self.agent.run_skill(
                step.skill, prompt, config=config, run_timeout=remaining, **options
            )
        from ..agent import AgentResponse

        completed: AgentEvent | None = None
        stream = self.agent.stream(
            prompt,
            config=config,
            skill=step.skill,
            skill_dispatch=False,
            run_timeout=remaining,
            **options,
        )
        try:
            async for event in stream:
                await _notify(on_event, event)
                if event.type is AgentEventType.RUN_COMPLETED:
                    completed = event
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        assert completed is not None and completed.message is not None
        return AgentResponse(
            completed.message,
            completed.run_id,
            completed.session_id or "",
            completed.usage or Usage(),
            list(completed.messages or ()),
            completed.structured,
        )


def _step_event(name: str, run_id: str, index: int, skill: str) -> AgentEvent:
    return AgentEvent(
        AgentEventType.CUSTOM, run_id, name=name, payload={"step": index, "skill": skill}
    )


async def _notify(handler: EventHandler | None, event: AgentEvent) -> None:
    if handler is None:
        return
    outcome = handler(event)
    if inspect.isawaitable(outcome):
        await outcome
