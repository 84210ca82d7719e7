"""The caller of a LangGraph route: a Bearer key as everywhere, or ``X-Api-Key``, the header
LangGraph's SDKs send for ``get_client(api_key=...)`` / ``new Client({apiKey})``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.auth.keys import ANONYMOUS, Authenticator

__all__ = ["Principal", "langgraph_principal"]


async def langgraph_principal(request: Request) -> str:
    """FastAPI dependency: the principal of the request's key (``Authorization`` first)."""
    auth: Authenticator = request.app.state.authenticator
    if not auth.enabled:
        return ANONYMOUS
    authorization = request.headers.get("authorization")
    if authorization is None:
        key = request.headers.get("x-api-key")
        if key:
            authorization = f"Bearer {key}"
    return auth.principal(authorization)


Principal = Annotated[str, Depends(langgraph_principal)]
"""The caller of a LangGraph route."""
