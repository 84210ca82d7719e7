"""Save a run's checkpoints, lose the process, and resume the run in a new agent.

Run it with ``uv run python docs/examples/checkpoints.py``. Offline: the model is scripted.
"""

from __future__ import annotations

import asyncio
import json

from agent_runtime import AgentCore, AgentEventType, AgentRunConfig, RunCheckpoint, tool
from agent_runtime.testing import ScriptedModel, tool_call_turn

SENT: list[str] = []


@tool
def send_mail(to: str) -> str:
    """Send a mail: not safe to run twice."""
    SENT.append(to)
    return f"sent to {to}"


@tool(idempotent=True)
def find_address(name: str) -> str:
    """Look an address up: safe to run again."""
    return f"{name}@example.com"


class JsonFile:
    """A sink keeping the latest checkpoint as JSON (a database row in a real service)."""

    def __init__(self, *, die_before: str | None = None) -> None:
        self.text = ""
        self.die_before = die_before

    async def save(self, checkpoint: RunCheckpoint) -> None:
        self.text = json.dumps(checkpoint.to_dict())
        if any(call.name == self.die_before for call in checkpoint.calls):
            raise ProcessLost("the process dies here, before the mail is sent")


class ProcessLost(Exception):
    """Stands for a crash: the run stops right after a checkpoint was saved."""


async def main() -> None:
    sink = JsonFile(die_before="send_mail")
    config = AgentRunConfig(session_id="mail", run_id="run_mail")
    first = AgentCore(
        ScriptedModel(
            [
                tool_call_turn("find_address", {"name": "ada"}),
                tool_call_turn("send_mail", {"to": "ada@example.com"}),
            ]
        ),
        tools=[send_mail, find_address],
    )
    try:
        async for _ in first.stream("Mail Ada", config=config, checkpoint_sink=sink):
            pass
    except ProcessLost as lost:
        print(lost)
    await first.aclose()
    assert SENT == []

    checkpoint = RunCheckpoint.from_dict(json.loads(sink.text))
    print(f"resuming {checkpoint.run_id} from step {checkpoint.step}")
    second = AgentCore(ScriptedModel(["Mail sent."]), tools=[send_mail, find_address])
    async for event in second.resume(checkpoint, checkpoint_sink=JsonFile()):
        if event.type is AgentEventType.RUN_RESUMED:
            print("run.resumed", event.data())
        elif event.type is AgentEventType.RUN_COMPLETED:
            print("answer:", event.data()["output"]["content"])
    await second.aclose()
    assert SENT == ["ada@example.com"]


if __name__ == "__main__":
    asyncio.run(main())
