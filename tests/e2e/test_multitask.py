"""``multitask_strategy`` on one worker (SQLite, the in-process bus), over real HTTP."""

from __future__ import annotations

from tests.support import multitask as cases
from tests.support.server import Launch, Server


async def test_reject_is_the_default(server: Server) -> None:
    async with server.client() as client:
        await cases.reject_is_the_default(client, client)


async def test_enqueue_runs_in_order(server: Server) -> None:
    async with server.client() as client:
        await cases.enqueue_runs_in_order(client, client)


async def test_enqueue_blocking_waits_in_line(server: Server) -> None:
    async with server.client() as client:
        await cases.enqueue_blocking_waits_in_line(client, client)


async def test_enqueue_is_bounded_and_cancellable(start_server: Launch) -> None:
    server = start_server({"AGENT_MAX_SESSION_QUEUE": "3"})
    async with server.client() as client:
        await cases.enqueue_is_bounded_and_cancellable(client, client, 3)


async def test_interrupt_keeps_a_stopped_turn(server: Server) -> None:
    async with server.client() as client:
        await cases.interrupt_keeps_a_stopped_turn(client, client)


async def test_rollback_removes_the_turn(server: Server) -> None:
    async with server.client() as client:
        await cases.rollback_removes_the_turn(client, client)
