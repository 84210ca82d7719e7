"""The worker's webhook sender: claims due outbox messages, signs and posts them, records.

Each worker runs one sender task. A claim (``Store.claim_webhooks``) gives one worker the
right to attempt a message until the claim runs out, longer than an attempt can take (the
attempt is cut at ``timeout``); the attempt is recorded only under that claim, so one
attempt is one worker's, however many workers look. A message is retried with exponential
backoff and jitter until it is delivered (a 2xx answer) or ``max_attempts`` were made; a
refused target (its host now resolves to a refused address), a redirect and a missing secret
fail it at once. Every attempt carries the message's one ``webhook-id``: a receiver that
saw the id drops the repeat.

Redirects are not followed: a 3xx answer is recorded as a failed delivery. Following one
would need the same check of its target; refusing them is simpler and a webhook receiver
has no reason to redirect.

Settled messages (delivered or failed) are deleted once older than ``retention``: each
sender prunes a batch every ``prune_interval`` (and at once again while batches come back
full), so the outbox holds what is pending and what is recent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from app.storage import ClaimedWebhook, Store, WebhookAttempt, WebhookStatus
from app.tasks import stop_task
from app.telemetry.metrics import Metrics
from app.webhooks.signing import origin_of, sign
from app.webhooks.targets import TargetRefused, TargetUnresolved, WebhookTargets

__all__ = ["WebhookSecrets", "WebhookSender", "backoff_delay"]

logger = logging.getLogger("app.webhooks")

_BATCH = 16
_PRUNE_BATCH = 500
_CLAIM_MARGIN = 30.0
_USER_AGENT = "agent-server-webhooks/1"


@dataclass(frozen=True, slots=True)
class WebhookSecrets:
    """The signing keys: one per endpoint origin, and the default for the others."""

    default: bytes | None = None
    by_origin: Mapping[str, bytes] | None = None

    def __repr__(self) -> str:
        return "WebhookSecrets(<redacted>)"

    def key_for(self, url: str) -> bytes | None:
        """The key that signs messages to ``url``, or None when there is none."""
        if self.by_origin:
            key = self.by_origin.get(origin_of(url))
            if key is not None:
                return key
        return self.default

    @property
    def any(self) -> bool:
        return self.default is not None or bool(self.by_origin)


def backoff_delay(
    attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Seconds before the attempt after ``attempt`` (1-based): ``base · 2^(attempt-1)``,
    capped, the upper half of it random (so that many failed messages spread out)."""
    delay: float = min(cap, base * 2.0 ** min(attempt - 1, 30))
    return delay / 2 + rng() * delay / 2


@dataclass(frozen=True, slots=True)
class _Result:
    status_code: int | None
    error: str | None
    state: WebhookStatus | None  # None: retry if attempts remain


class WebhookSender:
    """Delivers the outbox's messages from this worker (``start``, ``wake``, ``aclose``)."""

    def __init__(
        self,
        store: Store,
        targets: WebhookTargets,
        keys: WebhookSecrets,
        *,
        max_attempts: int = 8,
        backoff: float = 5.0,
        backoff_max: float = 3600.0,
        timeout: float = 10.0,
        poll_interval: float = 2.0,
        retention: float = 7 * 86400.0,
        prune_interval: float = 600.0,
        metrics: Metrics | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._targets = targets
        self._keys = keys
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._backoff_max = backoff_max
        self._timeout = timeout
        self._poll_interval = poll_interval
        self._retention = retention
        self._prune_interval = prune_interval
        self._next_prune = 0.0  # a first prune at start: a restart after a long stop
        self._metrics = metrics
        self._clock = clock
        self._worker = secrets.token_hex(6)
        # no proxies from the environment (they would reach what the checks refused), no
        # redirects (see the module's docstring)
        self._client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_connections=_BATCH, max_keepalive_connections=4),
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the sender's task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="webhook-sender")

    def wake(self) -> None:
        """A message was queued: look at the outbox now, not at the next poll."""
        self._wake.set()

    async def aclose(self) -> None:
        """Stop the task (an attempt in flight is cut; its claim runs out) and close."""
        task, self._task = self._task, None
        await stop_task(task)
        await self._client.aclose()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                claimed = await self.deliver_due()
            except Exception:
                logger.warning("could not read the webhook outbox", exc_info=True)
                claimed = 0
            if self._clock() >= self._next_prune:
                try:
                    pruned = await self.prune()
                except Exception:
                    logger.warning("could not prune the webhook outbox", exc_info=True)
                    pruned = 0
                # a full batch: more are past their retention, look again at once
                wait = 0.0 if pruned >= _PRUNE_BATCH else self._prune_interval
                self._next_prune = self._clock() + wait
            if claimed >= _BATCH:
                continue  # more may be due
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._wake.wait()

    async def deliver_due(self) -> int:
        """Claim the messages due now and attempt each once; how many were claimed."""
        now = self._clock()
        claim = f"{self._worker}:{secrets.token_hex(6)}"
        batch = await self._store.claim_webhooks(
            claim, now=now, until=now + self._timeout + _CLAIM_MARGIN, limit=_BATCH
        )
        if batch:
            await asyncio.gather(*(self._attempt(claimed) for claimed in batch))
        return len(batch)

    async def prune(self) -> int:
        """Delete a batch of settled messages older than the retention; how many."""
        pruned = await self._store.prune_webhooks(
            before=self._clock() - self._retention, limit=_PRUNE_BATCH
        )
        if pruned:
            if self._metrics is not None:
                self._metrics.webhooks_pruned.inc(pruned)
            logger.info("webhook messages past their retention deleted", extra={"count": pruned})
        return pruned

    async def _attempt(self, claimed: ClaimedWebhook) -> None:
        message = claimed.message
        number = claimed.attempts + 1
        try:
            async with asyncio.timeout(self._timeout):
                result = await self._send(claimed)
        except TimeoutError:
            result = _Result(None, f"no answer within {self._timeout:g} s", None)
        state: WebhookStatus
        next_at = self._clock()
        if result.state is not None:
            state = result.state
        elif number >= self._max_attempts:
            state = "failed"
        else:
            state = "pending"
            next_at += backoff_delay(number, self._backoff, self._backoff_max)
        attempt = WebhookAttempt(number, self._clock(), result.status_code, result.error)
        recorded = await self._store.record_webhook_attempt(
            claimed, attempt, state=state, next_attempt_at=next_at
        )
        details = {
            "run_id": message.run_id,
            "webhook_id": message.id,
            "event": message.event_type,
            "attempt": number,
            "state": state,
            "status_code": result.status_code,
        }
        if recorded and self._metrics is not None:
            outcome = "retry" if state == "pending" else state
            self._metrics.webhook_attempts.labels(outcome).inc()
        if not recorded:
            logger.warning(
                "a webhook attempt's claim ran out before it was recorded", extra=details
            )
        elif state == "delivered":
            logger.info("webhook delivered", extra=details)
        else:
            logger.warning("webhook attempt failed: %s", result.error, extra=details)

    async def _send(self, claimed: ClaimedWebhook) -> _Result:
        message = claimed.message
        key = self._keys.key_for(message.url)
        if key is None:
            return _Result(None, "no signing secret for this endpoint", "failed")
        try:
            target = await self._targets.resolve(message.url)
        except TargetRefused as exc:
            return _Result(None, f"refused: {exc}", "failed")
        except TargetUnresolved as exc:
            return _Result(None, str(exc), None)
        body = message.body.encode("utf-8")
        timestamp = int(self._clock())
        headers = {
            "host": target.host_header,
            "content-type": "application/json",
            "user-agent": _USER_AGENT,
            "webhook-id": message.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, message.id, timestamp, body),
        }
        extensions = {"sni_hostname": target.host} if target.url.startswith("https:") else {}
        request = self._client.build_request(
            "POST", target.request_url, content=body, headers=headers, extensions=extensions
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            return _Result(None, f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc), None)
        # the answer's body is never read: a receiver says all with its status
        await response.aclose()
        code = response.status_code
        if 200 <= code < 300:
            return _Result(code, None, "delivered")
        if 300 <= code < 400:
            return _Result(code, "redirects are not followed", "failed")
        return _Result(code, f"the receiver answered {code}", None)
