"""Idempotent run starts: the ``Idempotency-Key`` of ``POST /v1/sessions/{id}/runs``.

The first request with a key claims it (a *pending* claim, short-lived, so a worker that
dies while admitting leaves nothing blocking); once its run is started, the claim becomes
the run's id for ``AGENT_IDEMPOTENCY_TTL``. A repeat with the same key from the same principal
and the same request (its session and body, as a fingerprint) gets that run id and starts
nothing; a different request under the key is ``idempotency_key_reused``; a repeat while the
first is still being admitted waits for it a moment, then is ``idempotency_key_in_flight``.
A start that fails gives its claim up, so a retry may start the run.

Keys live in the bus's ``SharedValues`` (Redis across workers, else the worker's memory) under
``idem:<sha256(principal, key)>``: neither the key nor the principal is stored in clear.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.bus.base import SharedValues
from app.errors import Conflict, InvalidRequest

__all__ = ["MAX_KEY_LENGTH", "Claim", "IdempotentStarts", "check_key", "fingerprint"]

MAX_KEY_LENGTH: Final = 255
_RETRY_AFTER_IN_FLIGHT: Final = 1.0


def check_key(key: str) -> str:
    """The key if it is 1 to 255 printable ASCII characters; else ``InvalidRequest``."""
    if not key or len(key) > MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable ASCII characters"
        )
    return key


def fingerprint(session_id: str, body: Mapping[str, Any]) -> str:
    """What makes two requests the same one: the session and the (validated) body."""
    canonical = json.dumps(
        {"session_id": session_id, "body": body},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Claim:
    """A request's standing under its key: ``run_id`` of the first run for a repeat; for the
    first request None, and the claim's name and value to complete or give up."""

    name: str
    value: str
    fingerprint: str
    run_id: str | None = None

    @property
    def replayed(self) -> bool:
        """True when the request repeats one that started ``run_id``."""
        return self.run_id is not None


class IdempotentStarts:
    """Claims of idempotency keys (see the module docstring)."""

    def __init__(
        self,
        values: SharedValues,
        *,
        ttl: float,
        pending_ttl: float,
        in_flight_wait: float,
    ) -> None:
        self._values = values
        self._ttl = ttl
        self._pending_ttl = pending_ttl
        self._in_flight_wait = in_flight_wait

    @staticmethod
    def _name(principal: str, key: str) -> str:
        digest = hashlib.sha256(f"{principal}\0{key}".encode()).hexdigest()
        return f"idem:{digest}"

    async def claim(self, principal: str, key: str, print_: str) -> Claim:
        """Claim ``key`` for a request with fingerprint ``print_``, or find the run a first
        request with it started; raises ``InvalidRequest`` (``idempotency_key_reused``) or
        ``Conflict`` (``idempotency_key_in_flight``)."""
        name = self._name(principal, key)
        pending = f"pending {print_} {secrets.token_hex(8)}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._in_flight_wait
        delay = 0.01
        while True:
            there = await self._values.put_new(name, pending, self._pending_ttl)
            if there is None:
                return Claim(name, pending, print_)
            state, _, rest = there.partition(" ")
            first_print, _, detail = rest.partition(" ")
            if first_print != print_:
                raise InvalidRequest(
                    "this Idempotency-Key was used for a different request (another body or "
                    "session); use a new key for a new request",
                    code="idempotency_key_reused",
                )
            if state == "run":
                return Claim(name, there, print_, run_id=detail)
            if loop.time() >= deadline:
                raise Conflict(
                    "the first request with this Idempotency-Key is still being admitted; "
                    "retry shortly",
                    code="idempotency_key_in_flight",
                    retry_after=_RETRY_AFTER_IN_FLIGHT,
                )
            # the first request is being admitted (a slot, the session's lock, its record)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.2)

    async def complete(self, claim: Claim, run_id: str) -> None:
        """The first request started ``run_id``: repeats attach to it from now on."""
        await self._values.replace(
            claim.name, claim.value, f"run {claim.fingerprint} {run_id}", self._ttl
        )

    async def give_up(self, claim: Claim) -> None:
        """The first request started nothing: the key is free again."""
        await self._values.delete(claim.name, claim.value)
