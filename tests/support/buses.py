"""Redis buses (workers) on one key prefix, and the wire events and reads the bus tests share."""

from __future__ import annotations

import asyncio
from typing import Any

from app.bus import WireEvent
from app.bus.redis import RedisBus
from app.bus.wire import WireEncoder
from tests.support.services import REDIS_URL


def event(seq: int, type_: str = "text.delta", run_id: str = "run_1") -> WireEvent:
    return WireEncoder(run_id, "s").encode(seq, type_, 0.0, {"delta": str(seq)})


class Buses:
    """Opens buses (workers) on one prefix; closes them all at the end."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.opened: list[RedisBus] = []

    async def open(self, url: str = REDIS_URL, **options: Any) -> RedisBus:
        values: dict[str, Any] = {"prefix": self.prefix, "lease_seconds": 5.0}
        values.update(options)
        bus = RedisBus(url, **values)
        await bus.start()
        self.opened.append(bus)
        return bus


async def read_until_finished(subscription: Any) -> list[int]:
    seqs: list[int] = []
    async with asyncio.timeout(10):
        while not subscription.finished:
            seqs.extend(e.seq for e in await subscription.next())
    return seqs
