"""A run resumed on another worker (or after a restart) is charged to its token budgets for
what it uses there: its first worker settled what it used before it was handed over."""

from __future__ import annotations

import time
from pathlib import Path

from agent_runtime import AgentCore
from agent_runtime.extensions.external import ExternalEvent
from app.admission.budgets import BudgetRules, Budgets, LocalBudgetCounters, day_window
from app.agents.build import load_config
from app.bus import LocalBus
from app.runs import RunManager, RunRequestOptions
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import Store, open_store
from tests.support.managers import run_manager
from tests.support.waiting import wait_until

RESERVE = 50


def manager(store: Store, budgets: Budgets, agent: AgentCore) -> RunManager:
    # a new process's bus: the first one's is gone with it
    bus = LocalBus()
    return run_manager(agent, store, bus, budgets=budgets, resume_runs=True, hand_over=True)


async def test_a_resumed_run_is_charged_what_it_uses_where_it_is_resumed(
    tmp_path: Path,
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/a.db")
    store = await open_store(settings.database_url)
    agent = await build_agent(settings, load_config(None))
    # counters both "processes" share, as on Redis
    budgets = Budgets(
        BudgetRules(principals={"*": 100_000}, reserve=RESERVE), LocalBudgetCounters()
    )
    counters = budgets.counters
    assert isinstance(counters, LocalBudgetCounters)

    async def charged() -> int:
        day, _ = day_window(time.time())
        return await counters.value(day, "principal:anonymous")

    first = manager(store, budgets, agent)
    handle = await first.start(
        "anonymous", "s1", RunRequestOptions(input="delete file-1.txt", background=True)
    )
    await wait_until(lambda: first.live_status(handle) == "waiting")
    assert await charged() == RESERVE
    first.begin_drain()  # the waiting run is handed over: parked, its reservation settled
    await handle.finished
    await first.drain(5)
    await first.aclose()
    checkpoint = await store.get_checkpoint(handle.run_id)
    assert checkpoint is not None and checkpoint.handover == "shutdown"
    before = checkpoint.data["usage"]["input_tokens"] + checkpoint.data["usage"]["output_tokens"]
    assert before > 0 and await charged() == before

    second = manager(store, budgets, agent)
    try:
        await second.recover()  # the restart resumes the parked run
        resumed = second.local(handle.run_id)
        assert resumed is not None
        await wait_until(lambda: second.live_status(resumed) == "waiting")
        (call,) = checkpoint.data["calls"]
        answered = await second.routing.external_event(
            "anonymous",
            "s1",
            handle.run_id,
            ExternalEvent(
                "confirmation_response", {"tool_call_id": call["call_id"], "approved": True}
            ),
        )
        assert answered == ["ConfirmationExtension"]
        await resumed.finished
        record = await store.get_run(handle.run_id)
        assert record is not None and record.status == "completed" and record.usage is not None
        total = record.usage["input_tokens"] + record.usage["output_tokens"]
        assert total > before  # the model was called again after the answer
        # each worker charged what it used: together, the run's tokens
        assert await charged() == total
    finally:
        await second.drain(5)
        await second.aclose()
        await agent.aclose()
        await store.close()
