"""Bearer keys → principals.

``AGENT_API_KEYS="key=principal,..."``; unset means no authentication and every caller is the
principal ``anonymous``. A principal owns the sessions and runs it creates; anybody else is
told they do not exist (404, never 403).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from fastapi import Request

from app.errors import Unauthorized

__all__ = ["ANONYMOUS", "Authenticator", "principal_of"]

ANONYMOUS = "anonymous"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class Authenticator:
    """Looks a request's bearer key up. Keys are held only as SHA-256 digests."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._digests = {_digest(key): principal for key, principal in keys.items()}

    def __repr__(self) -> str:
        return f"Authenticator(keys={len(self._digests)})"

    @property
    def enabled(self) -> bool:
        """False when no keys are configured."""
        return bool(self._digests)

    def principal(self, authorization: str | None) -> str:
        """The principal for an ``Authorization`` header value; raises ``Unauthorized``."""
        if not self._digests:
            return ANONYMOUS
        if not authorization:
            raise Unauthorized("this server needs an API key: send Authorization: Bearer <key>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be 'Bearer <key>'")
        presented = _digest(token)
        # compare every digest so the time taken does not depend on which key matched
        found: str | None = None
        for digest, principal in self._digests.items():
            if hmac.compare_digest(digest, presented):
                found = principal
        if found is None:
            raise Unauthorized("the API key is not valid")
        return found


async def principal_of(request: Request) -> str:
    """FastAPI dependency: the caller's principal (async: a sync dependency would cost a
    thread-pool hop per request)."""
    auth: Authenticator = request.app.state.authenticator
    if not auth.enabled:
        return ANONYMOUS
    return auth.principal(request.headers.get("authorization"))
