"""What a run sends its webhook: the event types, the bodies and their stable ids.

Body (JSON, signed byte for byte)::

    {"type": "run.completed" | "run.failed" | "run.cancelled" | "run.confirmation_requested",
     "timestamp": "2026-12-02T07:00:00.000Z",
     "data": {"run_id", "session_id", "agent", "status", ...}}

A message's ``webhook-id`` is derived from the run and the event (its end, or one tool call's
confirmation), so the same notification written twice is one message, sent under one id.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any, Final

from app.bus.wire import iso_ms
from app.storage import WebhookMessage

__all__ = ["CONFIRMATION_REQUESTED", "END_TYPES", "confirmation_message", "end_message"]

CONFIRMATION_REQUESTED: Final = "run.confirmation_requested"
END_TYPES: Final = frozenset({"run.completed", "run.failed", "run.cancelled"})


def _message_id(run_id: str, event: str) -> str:
    digest = hashlib.sha256(f"{run_id}\x00{event}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def _body(event_type: str, at: float, data: Mapping[str, Any]) -> str:
    return json.dumps(
        {"type": event_type, "timestamp": iso_ms(at), "data": data},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def end_message(
    url: str,
    *,
    run_id: str,
    session_id: str,
    agent: str,
    event_type: str,
    data: Mapping[str, Any],
    status: str,
    at: float | None = None,
) -> WebhookMessage:
    """The notification of a run's end: its terminal event's type and data."""
    at = time.time() if at is None else at
    payload = {
        "run_id": run_id,
        "session_id": session_id,
        "agent": agent,
        "status": status,
        **data,
    }
    return WebhookMessage(
        id=_message_id(run_id, "end"),
        run_id=run_id,
        url=url,
        event_type=event_type,
        body=_body(event_type, at, payload),
        created_at=at,
    )


def confirmation_message(
    url: str,
    *,
    run_id: str,
    session_id: str,
    agent: str,
    confirmation: Mapping[str, Any],
    at: float | None = None,
) -> WebhookMessage:
    """The notification that a run waits for a tool call's approval (the ``custom``
    ``confirmation_requested`` event's payload, as ``data.confirmation``)."""
    at = time.time() if at is None else at
    call = str(confirmation.get("tool_call_id", ""))
    payload = {
        "run_id": run_id,
        "session_id": session_id,
        "agent": agent,
        "status": "waiting",
        "confirmation": dict(confirmation),
    }
    return WebhookMessage(
        id=_message_id(run_id, f"confirmation:{call}"),
        run_id=run_id,
        url=url,
        event_type=CONFIRMATION_REQUESTED,
        body=_body(CONFIRMATION_REQUESTED, at, payload),
        created_at=at,
    )
