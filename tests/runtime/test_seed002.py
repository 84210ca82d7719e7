"""The two examples in the docstring of seed 002, reconstructed, and shown to behave as it says.

The seed's text lost its indentation; the code between the ``seed example`` markers below is
that text with the indentation put back and the package renamed (``zett_agent`` to
``agent_runtime``, ``Agent`` to ``AgentCore``). ``test_the_reconstruction_follows_the_seed``
checks, when the seeds are present, that no line of the seed was changed or dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# fmt: off
# -- seed example: the extension ---------------------------------------------------------------
from agent_runtime.agent import AgentRunContext
from agent_runtime.events import (
    AgentEvent,
    AgentEventType,
)
from agent_runtime.extensions.external import ExternalEventExtension
from agent_runtime.messages import ToolCall
from agent_runtime.tools.base import tool


class ConfirmationExtension(ExternalEventExtension):
    def __init__(self) -> None:
        super().__init__(
            response_event_name="confirmation_response",
            correlation_field="tool_call_id",
        )

    async def on_tool(self, context: AgentRunContext) -> None:
        @tool
        async def confirm() -> bool:
            '''Ask the user whether to proceed.

            Snippet:
                confirm()

            Guidelines:
                - Use when proceeding requires an explicit user decision.
            '''
            response = self._take_external_event(context)
            approved = response.payload.get("approved")
            if not isinstance(approved, bool):
                raise ValueError("approved must be a boolean")
            return approved

        context.register_tool(confirm)

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        if call.name != "confirm":
            return
        async with self._wait_for_external_event(context, call.id):
            await context.emit(AgentEvent(
                AgentEventType.CUSTOM,
                session_id=context.session_id,
                name="confirmation_requested",
                payload={"tool_call_id": call.id, "question": "Proceed?"},
            ))
# -- end of the seed example ---------------------------------------------------------------------
# fmt: on

from agent_runtime.testing import ScriptedModel, tool_call_turn  # noqa: E402
from tests.support.seeds import renamed, seed_text  # noqa: E402

HERE = Path(__file__)


async def test_usage_accepts_once_then_refuses_stale_answers() -> None:
    model = ScriptedModel([tool_call_turn("confirm", call_id="call-7"), "Proceeding."])
    ext_name = "ConfirmationExtension"

    # fmt: off
    # -- seed example: usage ---------------------------------------------------------------
    from agent_runtime.agent import (
        AgentCore,
        AgentRunConfig,
    )
    from agent_runtime.extensions.external import ExternalEvent

    config = AgentRunConfig(
        session_id="session-42",
        request_id="request-1",
    )
    agent = await AgentCore.create(model, config=config, extensions=[ConfirmationExtension()])
    # read the stream until the question shows up, as a front end would
    stream = agent.stream("Should I go ahead?")  # the agent's config routes the run
    async for event in stream:
        if event.type is AgentEventType.CUSTOM and event.name == "confirmation_requested":
            assert event.payload == {"tool_call_id": "call-7", "question": "Proceed?"}
            assert event.session_id == "session-42"
            break
    # the person's answer names the call it approves
    accepted_by = agent.emit_external_event(
        ExternalEvent(
            name="confirmation_response",
            payload={"tool_call_id": "call-7", "approved": True},
        ),
        config=config,
    )
    # accepted once by the extension; a repeat of the same answer is refused
    # -- end of the seed example -------------------------------------------------------------
    # fmt: on

    assert accepted_by == [ext_name]
    duplicate = ExternalEvent("confirmation_response", {"tool_call_id": "call-7", "approved": True})
    assert agent.emit_external_event(duplicate, config=config) == []
    rest = [event async for event in stream]
    [done] = [e for e in rest if e.type is AgentEventType.TOOL_CALL_COMPLETED]
    assert done.result is True and not done.is_error
    assert rest[-1].type is AgentEventType.RUN_COMPLETED
    # stale: the run is over, and an unknown id never matched anything
    assert agent.emit_external_event(duplicate, config=config) == []
    unknown = ExternalEvent("confirmation_response", {"tool_call_id": "call-8", "approved": True})
    assert agent.emit_external_event(unknown, config=config) == []
    [extension] = agent.extensions
    assert isinstance(extension, ConfirmationExtension)
    assert extension.pending_count() == 0 and extension.staged_count() == 0
    assert not agent.active_runs and not agent.active_sessions
    model.assert_consumed()
    await agent.aclose()


async def test_a_non_boolean_answer_is_the_subclass_business() -> None:
    """The seed's subclass validates in its tool, so a bad answer is claimed and the tool fails."""
    from agent_runtime.agent import AgentCore, AgentRunConfig
    from agent_runtime.extensions.external import ExternalEvent

    model = ScriptedModel([tool_call_turn("confirm", call_id="call-7"), "Stopped."])
    config = AgentRunConfig(
        session_id="session-42",
        request_id="request-1",
    )
    agent = await AgentCore.create(model, config=config, extensions=[ConfirmationExtension()])
    stream = agent.stream("Should I go ahead?")
    async for event in stream:
        if event.type is AgentEventType.CUSTOM:
            break
    answer = ExternalEvent("confirmation_response", {"tool_call_id": "call-7", "approved": "y"})
    assert agent.emit_external_event(answer, config=config) == ["ConfirmationExtension"]
    rest = [event async for event in stream]
    [done] = [e for e in rest if e.type is AgentEventType.TOOL_CALL_COMPLETED]
    assert done.is_error and "approved must be a boolean" in (done.error or "")
    [extension] = agent.extensions
    assert isinstance(extension, ConfirmationExtension)
    assert extension.pending_count() == 0 and extension.staged_count() == 0
    await agent.aclose()


def _seed_block(text: str, start: str, stop: str) -> list[str]:
    lines = text.splitlines()
    first = lines.index(start) + 1
    last = next(i for i in range(first, len(lines)) if lines[i].startswith(stop))
    return [line.strip() for line in lines[first:last] if line.strip()]


def _tokens(lines: list[str]) -> list[str]:
    """The code's tokens, comments and layout aside: the same code however it is laid out."""
    code = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    code = re.sub(r"\s#[^\n'\"]*$", "", code, flags=re.MULTILINE)
    return re.findall(r"\w+|[^\w\s]", code)


def _is_subsequence(needles: list[str], haystack: list[str]) -> bool:
    remaining = iter(haystack)
    return all(any(token == candidate for candidate in remaining) for token in needles)


def test_the_reconstruction_follows_the_seed() -> None:
    text = seed_text("002")
    if text is None:
        pytest.skip("the seed documents are not beside this checkout")
    ours = [line.strip() for line in HERE.read_text(encoding="utf-8").splitlines()]
    ours = [line for line in ours if line]
    for start, stop in (("Example::", "Usage::"), ("Usage::", "Acceptance means")):
        block = [renamed(line) for line in _seed_block(text, start, stop)]
        assert block, f"no code found after {start!r} in seed 002"
        assert _is_subsequence(_tokens(block), _tokens(ours)), (
            f"the {start[:-2]} block strays from the seed"
        )
        assert not any(re.search(r"\bAgent\b(?!Core)", line) for line in block)
