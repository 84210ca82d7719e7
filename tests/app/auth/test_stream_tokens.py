"""Stream tokens: the ``events_url`` credential of a browser's EventSource."""

from __future__ import annotations

import logging
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from app.auth.stream_tokens import StreamTokens
from app.errors import Unauthorized
from app.telemetry.logs import JsonFormatter
from tests.support.served import Serve, assert_problem
from tests.support.waiting import wait_until

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}


def token_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["token"][0]


def test_a_token_is_for_one_run_one_principal_and_a_while() -> None:
    tokens = StreamTokens(b"k" * 32, ttl=300)
    moment = time.time()
    token = tokens.issue("run_1", "alice", now=moment)
    assert tokens.principal(token, "run_1", now=moment + 299) == "alice"
    with pytest.raises(Unauthorized, match="expired"):
        tokens.principal(token, "run_1", now=moment + 301)
    with pytest.raises(Unauthorized):
        tokens.principal(token, "run_2", now=moment)
    with pytest.raises(Unauthorized):
        StreamTokens(b"x" * 32, ttl=300).principal(token, "run_1", now=moment)
    expiry, _, signature = token.split(".")
    forged = f"{expiry}.{StreamTokens(b'', 1).issue('run_1', 'bob').split('.')[1]}.{signature}"
    with pytest.raises(Unauthorized):
        tokens.principal(forged, "run_1", now=moment)
    for garbage in ("", "...", "x.y.z", "1.%%%.a"):
        with pytest.raises(Unauthorized):
            tokens.principal(garbage, "run_1", now=moment)


def test_tokens_are_masked_in_logs() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        '"%s %s"',
        ("GET", "/v1/runs/r/events?token=abc.d"),
        None,
    )
    line = JsonFormatter().format(record)
    assert "abc.d" not in line
    assert "token=[redacted]" in line


async def test_events_url_carries_a_token_that_reads_that_run_only(serve: Serve) -> None:
    async with serve(api_keys="ka=alice,kb=bob") as served:
        client = served.client
        started = await client.post(
            "/v1/sessions/tok/runs", json={"input": "hi", "background": True}, headers=ALICE
        )
        assert started.status_code == 202
        run_id = started.json()["run_id"]
        url = started.json()["events_url"]
        assert url.startswith(f"/v1/runs/{run_id}/events?token=")
        # no Authorization header: the token alone reads the run's events
        reader = served.request("GET", urlsplit(url).path, query=urlsplit(url).query)
        await reader.finish()
        assert reader.status == 200
        assert reader.events()[-1].event == "run.completed"
        # GET /v1/runs/{id} gives a fresh one
        view = (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()
        assert view["events_url"].startswith(f"/v1/runs/{run_id}/events?token=")

        other = await client.post(
            "/v1/sessions/tok2/runs", json={"input": "hi", "background": True}, headers=BOB
        )
        bobs_run = other.json()["run_id"]
        token = token_of(url)
        # alice's token is for her run only: not bob's, nor any other endpoint
        assert_problem(
            await client.get(f"/v1/runs/{bobs_run}/events", params={"token": token}),
            401,
            "unauthorized",
        )
        assert_problem(
            await client.get(f"/v1/runs/{run_id}", params={"token": token}), 401, "unauthorized"
        )
        assert_problem(
            await client.get("/v1/sessions/tok", params={"token": token}), 401, "unauthorized"
        )
        assert_problem(
            await client.get(f"/v1/runs/{run_id}/events", params={"token": "1.YQ.x"}),
            401,
            "unauthorized",
        )
        # bob's key does not read alice's run, token or not
        assert_problem(
            await client.get(f"/v1/runs/{run_id}/events", params={"token": token}, headers=BOB),
            404,
            "not_found",
        )
        await served.wait_idle()


async def test_an_expired_token_is_refused(serve: Serve) -> None:
    async with serve(api_keys="ka=alice", stream_token_ttl=0.5) as served:
        client = served.client
        started = await client.post(
            "/v1/sessions/old/runs", json={"input": "hi", "background": True}, headers=ALICE
        )
        url = started.json()["events_url"]
        expiry = int(token_of(url).split(".")[0])
        # the token's own clock, in whole seconds
        await wait_until(lambda: time.time() >= expiry)
        answer = await client.get(urlsplit(url).path, params={"token": token_of(url)})
        assert_problem(answer, 401, "unauthorized")
        assert "expired" in answer.json()["detail"]


async def test_without_authentication_events_url_has_no_token(serve: Serve) -> None:
    async with serve() as served:
        started = await served.client.post(
            "/v1/sessions/open/runs", json={"input": "hi", "background": True}
        )
        assert started.json()["events_url"] == f"/v1/runs/{started.json()['run_id']}/events"
        await served.wait_idle()
