"""Usage accounting (``GET /v1/usage``) and daily token budgets, in process and on Redis."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.admission.budgets import (
    BudgetRules,
    Budgets,
    LocalBudgetCounters,
    day_window,
    parse_budgets,
)
from app.bus.redis import RedisBus
from app.errors import BudgetExceeded
from app.settings import Settings
from tests.support.served import Serve, Served
from tests.support.services import REDIS_URL, drop_prefix, new_prefix

# the demo model's answer to "hello there": 2 input and 4 output tokens
RUN_TOKENS = 6


async def run(served: Served, session: str, key: str | None = None, **body: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else None
    return await served.client.post(
        f"/v1/sessions/{session}/runs",
        json={"input": "hello there", "stream": False, **body},
        headers=headers,
    )


def test_budgets_are_parsed_and_bad_entries_named() -> None:
    assert parse_budgets(" principal:alice=100, agent:research=5 ,principal:*=7,") == (
        {"alice": 100, "*": 7},
        {"research": 5},
    )
    for bad, said in [
        ("alice=100", "entry 1 is not of the form"),
        ("principal:alice=100,team:x=1", "entry 2 is not of the form"),
        ("agent:a=-1", "entry 1: tokens must be an integer >= 0"),
        ("agent:a=many", "entry 1: tokens must be an integer >= 0"),
        ("agent:a=1,agent:a=2", "entry 2 repeats agent:a"),
    ]:
        with pytest.raises(ValueError, match=said):
            parse_budgets(bad)
    with pytest.raises(ValidationError, match="AGENT_BUDGETS entry 1"):
        Settings(budgets="nonsense")


def test_the_window_is_the_utc_day() -> None:
    moment = datetime(2026, 12, 2, 23, 59, 30, tzinfo=UTC).timestamp()
    assert day_window(moment) == ("2026-12-02", 30.0)


async def test_reservations_never_pass_a_budget_and_settle_to_the_use() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()
    rules = BudgetRules(principals={"*": 100, "bob": 10}, agents={"big": 1000}, reserve=30)
    budgets = Budgets(rules, LocalBudgetCounters(), clock=lambda: now)
    holds = [await budgets.hold("alice", "big") for _ in range(3)]
    with pytest.raises(BudgetExceeded) as refused:
        await budgets.hold("alice", "big")  # 90 reserved: 30 more would pass 100
    assert refused.value.retry_after == 12 * 3600
    assert refused.value.extra == {
        "budget": "principal:alice",
        "limit": 100,
        "resets_at": "2026-12-03T00:00:00+00:00",
    }
    # the agent's counter was not charged by the refused run
    assert (await budgets.counters.reserve("2026-12-02", [("agent:big", 1000)], 0, 1)) is None
    first = holds[0]
    assert first is not None
    await first.settle(5)  # used 5 of its 30: 25 back
    await first.settle(500)  # once only
    assert await budgets.hold("alice", "big") is not None  # 65 + 30 <= 100
    with pytest.raises(BudgetExceeded, match="principal:bob"):
        await budgets.hold("bob", "big")  # its own line: 30 > 10
    assert await budgets.hold("carol", "small") is not None  # principal:* only
    assert (
        Budgets(BudgetRules(agents={"x": 1}), LocalBudgetCounters()).rules.charges("alice", "y")
        == []
    )


async def test_a_resumed_run_s_hold_reserves_and_refuses_nothing() -> None:
    clock = [datetime(2026, 12, 2, 23, 59, tzinfo=UTC).timestamp()]
    rules = BudgetRules(principals={"*": 10}, reserve=10)
    budgets = Budgets(rules, LocalBudgetCounters(), clock=lambda: clock[0])
    assert await budgets.hold("alice", "a") is not None  # the day's budget, all reserved
    resumed = budgets.account("alice", "a")
    assert resumed is not None and resumed.reserved == 0  # admitted before: never refused
    counters = budgets.counters
    assert isinstance(counters, LocalBudgetCounters)
    assert await counters.value("2026-12-02", "principal:alice") == 10
    clock[0] += 120  # past midnight: a new day, whose first count is the resumed run's use
    late = budgets.account("alice", "a")
    assert late is not None and late.day == "2026-12-03"
    await late.settle(4)
    assert await counters.value("2026-12-03", "principal:alice") == 4
    assert Budgets(BudgetRules(agents={"a": 1}), LocalBudgetCounters()).account("p", "b") is None


async def test_a_run_over_its_budget_gets_429_until_the_reset(serve: Serve) -> None:
    budgets = "principal:alice=20,agent:capped=1000000"
    async with serve(
        api_keys="key-a=alice,key-b=bob", budgets=budgets, budget_reserve_tokens=RUN_TOKENS
    ) as served:
        for index in range(3):  # 3 x 6 tokens; a 4th reservation (18 + 6) would pass 20
            answer = await run(served, f"a{index}", "key-a")
            assert answer.status_code == 200, answer.text
            assert (
                answer.json()["usage"]["input_tokens"] + answer.json()["usage"]["output_tokens"]
                == RUN_TOKENS
            )
        refused = await run(served, "a3", "key-a")
        assert refused.status_code == 429
        problem = refused.json()
        assert problem["code"] == "budget_exceeded"
        assert (problem["budget"], problem["limit"]) == ("principal:alice", 20)
        _day, left = day_window(datetime.now(UTC).timestamp())
        assert 0 < int(refused.headers["retry-after"]) <= left + 1
        assert problem["resets_at"].endswith("T00:00:00+00:00")
        # nothing was stored for the refused run: no session left behind
        assert (
            await served.client.get("/v1/sessions/a3", headers=auth("key-a"))
        ).status_code == 404
        # another principal has no budget of its own
        assert (await run(served, "b0", "key-b")).status_code == 200
        metrics = (await served.client.get("/metrics")).text
        assert 'agent_runs_rejected_total{reason="budget_exceeded"} 1.0' in metrics
        await served.wait_idle()


async def test_a_run_past_its_budget_stops_before_its_next_model_call(serve: Serve) -> None:
    # "what time is it": a model call of 5 tokens (asks for the time), a tool call, then a
    # model call of 9 tokens (answers). Admitted with a reservation of 1 of the 5 left, the run
    # uses the 5 in its first call and is stopped before its second one.
    async with serve(
        api_keys="key-a=alice", budgets="principal:alice=5", budget_reserve_tokens=1
    ) as served:
        answer = await run(served, "t0", "key-a", input="what time is it")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "failed"
        assert body["error"]["code"] == "budget_exceeded"
        assert "principal:alice" in body["error"]["message"]
        assert body["usage"]["input_tokens"] + body["usage"]["output_tokens"] == 5
        usage = (await served.client.get("/v1/usage", headers=auth("key-a"))).json()
        assert usage["total"]["total_tokens"] == 5  # the run's use, no more
        events = (
            await served.client.get(f"/v1/runs/{body['run_id']}/events", headers=auth("key-a"))
        ).text
        assert events.count("event: usage") == 1  # the second model call was never made
        assert (await run(served, "t1", "key-a")).status_code == 429
        await served.wait_idle()


async def test_a_run_goes_on_while_its_budget_has_tokens_left(serve: Serve) -> None:
    # 6 left after the first call's 5: the second call is made, and the budget is overrun by
    # less than that one call's tokens (14 of 6)
    async with serve(budgets="principal:*=6", budget_reserve_tokens=1) as served:
        answer = await run(served, "t2", input="what time is it")
        body = answer.json()
        assert body["status"] == "completed", body
        assert body["usage"]["input_tokens"] + body["usage"]["output_tokens"] == 14
        await served.wait_idle()


async def test_a_hold_draws_only_past_its_reservation() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()
    rules = BudgetRules(principals={"*": 100}, agents={"big": 50}, reserve=30)
    counters = LocalBudgetCounters()
    budgets = Budgets(rules, counters, clock=lambda: now)
    hold = await budgets.hold("alice", "big")
    assert hold is not None
    assert await hold.draw(29) is None  # within the reservation: nothing charged
    assert await counters.value("2026-12-02", "agent:big") == 30
    assert await hold.draw(45) is None  # 15 more: 45 of 50
    assert await counters.value("2026-12-02", "agent:big") == 45
    assert await hold.draw(50) == "agent:big"  # 50 of 50: nothing left for another call
    await hold.settle(52)  # its end counts the rest of what it used
    assert await counters.value("2026-12-02", "agent:big") == 52
    assert await counters.value("2026-12-02", "principal:alice") == 52


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_usage_is_reported_by_agent_principal_and_day(serve: Serve) -> None:
    async with serve(api_keys="key-a=alice,key-b=bob") as served:
        for session in ("u1", "u2"):
            assert (await run(served, session, "key-a")).status_code == 200
        assert (await run(served, "u3", "key-b")).status_code == 200
        report = await served.client.get("/v1/usage", headers=auth("key-a"))
        assert report.status_code == 200, report.text
        body = report.json()
        assert (body["principal"], body["group_by"]) == ("alice", "agent")
        row = {"input_tokens": 4, "output_tokens": 8, "total_tokens": 12, "runs": 2}
        assert body["usage"] == [{"agent": "default", **row}]
        assert body["total"] == row
        assert body["from"].endswith("T00:00:00.000Z")
        today = datetime.now(UTC).date().isoformat()
        by_day = await served.client.get(
            "/v1/usage", params={"group_by": "day", "from": today}, headers=auth("key-a")
        )
        assert by_day.json()["usage"] == [{"day": today, **row}]
        # the caller's usage only, also by principal
        mine = await served.client.get(
            "/v1/usage", params={"group_by": "principal"}, headers=auth("key-b")
        )
        assert [r["principal"] for r in mine.json()["usage"]] == ["bob"]
        # a session deleted keeps its usage
        assert (
            await served.client.delete("/v1/sessions/u1", headers=auth("key-a"))
        ).status_code == 204
        again = await served.client.get("/v1/usage", headers=auth("key-a"))
        assert again.json()["total"] == row
        # a window before any run
        empty = await served.client.get(
            "/v1/usage", params={"from": "2020-01-01", "to": "2020-01-02"}, headers=auth("key-a")
        )
        assert empty.json()["usage"] == [] and empty.json()["total"]["runs"] == 0
        # an empty window, and a long one (the whole ledger is indexed by time)
        backwards = {"from": "2026-12-02", "to": "2026-12-01"}
        assert (
            await served.client.get("/v1/usage", params=backwards, headers=auth("key-a"))
        ).json()["usage"] == []
        years = {"from": "2000-01-01", "to": "2100-01-01"}
        long = await served.client.get("/v1/usage", params=years, headers=auth("key-a"))
        assert long.json()["total"] == row
        for params in (
            {"group_by": "model"},
            {"from": "yesterday"},
            {"to": "0.5"},  # not Unix time: ISO 8601 only
        ):
            bad = await served.client.get("/v1/usage", params=params, headers=auth("key-a"))
            assert bad.status_code == 422, params
            assert bad.json()["code"] == "validation_error"
        assert (await served.client.get("/v1/usage")).status_code == 401


async def test_a_restart_keeps_the_days_usage_against_the_budget(serve: Serve) -> None:
    settings = {"budgets": "principal:*=15", "budget_reserve_tokens": RUN_TOKENS}
    async with serve(**settings) as served:
        assert (await run(served, "r0")).status_code == 200
        assert (await run(served, "r1")).status_code == 200
        assert (await run(served, "r2")).status_code == 429  # 12 + 6 > 15
    # a new worker on the same database: seeded from the usage ledger, not from zero
    async with serve(**settings) as served:
        assert (await run(served, "r3")).status_code == 429


async def test_an_agents_tokens_per_day_from_the_file(serve: Serve, tmp_path: Path) -> None:
    config = tmp_path / "agents.toml"
    config.write_text("[agents.capped]\ntokens_per_day = 10\n", encoding="utf-8")
    async with serve(config=str(config), budget_reserve_tokens=RUN_TOKENS) as served:
        assert (await run(served, "c0", agent="capped")).status_code == 200
        refused = await run(served, "c1", agent="capped")
        assert refused.status_code == 429
        assert refused.json()["budget"] == "agent:capped"
        assert (await run(served, "d0")).status_code == 200  # the default agent has none


@pytest.mark.redis
async def test_workers_racing_on_redis_never_reserve_more_than_the_budget() -> None:
    prefix = new_prefix()
    buses = [RedisBus(REDIS_URL, prefix=prefix, lease_seconds=5.0) for _ in range(2)]
    try:
        for bus in buses:
            await bus.start()
        rules = BudgetRules(principals={"*": 100}, reserve=7)
        budgets = [Budgets(rules, bus.budget_counters()) for bus in buses]

        async def attempt(index: int) -> bool:
            try:
                await budgets[index % 2].hold("alice", "default")
            except BudgetExceeded:
                return False
            return True

        outcomes = await asyncio.gather(*(attempt(i) for i in range(60)))
        assert sum(outcomes) == 100 // 7  # 14 x 7 = 98; a 15th would pass 100
        day, _left = day_window(datetime.now(UTC).timestamp())
        assert await buses[0].budget_counters().value(day, "principal:alice") == 98
        # a seed never overwrites the shared counter another worker already keeps
        await budgets[1].seed({"principal:alice": 5})
        assert await buses[1].budget_counters().value(day, "principal:alice") == 98
        # a run past its reservation is charged whatever is left, and told the budget is up
        counters = buses[0].budget_counters()
        charges = [("principal:alice", 100), ("agent:default", 1000)]
        assert await counters.charge(day, charges, 1, 60) is None  # 99 of 100
        assert await counters.charge(day, charges, 5, 60) == "principal:alice"  # 104
        assert await counters.value(day, "principal:alice") == 104
        assert await counters.value(day, "agent:default") == 6
    finally:
        for bus in buses:
            await bus.aclose()
        drop_prefix(prefix)
