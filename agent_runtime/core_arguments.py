"""``AgentCore``'s constructor arguments, checked and put in the form the core keeps."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from .bindings import ModelBinding, ModelBindings
from .errors import ConfigurationError
from .model import Model
from .skills.catalogue import SkillManager
from .tools.base import ToolPolicy

__all__ = ["ModelLike", "as_bindings", "as_skills", "check_limits", "policy_table"]

ModelLike: TypeAlias = "Model | ModelBinding | ModelBindings"


def as_bindings(model: ModelLike) -> ModelBindings:
    """The model argument as the bindings the core calls."""
    if isinstance(model, ModelBindings):
        return model
    if isinstance(model, ModelBinding):
        return ModelBindings(llm=[model])
    if callable(getattr(model, "stream", None)):
        return ModelBindings(llm=[ModelBinding(provider=model)])
    raise ConfigurationError(
        f"{model!r} is not a model: pass an object with stream(request), a ModelBinding or "
        "ModelBindings"
    )


def as_skills(
    skills: SkillManager | Iterable[str | os.PathLike[str]] | None,
) -> SkillManager | None:
    """The skills argument as a manager (or None)."""
    if skills is None or isinstance(skills, SkillManager):
        return skills
    if isinstance(skills, str | os.PathLike):
        raise ConfigurationError("skills= takes a SkillManager or a list of paths")
    return SkillManager(skills)


def check_limits(
    max_iterations: int, run_timeout: float | None, max_history_messages: int | None
) -> None:
    """Refuse limits no run could keep."""
    if max_iterations < 1:
        raise ConfigurationError("max_iterations must be at least 1")
    if run_timeout is not None and run_timeout <= 0:
        raise ConfigurationError("run_timeout must be positive or None")
    if max_history_messages is not None and max_history_messages < 1:
        raise ConfigurationError("max_history_messages must be at least 1 or None")


def policy_table(
    tool_policies: Mapping[str, ToolPolicy | str],
) -> tuple[dict[str, ToolPolicy], list[tuple[str, ToolPolicy]]]:
    """Tool policies split into exact names and glob patterns (matched in their order)."""
    exact: dict[str, ToolPolicy] = {}
    patterns: list[tuple[str, ToolPolicy]] = []
    for pattern, policy in tool_policies.items():
        if any(ch in pattern for ch in "*?["):
            patterns.append((pattern, ToolPolicy(policy)))
        else:
            exact[pattern] = ToolPolicy(policy)
    return exact, patterns
