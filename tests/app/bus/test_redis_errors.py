"""What a Redis call's failure becomes: BusUnavailable (a 503), whatever layer raised it."""

from __future__ import annotations

import pytest

from app.bus.base import BusUnavailable
from app.bus.redis.connection import unavailable


async def test_a_write_on_a_transport_the_server_closed_is_unavailable() -> None:
    # uvloop's RuntimeError for a connection Redis just closed (seen when Redis stops
    # accepting while a pooled connection is reused): the socket failed, not the code
    closed = "unable to perform operation on <TCPTransport closed=True reading=False>"
    with pytest.raises(BusUnavailable, match="taking a session lock"):
        async with unavailable("redis://127.0.0.1:1/0", "taking a session lock"):
            raise RuntimeError(f"{closed}; the handler is closed")


async def test_other_runtime_errors_are_not_hidden() -> None:
    with pytest.raises(RuntimeError, match="a bug"):
        async with unavailable("redis://127.0.0.1:1/0", "taking a session lock"):
            raise RuntimeError("a bug")
