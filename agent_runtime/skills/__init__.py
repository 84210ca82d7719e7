"""Skills: a catalogue read from disk (``SKILL.md`` folders), activated per run.

``SkillManager`` is the shared catalogue (``catalogue.py``); ``SkillState`` one run's
activation, skill tools and allowed-tools (``activation.py``); ``SkillPipeline`` skills run in
sequence as one run (``pipeline.py``). ``AgentCore(..., skills=[paths] or a SkillManager)``
gives its runs the catalogue; ``AgentCore.run_skill`` runs one skill directly.
"""

from __future__ import annotations

from .activation import LOAD_SKILL, READ_SKILL_RESOURCE, SKILL_ACTIVATED, SkillState, choose_skill
from .catalogue import (
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    MAX_RESOURCE_BYTES,
    Skill,
    SkillManager,
    SkillProblem,
    parse_skill,
)
from .pipeline import (
    PIPELINE_STEP_COMPLETED,
    PIPELINE_STEP_STARTED,
    PipelineContext,
    PipelineResult,
    PipelineStep,
    SkillPipeline,
    StepResult,
    default_prompt,
)

__all__ = [
    "LOAD_SKILL",
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "MAX_RESOURCE_BYTES",
    "PIPELINE_STEP_COMPLETED",
    "PIPELINE_STEP_STARTED",
    "READ_SKILL_RESOURCE",
    "SKILL_ACTIVATED",
    "PipelineContext",
    "PipelineResult",
    "PipelineStep",
    "Skill",
    "SkillManager",
    "SkillPipeline",
    "SkillProblem",
    "SkillState",
    "StepResult",
    "choose_skill",
    "default_prompt",
    "parse_skill",
]
