"""Agent cards as HTTP answers a client may cache: ``Cache-Control`` and an ``ETag``.

A card changes only when the service's configuration does (a restart), so a client may keep it
a few minutes and then revalidate it: ``If-None-Match`` with the card's ``ETag`` (a hash of its
JSON) is answered 304 without the card.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["CARD_CACHE_CONTROL", "card_response"]

CARD_CACHE_CONTROL: Final = "public, max-age=300"


def _matches(header: str | None, etag: str) -> bool:
    if header is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags


def card_response(request: Request, card: Mapping[str, Any]) -> Response:
    """``card`` as JSON with its validators; 304 when the client already holds it."""
    body = json.dumps(card, ensure_ascii=False, separators=(",", ":")).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    # the card names the URL it was asked at: a cache keyed by another host's URL is another
    headers = {"Cache-Control": CARD_CACHE_CONTROL, "ETag": etag, "Vary": "Host"}
    if _matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
