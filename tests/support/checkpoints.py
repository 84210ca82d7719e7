"""Agents whose tools have visible effects, and a sink that keeps every checkpoint they save."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_runtime import (
    AgentCore,
    AgentRunConfig,
    RunCheckpoint,
    tool,
)
from agent_runtime.extensions.confirmation import (
    CONFIRMATION_RESPONSE,
    ConfirmationExtension,
)
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.testing import ScriptedModel


class Sink:
    """Keeps every checkpoint; ``fail_at``: the step whose save raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.saved: list[RunCheckpoint] = []
        self.fail_at = fail_at

    async def save(self, checkpoint: RunCheckpoint) -> None:
        if checkpoint.step == self.fail_at:
            raise RuntimeError("the store is gone")
        # what a store keeps is the JSON form: read it back as a resuming worker would
        self.saved.append(RunCheckpoint.from_dict(checkpoint.to_dict()))


class Effects:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.looked: list[str] = []

        @tool
        def send_mail(to: str) -> str:
            """Send a mail (not idempotent)."""
            self.sent.append(to)
            return f"sent to {to}"

        @tool(idempotent=True)
        def look_up(name: str) -> str:
            """Look a name up (safe to repeat)."""
            self.looked.append(name)
            return f"{name} is here"

        self.send_mail = send_mail
        self.look_up = look_up


CONFIG = AgentRunConfig(session_id="s1", run_id="run_1")


def ask_agent(effects: Effects, script: Sequence[Any]) -> AgentCore:
    return AgentCore(
        ScriptedModel(list(script)),
        tools=[effects.send_mail],
        tool_policies={"send_mail": "ask"},
        extensions=[ConfirmationExtension(timeout=30)],
    )


def answer(call_id: str, approved: bool) -> ExternalEvent:
    return ExternalEvent(CONFIRMATION_RESPONSE, {"tool_call_id": call_id, "approved": approved})
