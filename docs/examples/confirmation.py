"""Approve a tool call from another thread, as a web front end would through its server.

Run it from the repository root::

    uv run python docs/examples/confirmation.py

A scripted model asks for ``delete_file``, whose policy is ``ask``. The run announces a
``confirmation_requested`` event and waits. A separate thread, standing in for the HTTP handler
of ``POST /external-events``, answers it once it has seen the request; the tool then runs with
the arguments the run already held. The same answer sent a second time is refused.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from agent_runtime import AgentCore, AgentEventType, AgentRunConfig, tool
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.testing import ScriptedModel, tool_call_turn


def answer_later(
    agent: AgentCore,
    config: AgentRunConfig,
    asked: threading.Event,
    request: dict[str, Any],
    verdicts: list[list[str]],
) -> None:
    """The front end's side: wait for the question, approve it, then resend by mistake."""
    asked.wait()
    reply = ExternalEvent(
        "confirmation_response",
        {"tool_call_id": request["tool_call_id"], "approved": True},
    )
    verdicts.append(agent.emit_external_event(reply, config=config))
    verdicts.append(agent.emit_external_event(reply, config=config))  # a duplicate


async def main() -> None:
    deleted: list[str] = []

    @tool(policy="ask")
    def delete_file(path: str) -> str:
        """Delete a file (this example only pretends to)."""
        deleted.append(path)
        return f"Deleted {path}"

    model = ScriptedModel(
        [
            tool_call_turn("delete_file", {"path": "notes.txt"}, call_id="call-1"),
            "Done: notes.txt is gone.",
        ]
    )
    config = AgentRunConfig(session_id="example-session", request_id="run-1")
    agent = await AgentCore.create(
        model, tools=[delete_file], extensions=[ConfirmationExtension(timeout=30)]
    )
    asked = threading.Event()
    request: dict[str, Any] = {}
    verdicts: list[list[str]] = []
    front_end = threading.Thread(
        target=answer_later, args=(agent, config, asked, request, verdicts), daemon=True
    )
    front_end.start()
    try:
        async for event in agent.stream("Please delete notes.txt", config=config):
            if event.type is AgentEventType.CUSTOM and event.name == "confirmation_requested":
                assert event.payload is not None
                print(f"custom {event.name}: {event.payload['question']}")
                print(
                    f"  answer with {event.payload['response_event']!r} before "
                    f"{event.payload['expires_at']}"
                )
                request.update(event.payload)
                asked.set()
            elif event.type is AgentEventType.TOOL_CALL_COMPLETED:
                print(f"tool {event.name} returned {event.result!r}")
            elif event.type is AgentEventType.RUN_COMPLETED:
                assert event.message is not None
                print(f"assistant: {event.message.content}")
        await asyncio.to_thread(front_end.join)
    finally:
        asked.set()  # never leave the thread waiting, even if the run failed
        await agent.aclose()
    print(f"first answer accepted by {verdicts[0]}")
    print(f"second answer accepted by {verdicts[1]}")
    assert verdicts == [["ConfirmationExtension"], []]
    assert deleted == ["notes.txt"]
    model.assert_consumed()


if __name__ == "__main__":
    asyncio.run(main())
