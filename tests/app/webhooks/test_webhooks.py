"""The webhook outbox and sender on each real store, against a receiver on loopback.

Signatures are checked by the receiver with the Standard Webhooks reference library.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from app.storage import RunRecord, StaleFence, Store, WebhookMessage, WebhookState
from app.telemetry.metrics import Metrics
from app.webhooks.delivery import WebhookSecrets, WebhookSender, backoff_delay
from app.webhooks.messages import end_message
from app.webhooks.signing import parse_secret, sign
from app.webhooks.targets import WebhookTargets
from tests.fakes.tls_proxy import server_context
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.support.storage import OpenStore, open_backend_fixture, running_run, store_fixture
from tests.support.waiting import wait_for, wait_until

__all__ = ["open_backend_fixture", "store_fixture"]

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def keys() -> WebhookSecrets:
    return WebhookSecrets(default=parse_secret(SECRET))


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    receiver = await WebhookReceiver(SECRET).start()
    try:
        yield receiver
    finally:
        await receiver.aclose()


def sender(
    store: Store,
    *,
    allow_private: bool = True,
    max_attempts: int = 8,
    timeout: float = 5.0,
    **options: Any,
) -> WebhookSender:
    """A sender with short backoffs (0.01 s doubling to 0.05 s) and a quick poll."""
    return WebhookSender(
        store,
        WebhookTargets(allow_private=allow_private),
        keys(),
        max_attempts=max_attempts,
        backoff=0.01,
        backoff_max=0.05,
        timeout=timeout,
        poll_interval=0.05,
        **options,
    )


async def finished_run(store: Store, url: str, *, fence: int = 1) -> WebhookMessage:
    """A run of its own session, ended with the message of its end."""
    run_id = f"run_{secrets.token_hex(8)}"
    session_id = f"s-{run_id}"
    await store.get_or_create_session(session_id, "alice")
    await store.create_run(running_run(run_id, session_id))
    message = end_message(
        url,
        run_id=run_id,
        session_id=session_id,
        agent="default",
        event_type="run.completed",
        data={"output": {"content": "hi"}},
        status="completed",
    )
    await store.update_run(
        run_id, status="completed", output={"content": "hi"}, fence=fence, webhook=message
    )
    return message


async def settled(store: Store, run_id: str, state: str) -> WebhookState:
    """Wait until the run's one message is in ``state`` (as stored)."""

    async def reached() -> WebhookState | None:
        (found,) = await store.webhook_states(run_id)
        return found if found.state == state else None

    found: WebhookState = await wait_for(reached, within=10)
    return found


def test_signature_is_the_reference_algorithm() -> None:
    body = '{"type":"run.completed"}'
    timestamp = int(datetime.now(UTC).timestamp())
    ours = sign(parse_secret(SECRET), "msg_1", timestamp, body.encode())
    reference = Webhook(SECRET).sign("msg_1", datetime.fromtimestamp(timestamp, UTC), body)
    assert ours == reference
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(timestamp),
        "webhook-signature": ours,
    }
    Webhook(SECRET).verify(body, headers)


def test_backoff_grows_and_is_capped_with_jitter() -> None:
    assert [backoff_delay(n, 1.0, 8.0, lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 8]
    assert backoff_delay(3, 1.0, 8.0, lambda: 0.0) == 2.0  # the lower half is the floor


async def test_delivered_signed_once(store: Store, receiver: WebhookReceiver) -> None:
    message = await finished_run(store, receiver.url)
    webhooks = sender(store)
    webhooks.start()
    try:
        state = await settled(store, message.run_id, "delivered")
    finally:
        await webhooks.aclose()
    (request,) = receiver.requests
    assert request.verified and request.path == "/hooks"
    assert request.headers["host"] == f"127.0.0.1:{receiver.port}"
    body = request.json()
    assert body["type"] == "run.completed"
    assert body["data"]["run_id"] == message.run_id
    assert body["data"]["output"] == {"content": "hi"}
    assert [a.status_code for a in state.attempts] == [200]


async def test_retries_keep_the_id(store: Store, receiver: WebhookReceiver) -> None:
    receiver.answers = [500, 503]
    message = await finished_run(store, receiver.url)
    webhooks = sender(store)
    webhooks.start()
    try:
        state = await settled(store, message.run_id, "delivered")
    finally:
        await webhooks.aclose()
    assert [r.status for r in receiver.requests] == [500, 503, 200]
    assert {r.webhook_id for r in receiver.requests} == {message.id}
    assert all(r.verified for r in receiver.requests)
    # every attempt is signed anew (its own timestamp), over the same body
    assert len({r.body for r in receiver.requests}) == 1
    assert [a.status_code for a in state.attempts] == [500, 503, 200]
    assert [a.attempt for a in state.attempts] == [1, 2, 3]
    # a delivered message is never claimed again
    assert await store.claim_webhooks("x", now=1e12, until=1e12 + 1, limit=10) == []


def _count(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_attempts_are_counted_by_outcome(store: Store, receiver: WebhookReceiver) -> None:
    receiver.answers = [500, 503]
    metrics = Metrics()
    message = await finished_run(store, receiver.url)
    webhooks = sender(store, metrics=metrics)
    webhooks.start()
    try:
        await settled(store, message.run_id, "delivered")
    finally:
        await webhooks.aclose()
    total = "agent_webhook_attempts_total"
    assert _count(metrics, total, outcome="retry") == 2
    assert _count(metrics, total, outcome="delivered") == 1
    assert _count(metrics, total, outcome="failed") == 0


async def test_settled_messages_are_pruned_after_the_retention(
    store: Store, receiver: WebhookReceiver
) -> None:
    receiver.answers = [500]
    failed = await finished_run(store, receiver.url)
    webhooks = sender(store, max_attempts=1)
    webhooks.start()
    try:
        await settled(store, failed.run_id, "failed")
        delivered = await finished_run(store, receiver.url)
        await settled(store, delivered.run_id, "delivered")
    finally:
        await webhooks.aclose()
    pending = await finished_run(store, receiver.url)  # no sender runs: it stays pending
    # younger than the retention: kept
    assert await store.prune_webhooks(before=failed.created_at, limit=100) == 0
    assert await store.prune_webhooks(before=pending.created_at + 1, limit=1) == 1
    assert await store.prune_webhooks(before=pending.created_at + 1, limit=100) == 1
    assert await store.webhook_states(failed.run_id) == []
    assert await store.webhook_states(delivered.run_id) == []
    (kept,) = await store.webhook_states(pending.run_id)
    assert kept.state == "pending"  # never deleted before it settles
    assert await store.prune_webhooks(before=pending.created_at + 1, limit=100) == 0


async def test_the_sender_prunes_as_it_goes(store: Store, receiver: WebhookReceiver) -> None:
    metrics = Metrics()
    message = await finished_run(store, receiver.url)
    webhooks = sender(store, retention=1e-3, prune_interval=0.05, metrics=metrics)
    webhooks.start()

    async def delivered_and_pruned() -> bool:
        return bool(receiver.requests) and not await store.webhook_states(message.run_id)

    try:
        await wait_until(delivered_and_pruned, within=10)
    finally:
        await webhooks.aclose()
    assert [r.status for r in receiver.requests] == [200]
    assert _count(metrics, "agent_webhooks_pruned_total") == 1


async def test_a_repeat_of_a_delivered_message_is_deduplicated(
    store: Store, receiver: WebhookReceiver
) -> None:
    # the receiver acts on the first request but answers too late: the sender counts it as
    # failed and sends again, under the same id, which the receiver recognises
    receiver.delays = [2.0]
    message = await finished_run(store, receiver.url)
    webhooks = sender(store, timeout=0.3)
    webhooks.start()
    try:
        state = await settled(store, message.run_id, "delivered")
    finally:
        await webhooks.aclose()
    assert receiver.duplicates == 1
    assert [r.webhook_id for r in receiver.requests] == [message.id, message.id]
    assert list(receiver.deliveries) == [message.id]
    assert [a.status_code for a in state.attempts] == [None, 200]
    assert state.attempts[0].error == "no answer within 0.3 s"


async def test_gives_up_after_the_attempts(store: Store, receiver: WebhookReceiver) -> None:
    receiver.answers = [500] * 10
    message = await finished_run(store, receiver.url)
    webhooks = sender(store, max_attempts=3)
    webhooks.start()
    try:
        state = await settled(store, message.run_id, "failed")
    finally:
        await webhooks.aclose()
    assert [a.status_code for a in state.attempts] == [500, 500, 500]
    assert len(receiver.requests) == 3


async def test_a_name_resolving_to_loopback_is_a_failed_delivery(
    store: Store, receiver: WebhookReceiver
) -> None:
    # accepted when the run started (it resolved publicly then); now it resolves to loopback
    async def resolver(host: str, port: int) -> list[str]:
        assert host == "hooks.example.test"
        return ["127.0.0.1"]

    url = f"http://hooks.example.test:{receiver.port}/hooks"
    message = await finished_run(store, url)
    webhooks = WebhookSender(
        store, WebhookTargets(resolver=resolver), keys(), timeout=5.0, poll_interval=0.05
    )
    try:
        assert await webhooks.deliver_due() == 1
    finally:
        await webhooks.aclose()
    (state,) = await store.webhook_states(message.run_id)
    assert state.state == "failed"
    (attempt,) = state.attempts
    assert attempt.status_code is None
    assert attempt.error is not None and "loopback" in attempt.error
    assert receiver.requests == []


async def test_a_redirect_is_not_followed(store: Store, receiver: WebhookReceiver) -> None:
    target = await WebhookReceiver(SECRET).start()
    try:
        receiver.redirect_to = f"http://localhost:{target.port}/internal"
        message = await finished_run(store, receiver.url)
        webhooks = sender(store)
        try:
            assert await webhooks.deliver_due() == 1
        finally:
            await webhooks.aclose()
        (state,) = await store.webhook_states(message.run_id)
        assert state.state == "failed"
        assert [(a.status_code, a.error) for a in state.attempts] == [
            (307, "redirects are not followed")
        ]
        assert len(receiver.requests) == 1
        assert target.requests == []
    finally:
        await target.aclose()


async def test_https_goes_to_the_checked_address_with_the_hosts_name(
    store: Store, tmp_path: Path
) -> None:
    # the name resolves (through the hook) to the receiver's loopback address; TLS is
    # verified against the URL's host, which the connection to the bare address carries
    receiver = await WebhookReceiver(SECRET).start(
        tls=server_context(frozenset({"hooks.example.test"}), tmp_path)
    )
    resolved: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    webhooks = WebhookSender(
        store,
        WebhookTargets(allow_private=True, resolver=resolver),
        keys(),
        timeout=5.0,
        transport=httpx.AsyncHTTPTransport(verify=trust),
    )
    try:
        message = await finished_run(store, f"https://hooks.example.test:{receiver.port}/in")
        assert await webhooks.deliver_due() == 1
    finally:
        await webhooks.aclose()
        await receiver.aclose()
    (state,) = await store.webhook_states(message.run_id)
    assert [(a.status_code, a.error) for a in state.attempts] == [(200, None)]
    (request,) = receiver.requests
    assert request.verified and request.headers["host"] == f"hooks.example.test:{receiver.port}"
    assert resolved == ["hooks.example.test"]


async def test_the_message_is_written_with_the_runs_fenced_write(store: Store) -> None:
    run_id = "run_fenced"
    await store.get_or_create_session("s-fenced", "alice")
    await store.create_run(
        RunRecord(
            run_id=run_id,
            session_id="s-fenced",
            principal="alice",
            agent="default",
            input="hi",
            status="running",
        )
    )
    await store.update_run(run_id, status="running", fence=5)
    stale = end_message(
        "https://hooks.example.com/x",
        run_id=run_id,
        session_id="s-fenced",
        agent="default",
        event_type="run.failed",
        data={"error": {"code": "internal", "message": "x"}},
        status="failed",
    )
    with pytest.raises(StaleFence):
        await store.update_run(run_id, status="failed", fence=4, webhook=stale)
    assert await store.webhook_states(run_id) == []
    # the write that ends it queues it; a repeat of the end (a finished run) queues nothing
    await store.update_run(run_id, status="failed", fence=5, webhook=stale)
    await store.update_run(run_id, status="failed", fence=5, webhook=stale)
    (state,) = await store.webhook_states(run_id)
    assert state.message == stale and state.state == "pending"
    assert json.loads(state.message.body)["data"]["error"]["code"] == "internal"


async def test_many_senders_attempt_each_message_once(
    open_backend: OpenStore, receiver: WebhookReceiver
) -> None:
    stores = [await open_backend() for _ in range(3)]
    messages = [await finished_run(stores[0], receiver.url) for _ in range(24)]
    senders = [sender(store) for store in stores]
    try:
        claimed = await asyncio.gather(*(s.deliver_due() for s in senders))
        while sum(claimed) < len(messages):
            claimed += await asyncio.gather(*(s.deliver_due() for s in senders))
    finally:
        await asyncio.gather(*(s.aclose() for s in senders))
    assert sum(claimed) == len(messages)
    assert sorted(r.webhook_id for r in receiver.requests) == sorted(m.id for m in messages)
    assert receiver.duplicates == 0
