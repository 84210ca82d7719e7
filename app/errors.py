"""The service's domain errors: what a request asked for that the service will not do.

Domain modules (the run manager, services, auth, the protocols' translations) raise these;
only the HTTP edge turns them into answers (``app.http.api.errors`` for problem+json, each
protocol's own error shape on its paths). ``code`` is the stable public literal of the
contract; the HTTP status belongs to the edge::

    ServiceError
     ├── NotFound            not_found: no such session, run or agent (or not the caller's)
     ├── InvalidRequest      validation_error: well-formed, but not acceptable
     │   └── RefusedValue    a protocol's field the run start refuses (http.protocols.common)
     │       └── PartRefused  a protocol's content part the run cannot take (http.protocols.media)
     ├── Unauthorized        unauthorized: no key, or not a valid one
     ├── SessionBusy         session_busy: the session already has an active run
     ├── NotAccepted         not_accepted: an answer nobody was waiting for
     ├── Conflict            the request no longer fits the resource's state (turn_not_latest,
     │                       file_in_use)
     ├── PayloadTooLarge     payload_too_large: a body or a file over its limit
     ├── UnsupportedMediaType  unsupported_media_type: content of a type the service does not
     │                       take, or not the type it was declared as
     ├── Overloaded          overloaded: no slot and no room in the queue (retry later)
     ├── BudgetExceeded      budget_exceeded: a daily token budget is used up (retry after reset)
     ├── Draining            draining: this worker is shutting down (retry elsewhere)
     ├── Unavailable         unavailable: a dependency cannot be reached, or not ready yet
     ├── AgentUnavailable    agent_unavailable: the run's agent failed its warm-up
     ├── WebhookRefused      webhook_url_refused: a webhook_url that cannot be called
     ├── UpstreamError       provider_error: the model provider behind a call failed
     └── ConfirmationRequired  confirmation_required: a confirmation Chat Completions cannot
                               carry (http.protocols.openai.chat)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "AgentUnavailable",
    "BudgetExceeded",
    "Conflict",
    "Draining",
    "InvalidRequest",
    "NotAccepted",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "ServiceError",
    "SessionBusy",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "UpstreamError",
]


class ServiceError(Exception):
    """A refusal with a stable ``code`` and a message that tells the caller what to do.

    ``extra`` adds members to the error answer (``active_run_id``, ``accepted_by``...);
    ``retry_after`` (seconds) says when trying again may work.
    """

    code: ClassVar[str] = "internal"

    def __init__(
        self,
        detail: str,
        *,
        retry_after: float | None = None,
        extra: Mapping[str, Any] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
        self.extra = dict(extra or {})
        if code is not None:
            # a subclass's finer literal (``idempotency_key_reused`` is an InvalidRequest)
            self.code = code  # type: ignore[misc]


class NotFound(ServiceError):
    """No such session, run or agent, or it belongs to another principal."""

    code = "not_found"


class InvalidRequest(ServiceError):
    """A request the service understood but cannot take as it is."""

    code = "validation_error"


class Unauthorized(ServiceError):
    """Authentication is on and the request carries no valid credential."""

    code = "unauthorized"


class SessionBusy(ServiceError):
    """The session already has an active run."""

    code = "session_busy"


class NotAccepted(ServiceError):
    """An answer that no waiting run took."""

    code = "not_accepted"


class Conflict(ServiceError):
    """The request was made against a state that has changed (a turn that is no longer last)."""

    code = "conflict"


class PayloadTooLarge(ServiceError):
    """A request body, or a file in it, is larger than the service takes (413)."""

    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    """Content whose bytes are of a type the service does not take, or not of the type it was
    declared as (415)."""

    code = "unsupported_media_type"


class Overloaded(ServiceError):
    """No slot free and the queue is full, or a slot did not free up in time."""

    code = "overloaded"


class Draining(ServiceError):
    """This worker is shutting down and takes no new work."""

    code = "draining"


class Unavailable(ServiceError):
    """A dependency (database, bus, the agent's warm-up) cannot serve right now."""

    code = "unavailable"


class BudgetExceeded(ServiceError):
    """A run would start over a daily token budget of its principal or agent (429)."""

    code = "budget_exceeded"


class AgentUnavailable(ServiceError):
    """The run's agent failed its warm-up (an MCP server or its model); the others serve."""

    code = "agent_unavailable"


class WebhookRefused(ServiceError):
    """A run's ``webhook_url`` cannot be called: malformed, no signing secret for it, or its
    host resolves to a refused (non-public) address (422)."""

    code = "webhook_url_refused"


class UpstreamError(ServiceError):
    """A capability call's model provider failed (an upstream error, timeout or refusal)."""

    code = "provider_error"
