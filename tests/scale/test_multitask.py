"""``multitask_strategy`` across two workers sharing Redis and PostgreSQL: each client talks
to its own worker, so queue order, cancels and supersessions all cross workers."""

from __future__ import annotations

from tests.support import multitask as cases
from tests.support.cluster import StartCluster


async def test_reject_is_the_default(start_cluster: StartCluster) -> None:
    one, two = start_cluster(2)
    async with one.client() as c1, two.client() as c2:
        await cases.reject_is_the_default(c1, c2)


async def test_enqueue_order_under_concurrent_posts(start_cluster: StartCluster) -> None:
    one, two = start_cluster(2)
    async with one.client() as c1, two.client() as c2:
        await cases.enqueue_runs_in_order(c1, c2)
        await cases.enqueue_blocking_waits_in_line(c1, c2)


async def test_enqueue_is_bounded_and_cancellable(start_cluster: StartCluster) -> None:
    one, two = start_cluster(2, {"AGENT_MAX_SESSION_QUEUE": "3"})
    async with one.client() as c1, two.client() as c2:
        await cases.enqueue_is_bounded_and_cancellable(c1, c2, 3)


async def test_interrupt_and_rollback(start_cluster: StartCluster) -> None:
    one, two = start_cluster(2)
    async with one.client() as c1, two.client() as c2:
        await cases.interrupt_keeps_a_stopped_turn(c1, c2)
        await cases.rollback_removes_the_turn(c1, c2)
