"""Assistants: each configured agent is one (``assistant_id`` = ``graph_id`` = its name)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from app.bus.wire import iso_ms
from app.errors import NotFound
from app.http.protocols.langgraph.keys import Principal
from app.server.services import Services, ServicesDep

__all__ = ["assistant_of", "router"]

router = APIRouter()

# agents are configured, not created: they all date from the epoch, at version 1
_EPOCH = iso_ms(datetime(1970, 1, 1, tzinfo=UTC).timestamp())

_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
    "required": ["messages"],
}


def assistant_of(services: Services, assistant_id: str) -> str:
    """The agent an ``assistant_id`` names; NotFound for none."""
    if assistant_id not in services.agents.profiles:
        raise NotFound(f"assistant {assistant_id!r} not found")
    return assistant_id


def _view(services: Services, name: str) -> dict[str, Any]:
    profile = services.agents.profiles[name]
    return {
        "assistant_id": name,
        "graph_id": name,
        "name": name,
        "description": profile.description,
        "config": {},
        "context": {},
        "metadata": {},
        "version": 1,
        "created_at": _EPOCH,
        "updated_at": _EPOCH,
    }


class AssistantSearch(BaseModel):
    model_config = ConfigDict(extra="allow")

    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)


def _matching(services: Services, body: AssistantSearch) -> list[str]:
    names = sorted(services.agents.profiles)
    if body.graph_id is not None:
        names = [n for n in names if n == body.graph_id]
    if body.name is not None:
        names = [n for n in names if body.name in n]
    # an agent has no metadata: a search by metadata finds none
    return [] if body.metadata else names


@router.post("/assistants/search")
async def search(body: AssistantSearch, _: Principal, services: ServicesDep) -> Response:
    """The agents, filtered by ``graph_id``/``name``."""
    page = _matching(services, body)[body.offset : body.offset + body.limit]
    return JSONResponse([_view(services, n) for n in page])


@router.post("/assistants/count")
async def count(body: AssistantSearch, _: Principal, services: ServicesDep) -> Response:
    """How many assistants ``search`` would find without paging."""
    return JSONResponse(len(_matching(services, body)))


@router.get("/assistants/{assistant_id}")
async def get(assistant_id: str, _: Principal, services: ServicesDep) -> Response:
    """One assistant."""
    return JSONResponse(_view(services, assistant_of(services, assistant_id)))


@router.get("/assistants/{assistant_id}/schemas")
async def schemas(assistant_id: str, _: Principal, services: ServicesDep) -> Response:
    """The input, output and state schemas: a list of messages in, the same out."""
    name = assistant_of(services, assistant_id)
    return JSONResponse(
        {
            "graph_id": name,
            "input_schema": _INPUT_SCHEMA,
            "output_schema": _INPUT_SCHEMA,
            "state_schema": _INPUT_SCHEMA,
            "config_schema": {"type": "object", "properties": {}},
            "context_schema": {"type": "object", "properties": {}},
        }
    )
