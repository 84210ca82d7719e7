"""``DependencyWatch``: a verdict with hysteresis, probe by probe."""

from __future__ import annotations

import asyncio

from app.server.readiness import DependencyWatch
from tests.support.waiting import wait_until


class Scripted:
    """A probe that fails, hangs or answers as told."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0
        self.called_twice = asyncio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls >= 2:
            self.called_twice.set()
        if self.mode == "fail":
            raise ConnectionRefusedError
        if self.mode == "hang":
            await asyncio.Event().wait()


async def test_down_after_two_failures_up_after_three_answers() -> None:
    probe = Scripted()
    watch = DependencyWatch({"Redis": probe}, timeout=0.05)
    await watch.probe_once()
    assert watch.problem == ""
    probe.mode = "fail"
    await watch.probe_once()
    assert watch.problem == ""  # one failure is not an outage
    probe.mode = "ok"
    await watch.probe_once()
    probe.mode = "fail"
    await watch.probe_once()
    assert watch.problem == ""  # failures must follow each other
    await watch.probe_once()
    assert watch.problem == "unreachable: Redis (ConnectionRefusedError)"
    probe.mode = "ok"
    for _ in range(2):
        await watch.probe_once()
        assert watch.problem  # not back at the first good answers
    await watch.probe_once()
    assert watch.problem == ""


async def test_a_probe_that_hangs_counts_as_a_failure_after_its_timeout() -> None:
    probe, other = Scripted(), Scripted()
    watch = DependencyWatch({"the store": probe, "Redis": other}, timeout=0.05)
    probe.mode = "hang"
    async with asyncio.timeout(1):
        await watch.probe_once()
        await watch.probe_once()
    assert watch.problem == "unreachable: the store (no answer within 0.05 s)"


async def test_it_probes_in_the_background_until_closed() -> None:
    probe = Scripted()
    probe.mode = "fail"
    watch = DependencyWatch({"Redis": probe}, interval=0.01, timeout=0.05)
    watch.start()
    async with asyncio.timeout(2):
        await probe.called_twice.wait()
    await wait_until(lambda: bool(watch.problem), within=2)  # the second round's verdict
    assert watch.problem
    await watch.aclose()
    rounds = watch.rounds
    await asyncio.sleep(0.05)
    assert watch.rounds == rounds
