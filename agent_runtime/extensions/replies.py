"""A reply instead of the call: the person answering a confirmation writes to the model
rather than letting the tool run (Agent Inbox's ``response``).

A denial (``confirmation_response`` with ``approved: false``) may carry ``response``: text the
model receives as the call's result in the tool's place, so it can go on from what the person
said. The call does not run. A reply with an approval, or one that is not text of at most
``MAX_REPLY`` characters, is refused with an ``InvalidReplyError`` and the call keeps waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..errors import InvalidReplyError

__all__ = ["MAX_REPLY", "REPLY", "reply_of"]

REPLY: Final = "response"
"""The key of a denial's payload that carries the person's reply."""

MAX_REPLY: Final = 16_000
"""Characters a reply may have at most."""


def reply_of(tool: str, payload: Mapping[str, Any]) -> str | None:
    """The reply an answer's ``payload`` carries for a call to ``tool``, or None.

    Raises ``InvalidReplyError`` for a reply that is not text, is empty or too long, or comes
    with an approval (a call that runs has its own result)."""
    reply = payload.get(REPLY)
    if reply is None:
        return None
    if payload.get("approved") is not False:
        raise InvalidReplyError(tool, "a reply comes with a denial (approved: false)")
    if not isinstance(reply, str) or not reply.strip():
        raise InvalidReplyError(tool, "a reply is non-empty text")
    if len(reply) > MAX_REPLY:
        raise InvalidReplyError(tool, f"a reply has at most {MAX_REPLY} characters")
    return reply
