"""Deterministic models for configured agents, reached by ``python:`` model specs.

``model = "python:tests.fakes.config_models:tool_caller"`` answers by the run's latest input:

- ``call TOOL {json}``: calls ``TOOL`` with those arguments once, then answers
  ``TOOL -> RESULT`` or ``TOOL failed: ERROR``;
- ``tools``: the names of the tools it was offered, sorted, joined by ``,``;
- ``system`` (or ``system`` and more words): the run's system prompt (``none`` without one);
- ``history``: ``history N`` (the messages it received), with `` summary`` added when the first
  of them is a compaction summary;
- anything else: ``OK``.

``python:tests.fakes.config_models:summarizer`` always answers ``SUMMARY`` (a compaction model).
``python:tests.fakes.config_models:router`` is a System One model for skill dispatch: it answers
``NAME`` when the request holds ``route:NAME``, else ``none``.
``not_a_model`` and ``clashing`` are mistakes a configuration check must catch.
"""

from __future__ import annotations

import json
import re

from agent_runtime.compaction import SUMMARY_PREFIX
from agent_runtime.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from agent_runtime.model import ModelRequest
from agent_runtime.testing import FunctionModel
from agent_runtime.tools.base import tool

__all__ = ["clashing", "not_a_model", "router", "summarizer", "tool_caller"]

_CALL = re.compile(r"^\s*call\s+(\S+)\s*(\{.*\})?\s*$", re.DOTALL)


def _answer(request: ModelRequest) -> AssistantMessage:
    messages = request.messages
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    prompt = str(messages[last_user].content) if last_user >= 0 else ""
    results = [m for m in messages[last_user + 1 :] if isinstance(m, ToolMessage)]
    call = _CALL.match(prompt)
    if call is not None:
        name = call.group(1)
        if results:
            result = results[-1]
            verb = "failed:" if result.is_error else "->"
            return AssistantMessage(f"{name} {verb} {result.content}")
        arguments = json.loads(call.group(2) or "{}")
        return AssistantMessage(None, [ToolCall(f"call_{len(messages)}", name, arguments)])
    command = prompt.strip()
    if command == "tools":
        return AssistantMessage(",".join(sorted(t.name for t in request.tools)))
    if command == "system" or command.startswith("system "):
        return AssistantMessage(request.system or "none")
    if command == "history":
        first = messages[0] if messages else None
        summary = isinstance(first, UserMessage) and first.text.startswith(SUMMARY_PREFIX)
        return AssistantMessage(f"history {len(messages)}" + (" summary" if summary else ""))
    return AssistantMessage("OK")


def tool_caller() -> FunctionModel:
    """The scripted tool caller described above."""
    return FunctionModel(_answer, model_name="tool-caller")


def summarizer() -> FunctionModel:
    """A compaction model: every summary is ``SUMMARY``."""
    return FunctionModel(lambda request: "SUMMARY", model_name="summarizer")


def _route(request: ModelRequest) -> str:
    text = " ".join(str(m.content) for m in request.messages if isinstance(m, UserMessage))
    found = re.search(r"route:([a-z0-9-]+)", text)
    return found.group(1) if found else "none"


def router() -> FunctionModel:
    """The System One router described above."""
    return FunctionModel(_route, model_name="router")


def not_a_model() -> object:
    """A factory that returns no model (the server must refuse it)."""
    return object()


@tool(name="word__count")
def clashing(text: str) -> int:
    """A tool whose name takes the prefix of an MCP server named ``word``."""
    return len(text.split())
