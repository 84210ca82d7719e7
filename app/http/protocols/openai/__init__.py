"""The OpenAI-compatible endpoints under ``/openai/v1``: Responses, Chat Completions, models."""

from __future__ import annotations

from fastapi import APIRouter

from app.http.protocols.openai import chat, responses

__all__ = ["router"]

router = APIRouter()
router.include_router(responses.router)
router.include_router(chat.router)
