"""What the run manager asks of webhooks: is a run's URL acceptable, and its messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.errors import WebhookRefused
from app.storage import WebhookMessage
from app.webhooks.delivery import WebhookSecrets, WebhookSender
from app.webhooks.messages import confirmation_message, end_message
from app.webhooks.targets import TargetRefused, TargetUnresolved, WebhookTargets, check_url

__all__ = ["RunWebhooks"]


class RunWebhooks:
    """The worker's webhook policy (targets, keys) and its sender, as runs see them."""

    def __init__(
        self,
        targets: WebhookTargets,
        keys: WebhookSecrets,
        sender: WebhookSender | None = None,
    ) -> None:
        self.targets = targets
        self.keys = keys
        self.sender = sender

    async def check(self, url: str) -> None:
        """A run start's ``webhook_url``: ``WebhookRefused`` (422) unless it can be called."""
        try:
            check_url(url)
            if self.keys.key_for(url) is None:
                raise WebhookRefused(
                    "this server has no webhook signing secret for that endpoint: set "
                    "AGENT_WEBHOOK_SECRET (or the endpoint's entry in AGENT_WEBHOOK_SECRETS)"
                )
            await self.targets.resolve(url)
        except (TargetRefused, TargetUnresolved) as exc:
            raise WebhookRefused(f"webhook_url refused: {exc}") from None

    def end(
        self,
        url: str,
        *,
        run_id: str,
        session_id: str,
        agent: str,
        status: str,
        event_type: str,
        data: Mapping[str, Any],
    ) -> WebhookMessage:
        """The message of a run's end."""
        return end_message(
            url,
            run_id=run_id,
            session_id=session_id,
            agent=agent,
            event_type=event_type,
            data=data,
            status=status,
        )

    def confirmation(
        self, url: str, *, run_id: str, session_id: str, agent: str, payload: Mapping[str, Any]
    ) -> WebhookMessage:
        """The message of a confirmation request."""
        return confirmation_message(
            url, run_id=run_id, session_id=session_id, agent=agent, confirmation=payload
        )

    def wake(self) -> None:
        """A message was queued by this worker: send it now."""
        if self.sender is not None:
            self.sender.wake()
