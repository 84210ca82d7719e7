"""Edited arguments: the person approving a tool call changes what it runs with.

An approval (``confirmation_response``) may carry ``arguments``: the whole object the call is to
run with instead of the model's. It is taken only for a tool declared editable
(``@tool(editable=True)``) and only if the tool's own validation (its parameters' schema) takes
it; otherwise the answer is refused with an ``AnswerRefusedError`` and the call keeps waiting.
A taken edit replaces the call in the run's conversation, so the model's next turn, the run's
checkpoint and its stored messages all hold the arguments the tool actually ran with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import EditNotAllowedError, InvalidEditError
from ..messages import ToolCall
from ..tools.base import Tool, ToolArgumentsError

__all__ = ["EDITED_ARGUMENTS", "edited_arguments"]

EDITED_ARGUMENTS = "arguments"
"""The key of an approval's payload that carries the edited arguments."""


def edited_arguments(
    tool: Tool | None, call: ToolCall, payload: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The arguments an answer's ``payload`` runs ``call`` with, if it edits them.

    None when it carries none (or ``null``, or the very arguments of the call). Raises
    ``EditNotAllowedError`` when ``tool`` (the call's tool, None if the run has no such tool)
    is not editable, and ``InvalidEditError`` for arguments that are not a JSON object, that
    the tool's validation refuses, or that come with anything but an approval.
    """
    arguments = payload.get(EDITED_ARGUMENTS)
    if arguments is None:
        return None
    if tool is None or not tool.editable:
        raise EditNotAllowedError(call.name)
    if payload.get("approved") is not True:
        raise InvalidEditError(call.name, "edited arguments come with an approval (approved: true)")
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        raise InvalidEditError(call.name, "arguments must be an object of named values")
    edited = dict(arguments)
    try:
        tool.validate(edited)
    except ToolArgumentsError as exc:
        raise InvalidEditError(call.name, str(exc)) from None
    return None if edited == call.arguments else edited
