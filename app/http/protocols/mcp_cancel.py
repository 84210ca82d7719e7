"""A handshake-era host's ``notifications/cancelled``: it cancels the ``tools/call`` it names.

On 2026-07-28 connections a host cancels a call by closing its response stream, which the call
sees. A host on 2025-11-25 or earlier sends ``notifications/cancelled`` with the call's request
id instead, in a POST of its own; the service serves ``/mcp`` statelessly (any worker answers
any request), so that POST shares no MCP session with the call, and the SDK acknowledges it and
drops it. Here each handshake-era call is recorded in the bus's shared values under its caller:
the principal, the host's address and the request id (a request id alone is the host's own
counter, and another host's could be the same). The notification looks the run up there, on
any worker, and cancels it (``cancel_requested``). Two calls in flight under the same caller
and id are ambiguous: the record is spoiled, and a notification naming it cancels neither.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Final

from app.bus.base import BusError
from app.server.services import Services

__all__ = ["CancelledCalls", "cancelled_request_id"]

logger = logging.getLogger("app.http.protocols.mcp")

_METHOD: Final = b'"notifications/cancelled"'
_AMBIGUOUS: Final = "*"
_PREFIX: Final = "mcp-call:"


def cancelled_request_id(body: bytes) -> str | int | None:
    """The request id a ``notifications/cancelled`` body names; None for any other body.

    Only a body that names the method is decoded (bounded by the body limit); a batch is not a
    handshake-era client's way to cancel.
    """
    if _METHOD not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "notifications/cancelled":
        return None
    params = message.get("params")
    request_id = params.get("requestId") if isinstance(params, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    return request_id


def _key(principal: str, address: str, request_id: Any) -> str:
    caller = json.dumps([principal, address, request_id], separators=(",", ":"))
    return _PREFIX + hashlib.sha256(caller.encode()).hexdigest()


class CancelledCalls:
    """The handshake-era calls in flight, by caller and request id, on every worker."""

    def __init__(self, services: Services) -> None:
        self._services = services
        settings = services.settings
        # a call lasts its run at most: the run's deadline, or a confirmation's wait beside it
        self._ttl = settings.run_timeout + settings.confirmation_timeout + 60.0

    async def record(self, principal: str, address: str, request_id: Any, run_id: str) -> None:
        """Note that the caller's request ``request_id`` is the run ``run_id``."""
        key = _key(principal, address, request_id)
        values = self._services.bus.values
        try:
            held = await values.put_new(key, run_id, self._ttl)
            if held is not None and held != run_id:
                await values.set(key, _AMBIGUOUS, self._ttl)
        except BusError as exc:
            logger.warning("could not record an MCP call for its cancellation: %s", exc)

    async def forget(self, principal: str, address: str, request_id: Any, run_id: str) -> None:
        """The call ended: its record goes (unless another call spoiled it)."""
        try:
            await self._services.bus.values.delete(_key(principal, address, request_id), run_id)
        except BusError as exc:
            logger.warning("could not forget an MCP call: %s", exc)

    async def cancel(self, principal: str, address: str, request_id: Any) -> bool:
        """Cancel the run of the caller's request ``request_id``; whether one was named."""
        try:
            run_id = await self._services.bus.values.get(_key(principal, address, request_id))
        except BusError as exc:
            logger.warning("could not look up a cancelled MCP call: %s", exc)
            return False
        if run_id is None or run_id == _AMBIGUOUS:
            return False
        answer = await self._services.manager.cancel(run_id, principal)
        return answer is not None
