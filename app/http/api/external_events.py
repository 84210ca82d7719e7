"""External events: a front end's answer to a run waiting for one (a confirmation)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from agent_runtime.extensions.external import ExternalEvent
from app.auth.keys import principal_of
from app.http.api.errors import ProblemError, problem_response
from app.http.api.schemas import AcceptedBy, ExternalEventRequest, Problem
from app.server.services import ServicesDep

__all__ = ["router"]

router = APIRouter(tags=["external events"])

Principal = Annotated[str, Depends(principal_of)]

_PROBLEM = {"model": Problem, "content": {"application/problem+json": {}}}


@router.post(
    "/external-events",
    summary="Deliver an answer to a waiting run",
    status_code=202,
    response_model=AcceptedBy,
    responses={409: _PROBLEM, 404: _PROBLEM, 422: _PROBLEM, 503: _PROBLEM},
)
async def deliver(
    body: ExternalEventRequest, principal: Principal, services: ServicesDep
) -> Response:
    """202 with the extensions that took the answer; 409 if none did (stale, duplicate,
    expired or unknown); 422 ``edit_not_allowed`` or ``invalid_arguments`` for an approval
    whose edited ``arguments`` the tool does not take (the call keeps waiting)."""
    try:
        event = ExternalEvent(body.name, body.payload)  # the runtime's own checks too
    except (TypeError, ValueError) as exc:
        raise ProblemError(422, "validation_error", f"body: {exc}") from None
    accepted = await services.manager.routing.external_event(
        principal, body.session_id, body.run_id, event
    )
    if not accepted:
        return problem_response(
            409,
            "not_accepted",
            "no run of this session is waiting for this answer: it is stale, a duplicate, "
            "expired, or names an unknown call",
            extra={"accepted_by": []},
        )
    return JSONResponse({"accepted_by": accepted}, status_code=202)
