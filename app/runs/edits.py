"""An approval that edits a call's arguments (or a denial with a reply), checked on the worker
it reached.

The runtime of the worker holding the run checks an edit as it takes the answer
(``agent_runtime.extensions.edits``) and refuses it with an ``AnswerRefusedError``. An answer
that travels to another worker is checked here first, against the question in the run's log
and the same agent's tool (every worker builds the same agents): a refusal there could not
come back over the bus, and the sender gets the same error wherever the run is held.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_runtime.agent import AgentCore
from agent_runtime.errors import EditNotAllowedError
from agent_runtime.extensions.confirmation import CONFIRMATION_REQUESTED, CONFIRMATION_RESPONSE
from agent_runtime.extensions.edits import EDITED_ARGUMENTS, edited_arguments
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.extensions.replies import REPLY, reply_of
from agent_runtime.messages import ToolCall
from app.bus.base import BusError, EventLog

__all__ = ["check_edit", "is_edit"]

# seconds the log may take to answer; past it the holder's runtime has the only say
_READ_TIMEOUT = 5.0


def is_edit(event: ExternalEvent) -> bool:
    """Whether ``event`` is an answer that carries edited arguments or a reply (one whose
    ``approved`` is not a boolean is no answer at all: the holder refuses it as not
    accepted)."""
    payload = event.payload
    return (
        event.name == CONFIRMATION_RESPONSE
        and isinstance(payload.get("approved"), bool)
        and (payload.get(EDITED_ARGUMENTS) is not None or payload.get(REPLY) is not None)
    )


async def check_edit(
    events: EventLog, agent: AgentCore | None, run_id: str, event: ExternalEvent
) -> None:
    """Raise the ``AnswerRefusedError`` the holder of ``run_id`` would raise for the edit in
    ``event``; nothing when the run asked no such question (the holder refuses it as unknown)
    or when ``agent`` (the run's) has no tool of that name here."""
    call_id = event.payload.get("tool_call_id")
    if not isinstance(call_id, str):
        return
    asked = await _question(events, run_id, call_id)
    if asked is None:
        return
    name = str(asked.get("tool") or "")
    reply_of(name, event.payload)
    if event.payload.get(EDITED_ARGUMENTS) is None:
        return
    if asked.get("editable") is not True:
        raise EditNotAllowedError(name)
    found = agent.registry.get(name) if agent is not None else None
    if found is None:
        return
    arguments = asked.get("arguments")
    call = ToolCall(call_id, name, arguments if isinstance(arguments, dict) else {})
    edited_arguments(found, call, event.payload)


async def _question(events: EventLog, run_id: str, call_id: str) -> dict[str, Any] | None:
    """The payload of the run's last ``confirmation_requested`` for ``call_id`` in its log."""
    try:
        last = await events.last_seq(run_id)
        if not last:
            return None
        subscription = await events.subscribe(run_id, after=0)
    except BusError:  # LogNotFound too: no log, no question to check against
        return None
    found: dict[str, Any] | None = None
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            while subscription.cursor < last and not subscription.finished:
                batch = await subscription.next()
                if not batch:
                    break
                for wire in batch:
                    if wire.type != "custom":
                        continue
                    data = wire.document["data"]
                    payload = data.get("payload")
                    if (
                        data.get("name") == CONFIRMATION_REQUESTED
                        and isinstance(payload, dict)
                        and payload.get("tool_call_id") == call_id
                    ):
                        found = payload
    except (TimeoutError, BusError):
        return None
    finally:
        await subscription.aclose()
    return found
