"""``/v1/schedules`` over HTTP: the answers, their codes, and ownership."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.support.served import Serve, assert_problem

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
KEYS = "key-alice=alice,key-bob=bob"


def _future(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat()


async def _create(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/v1/schedules", json={"input": "report", "cron": "0 9 * * *", **body}, headers=ALICE
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert response.headers["location"] == f"/v1/schedules/{created['schedule_id']}"
    return created


async def test_create_read_change_delete(serve: Serve) -> None:
    async with serve(api_keys=KEYS, scheduler_enabled=False) as served:
        client = served.client
        created = await _create(client, timezone="Europe/Berlin", end_after=3, misfire="run_once")
        assert created["schedule_id"].startswith("sch_")
        assert (created["cron"], created["timezone"], created["end_after"]) == (
            "0 9 * * *",
            "Europe/Berlin",
            3,
        )
        assert created["misfire"] == "run_once"
        assert created["firings"] == []
        due = datetime.fromisoformat(created["next_due_at"].replace("Z", "+00:00"))
        assert due > datetime.now(UTC)
        assert due.hour in (7, 8)  # 09:00 in Berlin
        path = f"/v1/schedules/{created['schedule_id']}"

        listed = (await client.get("/v1/schedules", headers=ALICE)).json()["schedules"]
        assert [s["schedule_id"] for s in listed] == [created["schedule_id"]]
        got = await client.get(path, headers=ALICE)
        assert got.status_code == 200
        assert got.json()["firings"] == []

        at = _future(hours=2)
        patched = await client.patch(
            path, json={"at": at, "input": "once", "paused": True}, headers=ALICE
        )
        assert patched.status_code == 200, patched.text
        view = patched.json()
        assert (view["cron"], view["input"], view["paused"]) == (None, "once", True)
        assert datetime.fromisoformat(view["at"].replace("Z", "+00:00")) == datetime.fromisoformat(
            at
        )

        assert (await client.delete(path, headers=ALICE)).status_code == 204
        assert_problem(await client.get(path, headers=ALICE), 404, "not_found")
        assert_problem(await client.delete(path, headers=ALICE), 404, "not_found")


async def test_another_principal_gets_404(serve: Serve) -> None:
    async with serve(api_keys=KEYS, scheduler_enabled=False) as served:
        client = served.client
        created = await _create(client)
        path = f"/v1/schedules/{created['schedule_id']}"
        assert_problem(await client.get(path, headers=BOB), 404, "not_found")
        assert_problem(
            await client.patch(path, json={"input": "mine"}, headers=BOB), 404, "not_found"
        )
        assert_problem(await client.delete(path, headers=BOB), 404, "not_found")
        assert (await client.get("/v1/schedules", headers=BOB)).json() == {"schedules": []}
        assert (await client.get(path, headers=ALICE)).json()["input"] == "report"
        # a session of another principal cannot be scheduled into
        await client.post(
            "/v1/sessions/bobs/runs", json={"input": "hi", "stream": False}, headers=BOB
        )
        refused = await client.post(
            "/v1/schedules",
            json={"input": "x", "cron": "* * * * *", "session_id": "bobs"},
            headers=ALICE,
        )
        assert_problem(refused, 404, "not_found")
        assert_problem(await client.get("/v1/schedules/nope", headers=ALICE), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"cron": "61 * * * *"}, "invalid_cron"),
        ({"cron": "every day"}, "invalid_cron"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown_timezone"),
        ({"cron": "0 9 * * *", "timezone": "localtime"}, "unknown_timezone"),
        ({"cron": "0 9 * * *", "timezone": "posixrules"}, "unknown_timezone"),
        ({"cron": "0 9 * * *", "timezone": "Factory"}, "unknown_timezone"),
        ({"cron": "* * * * * *"}, "cron_too_frequent"),
        ({"cron": "*/30 * * * * *"}, "cron_too_frequent"),
        ({"cron": "0 0 31 2 *"}, "cron_never_fires"),
        ({"at": "2001-01-01T00:00:00Z"}, "schedule_in_past"),
        ({"cron": "0 9 * * *", "end_after": "2001-01-01T00:00:00Z"}, "schedule_in_past"),
        ({}, "schedule_timing"),
        ({"cron": "0 9 * * *", "at": "2999-01-01T00:00:00Z"}, "schedule_timing"),
        ({"cron": "0 9 * * *", "agent": "nobody"}, "unknown_agent"),
        ({"cron": "0 9 * * *", "end_after": 0}, "validation_error"),
        ({"cron": "0 9 * * *", "end_after": True}, "validation_error"),
        ({"cron": "0 9 * * *", "misfire": "later"}, "validation_error"),
        ({"cron": "0 9 * * *", "session_id": "a b"}, "validation_error"),
        ({"cron": "0 9 * * *", "colour": "red"}, "validation_error"),
        ({"cron": "0 9 * * *", "input": "nul\u0000"}, "validation_error"),
    ],
)
async def test_bad_input_is_422_with_a_code(serve: Serve, body: dict[str, Any], code: str) -> None:
    async with serve(scheduler_enabled=False) as served:
        response = await served.client.post("/v1/schedules", json={"input": "x", **body})
        assert_problem(response, 422, code)


async def test_bad_patches(serve: Serve) -> None:
    async with serve(scheduler_enabled=False) as served:
        client = served.client
        created = (
            await client.post("/v1/schedules", json={"input": "x", "cron": "* * * * *"})
        ).json()
        path = f"/v1/schedules/{created['schedule_id']}"
        for body, code in [
            ({"cron": "nope"}, "invalid_cron"),
            ({"timezone": "Nowhere/City"}, "unknown_timezone"),
            ({"timezone": "localtime"}, "unknown_timezone"),
            ({"cron": "* * * * * *"}, "cron_too_frequent"),
            ({"cron": "0 0 30 2 *"}, "cron_never_fires"),
            ({"cron": "* * * * *", "at": _future(hours=1)}, "schedule_timing"),
            ({"input": None}, "validation_error"),
            ({"agent": "other"}, "validation_error"),
            ({"at": "2001-01-01T00:00:00Z"}, "schedule_in_past"),
        ]:
            assert_problem(await client.patch(path, json=body), 422, code)
        unchanged = (await client.get(path)).json()
        assert unchanged["cron"] == "* * * * *"


async def test_a_principal_has_at_most_the_cap_of_schedules(serve: Serve) -> None:
    async with serve(
        scheduler_enabled=False, scheduler_max_per_principal=3, api_keys=KEYS
    ) as served:
        client = served.client
        made = [await _create(client) for _ in range(3)]
        refused = await client.post(
            "/v1/schedules", json={"input": "x", "cron": "0 9 * * *"}, headers=ALICE
        )
        assert_problem(refused, 422, "too_many_schedules")
        assert "AGENT_SCHEDULER_MAX_PER_PRINCIPAL" in refused.json()["detail"]
        # the cap is each principal's own
        other = await client.post(
            "/v1/schedules", json={"input": "x", "cron": "0 9 * * *"}, headers=BOB
        )
        assert other.status_code == 201, other.text
        # a deletion makes room again
        deleted = await client.delete(f"/v1/schedules/{made[0]['schedule_id']}", headers=ALICE)
        assert deleted.status_code == 204
        await _create(client)
        listed = (await client.get("/v1/schedules", headers=ALICE)).json()["schedules"]
        assert len(listed) == 3


async def test_the_minimum_interval_is_a_setting(serve: Serve) -> None:
    async with serve(scheduler_enabled=False, scheduler_min_interval=3600) as served:
        hourly = await served.client.post("/v1/schedules", json={"input": "x", "cron": "0 * * * *"})
        assert hourly.status_code == 201, hourly.text
        response = await served.client.post(
            "/v1/schedules", json={"input": "x", "cron": "*/30 * * * *"}
        )
        assert_problem(response, 422, "cron_too_frequent")
        assert "1800 s apart" in response.json()["detail"]


async def test_a_schedule_fires_on_a_running_server(serve: Serve) -> None:
    async with serve(scheduler_poll_interval=0.05, scheduler_min_interval=1) as served:
        client = served.client
        created = (
            await client.post(
                "/v1/schedules",
                json={"input": "tick", "cron": "* * * * * *", "end_after": 2},
            )
        ).json()
        path = f"/v1/schedules/{created['schedule_id']}"
        view: dict[str, Any] = {}

        async def fired_twice() -> bool:
            nonlocal view
            view = (await client.get(path)).json()
            return [f["status"] for f in view["firings"]] == ["started", "started"]

        from tests.support.waiting import wait_until

        await wait_until(fired_twice)
        assert view["next_due_at"] is None
        assert view["fired_count"] == 2
        for firing in view["firings"]:
            run = (await client.get(f"/v1/runs/{firing['run_id']}")).json()
            assert run["status"] in ("queued", "running", "completed")


async def test_the_openapi_document_describes_the_schedules(serve: Serve) -> None:
    async with serve(scheduler_enabled=False) as served:
        document = (await served.client.get("/openapi.json")).json()
    paths = document["paths"]
    assert {"201", "404", "422"} <= set(paths["/v1/schedules"]["post"]["responses"])
    assert "200" in paths["/v1/schedules"]["get"]["responses"]
    one = paths["/v1/schedules/{schedule_id}"]
    assert {"200", "404"} <= set(one["get"]["responses"])
    assert {"200", "404", "422"} <= set(one["patch"]["responses"])
    assert {"204", "404"} <= set(one["delete"]["responses"])
    patch = document["components"]["schemas"]["SchedulePatch"]["properties"]
    assert patch["misfire"].get("type") == "string"  # null is not a value (leave it out)
    create = document["components"]["schemas"]["ScheduleCreate"]["properties"]
    assert create["end_after"]["anyOf"][0] == {
        "maximum": 1_000_000_000,
        "minimum": 1,
        "type": "integer",
    }
