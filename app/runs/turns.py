"""A session's turns as stored: the turn a stopped run leaves, and the last turn replaced.

A turn is one run's messages: the user's input, then what the agent said and did. A completed
run stores its turn when it ends; the functions here cover the other two ways a turn changes.

**Stopped turns.** A cancelled run (Stop, a client gone with ``on_disconnect: cancel``,
shutdown, a run superseded by another) keeps its turn: the input and whatever the agent had
done, as the runtime's ``run.cancelled`` reports it (finished answers and tool results, the
text of a model call cut short, an error result for each tool call that had not returned).
Every message of such a turn carries ``"stopped": <the run.cancelled reason>``. The turn goes
back to the model with the rest of the conversation on the next run, like any other turn (the
marker is ours; models never see it): the model knows what it was asked and how far it got, so
"go on" works, as it does in the chat products people use every day.

**Replacing the last turn.** A run started with ``replaces: <run id>`` (regenerate, or edit
and resend) takes the place of the session's latest run: that run's turn is removed before the
new run reads the conversation, so the model never sees the answer being replaced. Only the
latest run can be replaced (another run of the session is a 409, a run of no such session a
404). To keep the old turn as well, a run branches instead (``app.runs.branches``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_runtime.content import Prompt
from agent_runtime.messages import AssistantMessage, Message, UserMessage, message_to_dict
from app.errors import Conflict, NotFound
from app.storage import Store

__all__ = ["model_history", "remove_replaced_turn", "stopped_turn", "store_stopped_turn"]


def stopped_turn(prompt: Prompt, messages: Sequence[Message], reason: str) -> list[dict[str, Any]]:
    """The stored form of a stopped run's turn: ``messages`` (the runtime's ``run.cancelled``
    messages; empty for a run stopped before it reached the runtime) marked with ``reason``.

    A run that never got as far as its first message still keeps its input (its parts, by
    reference, when it was given some). An assistant message with neither text nor tool calls
    says nothing and is left out, unless it holds the reasoning of a call cut short while the
    model was thinking: that is kept for the reader, and left out of what the model is given
    again (``model_history``). The signed reasoning state never is stored (``message_to_dict``
    leaves it out).
    """
    turn: list[Message] = list(messages) or [
        UserMessage(prompt if isinstance(prompt, str) else list(prompt))
    ]
    stored: list[dict[str, Any]] = []
    for message in turn:
        data = message_to_dict(message)
        if data["role"] == "assistant" and not (
            data.get("content") or data.get("tool_calls") or data.get("reasoning")
        ):
            continue
        data["stopped"] = reason
        stored.append(data)
    return stored


def model_history(messages: Sequence[Message]) -> list[Message]:
    """The stored conversation as a run gives it to its model: an assistant message that
    holds only reasoning (a stopped turn's, see ``stopped_turn``) is left out, as providers
    refuse an empty assistant message and take back no reasoning they did not sign."""
    return [
        m
        for m in messages
        if not isinstance(m, AssistantMessage)
        or m.content
        or m.tool_calls
        or m.reasoning_state is not None
    ]


async def store_stopped_turn(
    store: Store,
    session_id: str,
    run_id: str,
    prompt: Prompt,
    messages: Sequence[Message],
    reason: str,
    *,
    fence: int | None = None,
) -> None:
    """Append a stopped run's turn to its session (one transaction; see ``stopped_turn``).

    For every way a run is stopped, the run manager's own cancellation and a run superseded
    by another alike. ``fence``: the run's lease token (see ``Store.append_messages``).
    Raises what ``Store.append_messages`` raises.
    """
    await store.append_messages(
        session_id, run_id, stopped_turn(prompt, messages, reason), fence=fence
    )


async def remove_replaced_turn(store: Store, session_id: str, replaces: str) -> None:
    """Remove the turn of ``replaces``, the session's latest run, before a run replaces it.

    Call it while holding the session's lock, so no run can end in between. Raises
    ``NotFound`` when ``replaces`` is no run of this session, ``Conflict``
    (``turn_not_latest``) when it is not the session's latest run.
    """
    record = await store.get_run(replaces)
    if record is None or record.session_id != session_id:
        raise NotFound(f"no run {replaces!r} in session {session_id!r} to replace")
    latest = await store.list_runs(session_id, 1)
    if not latest or latest[0].run_id != replaces:
        raise Conflict(
            f"run {replaces!r} is not the latest run of session {session_id!r}: only the last "
            "turn can be replaced",
            code="turn_not_latest",
        )
    if not await store.remove_last_turn(session_id, replaces):  # pragma: no cover - see above
        raise Conflict(f"the turn of run {replaces!r} is not the last one", code="turn_not_latest")
