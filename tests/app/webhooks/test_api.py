"""Webhooks through the HTTP API: a run's ``webhook_url`` (or its agent's), the 422 refusals,
and what a receiver on loopback gets for a run's end and its confirmation request."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from app.agents.config import ConfigError, load_config
from app.server.lifespan import open_webhooks
from app.storage import Store
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.support.served import MakeSettings, Serve

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
ON = {"webhook_secret": SECRET, "webhook_allow_private": True, "webhook_poll_interval": 0.05}


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    receiver = await WebhookReceiver(SECRET).start()
    try:
        yield receiver
    finally:
        await receiver.aclose()


def _problem(response: Any, code: str) -> str:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code
    detail: str = body["detail"]
    return detail


async def test_refused_without_a_secret(serve: Serve) -> None:
    async with serve() as served:
        response = await served.client.post(
            "/v1/sessions/w1/runs",
            json={"input": "hi", "stream": False, "webhook_url": "https://hooks.example.com/x"},
        )
        assert "AGENT_WEBHOOK_SECRET" in _problem(response, "webhook_url_refused")
        assert (await served.client.get("/v1/sessions/w1")).status_code == 404


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://localhost:8080/hooks", "loopback"),
        ("http://127.0.0.1/hooks", "loopback"),
        ("http://[::1]:9/hooks", "loopback"),
        ("http://[::ffff:127.0.0.1]/hooks", "loopback"),
        ("https://[2002:7f00:1::]/", "loopback (as 6to4 of 127.0.0.1)"),
        ("https://[2002:a9fe:a9fe::]/", "link-local (as 6to4 of 169.254.169.254)"),
        ("https://[64:ff9b::a9fe:a9fe]/", "link-local (as NAT64 of 169.254.169.254)"),
        ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "Teredo"),
        ("http://10.0.0.7/hooks", "private"),
        ("http://169.254.169.254/latest", "link-local"),
        ("http://user:pw@example.com/x", "credentials"),
    ],
)
async def test_refused_targets_are_422(serve: Serve, url: str, says: str) -> None:
    async with serve(webhook_secret=SECRET) as served:
        response = await served.client.post(
            "/v1/sessions/w2/runs", json={"input": "hi", "stream": False, "webhook_url": url}
        )
        detail = _problem(response, "webhook_url_refused")
        assert says in detail
        if says != "credentials":
            assert "AGENT_WEBHOOK_ALLOW_PRIVATE" in detail


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "0", "http://a b/c", "https://hé.example/x"]
)
async def test_malformed_urls_are_refused_by_the_schema(serve: Serve, url: str) -> None:
    async with serve(webhook_secret=SECRET) as served:
        response = await served.client.post(
            "/v1/sessions/w3/runs", json={"input": "hi", "stream": False, "webhook_url": url}
        )
        assert "webhook_url" in _problem(response, "validation_error")
        assert (await served.client.get("/v1/sessions/w3")).status_code == 404


async def test_a_run_end_is_posted_signed(serve: Serve, receiver: WebhookReceiver) -> None:
    async with serve(**ON) as served:
        response = await served.client.post(
            "/v1/sessions/w3/runs",
            json={"input": "hello", "stream": False, "webhook_url": receiver.url},
        )
        assert response.status_code == 200, response.text
        run_id = response.json()["run_id"]
        await receiver.wait_for(lambda r: len(r.deliveries) == 1)
        (request,) = receiver.requests
        assert request.verified
        body = request.json()
        assert body["type"] == "run.completed"
        data = body["data"]
        assert data["run_id"] == run_id and data["session_id"] == "w3"
        assert data["status"] == "completed" and data["agent"] == "default"
        assert data["output"]["content"] == "You said: hello"
        assert set(data["usage"]) >= {"input_tokens", "output_tokens"}
        await served.wait_idle()


async def test_confirmation_then_cancellation(serve: Serve, receiver: WebhookReceiver) -> None:
    async with serve(**ON) as served:
        response = await served.client.post(
            "/v1/sessions/w4/runs",
            json={"input": "delete notes.txt", "background": True, "webhook_url": receiver.url},
        )
        assert response.status_code == 202, response.text
        run_id = response.json()["run_id"]
        await receiver.wait_for(lambda r: len(r.deliveries) == 1)
        (asked,) = receiver.deliveries.values()
        assert asked["type"] == "run.confirmation_requested"
        assert asked["data"]["status"] == "waiting"
        confirmation = asked["data"]["confirmation"]
        assert confirmation["tool"] == "delete_file"
        assert confirmation["arguments"] == {"path": "notes.txt"}
        assert {"tool_call_id", "question", "expires_at"} <= set(confirmation)
        cancel = await served.client.post(f"/v1/runs/{run_id}/cancel")
        assert cancel.status_code == 202
        await receiver.wait_for(lambda r: len(r.deliveries) == 2)
        ended = list(receiver.deliveries.values())[1]
        assert ended["type"] == "run.cancelled"
        assert ended["data"]["reason"] == "cancel_requested"
        assert len(set(receiver.deliveries)) == 2  # two messages, two ids
        assert all(r.verified for r in receiver.requests)
        await served.wait_idle()


async def test_an_agents_own_webhook(
    serve: Serve, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    config = tmp_path / "agents.toml"
    config.write_text(f'[agents.hooked]\nwebhook_url = "{receiver.url}"\n', encoding="utf-8")
    async with serve(config=str(config), **ON) as served:
        response = await served.client.post(
            "/v1/sessions/w5/runs", json={"input": "hi", "agent": "hooked", "stream": False}
        )
        assert response.status_code == 200, response.text
        await receiver.wait_for(lambda r: len(r.deliveries) == 1)
        (body,) = receiver.deliveries.values()
        assert body["data"]["agent"] == "hooked"
        # a run of another agent has no webhook
        other = await served.client.post(
            "/v1/sessions/w6/runs", json={"input": "hi", "stream": False}
        )
        assert other.status_code == 200
        await served.wait_idle()
        assert await served.services.store.webhook_states(other.json()["run_id"]) == []
        assert len(receiver.requests) == 1


def test_an_agents_webhook_needs_a_secret(tmp_path: Path, make_settings: MakeSettings) -> None:
    config = tmp_path / "agents.toml"
    config.write_text('[agents.hooked]\nwebhook_url = "https://h.example.com/"\n', "utf-8")
    settings = make_settings(config=str(config))
    with pytest.raises(ConfigError, match=r"agents\.hooked\.webhook_url: no signing secret"):
        open_webhooks(settings, load_config(settings.config), cast(Store, None))


def test_an_agents_webhook_url_is_checked(tmp_path: Path) -> None:
    config = tmp_path / "agents.toml"
    config.write_text('[agents.hooked]\nwebhook_url = "ftp://h.example.com/"\n', "utf-8")
    with pytest.raises(ConfigError, match=r"agents\.hooked\.webhook_url"):
        load_config(str(config))


async def test_a_queued_runs_url_is_refused_before_it_queues(serve: Serve) -> None:
    async with serve(webhook_secret=SECRET) as served:
        first = await served.client.post(
            "/v1/sessions/w7/runs", json={"input": "slow one two", "background": True}
        )
        assert first.status_code == 202
        queued = await served.client.post(
            "/v1/sessions/w7/runs",
            json={
                "input": "next",
                "background": True,
                "multitask_strategy": "enqueue",
                "webhook_url": "http://localhost:1/hooks",
            },
        )
        assert "loopback" in _problem(queued, "webhook_url_refused")
        await served.client.post(f"/v1/runs/{first.json()['run_id']}/cancel")
        await served.wait_idle()
