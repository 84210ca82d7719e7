"""``RunOptions``: the one list of a run's options, which a type checker holds callers to."""

from __future__ import annotations

import pytest

from agent_runtime import AgentCore
from agent_runtime.errors import ConfigurationError
from agent_runtime.run_options import (
    OPTION_NAMES,
    RunOptions,
    SkillRunOptions,
    StructuredRunOptions,
)
from agent_runtime.run_setup import OPTION_NAMES as CONTEXT_OPTION_NAMES
from agent_runtime.testing import ScriptedModel


def test_the_option_names_are_the_typed_dicts_keys() -> None:
    assert set(RunOptions.__annotations__) == OPTION_NAMES
    assert RunOptions.__optional_keys__ == OPTION_NAMES
    assert not RunOptions.__required_keys__
    assert CONTEXT_OPTION_NAMES is OPTION_NAMES


def test_the_entry_points_own_arguments_are_all_that_their_options_leave_out() -> None:
    structured = OPTION_NAMES - StructuredRunOptions.__optional_keys__
    assert structured == {"output_type", "output_retries"}
    assert OPTION_NAMES - SkillRunOptions.__optional_keys__ == {"skill", "skill_dispatch"}


async def test_a_misspelt_option_fails_type_checking_and_the_run() -> None:
    agent = AgentCore(ScriptedModel([]))
    # mypy's warn_unused_ignores (strict) fails the type check if the misspelling passes it
    stream = agent.stream("x", max_iteration=3)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="unknown run option"):
        await anext(stream)
