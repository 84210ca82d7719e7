# mypy: ignore-errors
# (runs in bench/.peers/pydantic-ai, which has pydantic-ai; this project's environment has not)
"""pydantic-ai's AG-UI endpoint on a FunctionModel that streams the demo model's words.

    uvicorn bench.peer_apps.pydantic_ai_app:app --port N

``POST /`` takes an AG-UI ``RunAgentInput``; the model answers ``You said: <input>``, one word
per text delta, like the service's demo model. An input starting with ``park`` never answers
(an idle open stream, for the memory comparison).
"""

from __future__ import annotations

import asyncio
import re

from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.ui.ag_ui import AGUIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

_WORD = re.compile(r"\S+\s*")


def _prompt(messages) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


async def stream_words(messages, info: AgentInfo):
    prompt = _prompt(messages)
    if prompt.startswith("park"):
        await asyncio.Event().wait()
    for word in _WORD.findall(f"You said: {prompt}"):
        yield word


agent = Agent(FunctionModel(stream_function=stream_words))


async def run(request: Request) -> Response:
    return await AGUIAdapter.dispatch_request(request, agent=agent)


async def ready(request: Request) -> Response:
    return JSONResponse({"status": "ready"})


app = Starlette(routes=[Route("/", run, methods=["POST"]), Route("/readyz", ready)])
