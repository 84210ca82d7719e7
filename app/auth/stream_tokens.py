"""Stream tokens: what lets a browser's ``EventSource`` read one run's events.

``EventSource`` cannot send an ``Authorization`` header, so with authentication on, the
``events_url`` of a run (the 202 of a background run, ``GET /v1/runs/{id}``) carries
``?token=``: ``<expiry>.<principal, base64url>.<HMAC-SHA256 over run id, principal and
expiry>``. It grants reading that one run's events (``GET /v1/runs/{id}/events``) as that
principal until it expires (``AGENT_STREAM_TOKEN_TTL``, default 300 s), and nothing else.

The HMAC key is ``AGENT_STREAM_TOKEN_SECRET`` if set; else, with Redis, a random key the first
worker stores there and every other worker reads (one per deployment, per Redis prefix);
else one derived from ``AGENT_API_KEYS`` (what every worker of a deployment shares). Tokens
are never logged (``app.telemetry.logs`` masks ``token=`` in every line).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from typing import Final

from app.bus.base import Bus
from app.errors import Unauthorized

__all__ = ["StreamTokens", "open_stream_tokens"]

_SECRET_NAME: Final = "stream-token-secret"
# the shared key lives as long as Redis keeps it: ten years is "for good" with a TTL
_SECRET_TTL: Final = 10 * 365 * 86_400.0


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StreamTokens:
    """Issues and checks stream tokens with one HMAC key."""

    __slots__ = ("_key", "_ttl")

    def __init__(self, key: bytes, ttl: float) -> None:
        self._key = key
        self._ttl = ttl

    def __repr__(self) -> str:
        return f"StreamTokens(ttl={self._ttl:g})"

    def _signature(self, run_id: str, principal: str, expiry: int) -> str:
        message = f"{run_id}\n{principal}\n{expiry}".encode()
        return _b64(hmac.new(self._key, message, hashlib.sha256).digest())

    def issue(self, run_id: str, principal: str, *, now: float | None = None) -> str:
        """A token for reading ``run_id``'s events as ``principal``."""
        expiry = int((time.time() if now is None else now) + self._ttl)
        signature = self._signature(run_id, principal, expiry)
        return f"{expiry}.{_b64(principal.encode())}.{signature}"

    def principal(self, token: str, run_id: str, *, now: float | None = None) -> str:
        """The principal ``token`` speaks for on ``run_id``; ``Unauthorized`` if it is
        malformed, for another run, forged or expired."""
        expiry_text, _, rest = token.partition(".")
        encoded, _, signature = rest.partition(".")
        try:
            expiry = int(expiry_text)
            principal = _unb64(encoded).decode()
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise Unauthorized("the stream token is not valid") from None
        expected = self._signature(run_id, principal, expiry)
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise Unauthorized("the stream token is not valid (for this run)")
        if (time.time() if now is None else now) >= expiry:
            raise Unauthorized("the stream token expired: read the run again for a new one")
        return principal


async def open_stream_tokens(
    bus: Bus, *, secret: str | None, api_keys: str, ttl: float
) -> StreamTokens:
    """The deployment's stream tokens (see the module docstring for where the key comes from)."""
    if secret is not None:
        key = hashlib.sha256(secret.encode()).digest()
    elif bus.shared:
        mine = secrets.token_hex(32)
        theirs = await bus.values.put_new(_SECRET_NAME, mine, _SECRET_TTL)
        key = bytes.fromhex(theirs or mine)
    else:
        key = hmac.new(api_keys.encode(), b"agent-runtime stream tokens", hashlib.sha256).digest()
    return StreamTokens(key, ttl)
