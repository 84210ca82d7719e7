"""``GET /v1/agents``: the configured agents, with their skills and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.http.api.schemas import AgentList
from app.server.services import ServicesDep

__all__ = ["router"]

router = APIRouter(tags=["agents"])


@router.get(
    "/v1/agents",
    summary="The configured agents",
    response_model=AgentList,
    dependencies=[Depends(principal_of)],
)
async def list_agents(services: ServicesDep) -> Response:
    """Every agent: its name, description, primary model, skills (name and description) and
    whether it is ready to take runs."""
    agents = services.agents
    watch = services.dependencies
    serving = services.ready and not services.manager.draining and not (watch and watch.problem)
    warm = agents.warm
    listed: list[dict[str, Any]] = []
    for name, core in agents.cores.items():
        skills = await core.skills.aload() if core.skills is not None else {}
        listed.append(
            {
                "name": name,
                "description": agents.profiles[name].description,
                "model": core.bindings.primary.model,
                "skills": [{"name": s.name, "description": s.description} for s in skills.values()],
                "ready": serving and name in warm,
            }
        )
    return JSONResponse({"agents": listed})
