"""Admission: slots, the FIFO queue, timeouts, the per-principal cap, closing."""

from __future__ import annotations

import asyncio

import pytest

from app.admission.slots import Admission, AdmissionRejected, QueueTimeout


async def test_slots_then_queue_then_refusal() -> None:
    changes: list[tuple[int, int]] = []
    admission = Admission(
        max_running=1, max_queued=1, on_change=lambda r, q: changes.append((r, q))
    )
    first = admission.reserve("a")
    assert first.granted
    second = admission.reserve("a")
    assert admission.queued == 1
    with pytest.raises(AdmissionRejected) as refused:
        admission.reserve("b")
    assert refused.value.reason == "overloaded"
    waiting = asyncio.ensure_future(second.wait(5))
    first.release()
    await waiting
    assert second.granted
    second.release()
    second.release()  # idempotent
    assert admission.running == 0 and admission.queued == 0 and admission.principals == 0
    assert changes[-1] == (0, 0)


async def test_queue_timeout() -> None:
    admission = Admission(max_running=1, max_queued=2)
    holder = admission.reserve("a")
    ticket = admission.reserve("b")
    with pytest.raises(QueueTimeout) as timed_out:
        await ticket.wait(0.01)
    assert timed_out.value.reason == "queue_timeout"
    ticket.release()
    assert admission.queued == 0
    holder.release()
    assert admission.running == 0


async def test_fifo_order() -> None:
    admission = Admission(max_running=1, max_queued=3)
    holder = admission.reserve("x")
    tickets = [admission.reserve(p) for p in "abc"]
    order: list[str] = []

    async def wait(ticket_index: int) -> None:
        ticket = tickets[ticket_index]
        await ticket.wait(5)
        order.append(ticket.principal)
        ticket.release()

    waiters = [asyncio.ensure_future(wait(i)) for i in (2, 0, 1)]
    holder.release()
    await asyncio.gather(*waiters)
    assert order == ["a", "b", "c"]


async def test_per_principal_cap() -> None:
    admission = Admission(max_running=10, max_queued=10, per_principal=2)
    tickets = [admission.reserve("alice"), admission.reserve("alice")]
    with pytest.raises(AdmissionRejected) as refused:
        admission.reserve("alice")
    assert refused.value.reason == "principal_limit"
    admission.reserve("bob").release()
    tickets[0].release()
    admission.reserve("alice").release()


async def test_close_flushes_the_queue_and_refuses() -> None:
    admission = Admission(max_running=1, max_queued=2)
    holder = admission.reserve("a")
    ticket = admission.reserve("b")
    waiting = asyncio.ensure_future(ticket.wait(5))
    admission.close("shutting down")
    with pytest.raises(AdmissionRejected) as flushed:
        await waiting
    assert flushed.value.reason == "draining"
    with pytest.raises(AdmissionRejected):
        admission.reserve("c")
    ticket.release()
    holder.release()
    assert admission.running == 0 and admission.principals == 0


async def test_abort_a_queued_ticket() -> None:
    admission = Admission(max_running=1, max_queued=2)
    holder = admission.reserve("a")
    ticket = admission.reserve("b")
    waiting = asyncio.ensure_future(ticket.wait(5))
    ticket.abort()
    with pytest.raises(AdmissionRejected) as aborted:
        await waiting
    assert aborted.value.reason == "aborted"
    ticket.release()
    holder.release()
    assert admission.queued == 0 and admission.principals == 0
