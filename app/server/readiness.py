"""Whether the dependencies a worker cannot serve without answer: the store and the bus.

``DependencyWatch`` probes each one (``Store.ping``, ``Bus.ping``) once per ``interval``,
each probe bounded by ``timeout``, and keeps a verdict with hysteresis: a dependency is
*down* after ``fail_after`` failed probes in a row and *up* again only after
``recover_after`` good ones in a row, so a single slow answer does not flip readiness and a
dependency coming back does not flap it. ``/readyz`` answers 503 while any is down, so a load
balancer sends new work elsewhere; requests that need the dependency meanwhile fail fast with
503 ``unavailable`` on their own (each store and bus call is bounded by
``AGENT_BACKEND_TIMEOUT``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.tasks import stop_task

__all__ = ["DependencyWatch"]

logger = logging.getLogger("app.server.readiness")

Probe = Callable[[], Awaitable[object]]


@dataclass
class _State:
    probe: Probe
    down: bool = False
    failures: int = 0
    successes: int = 0
    last_error: str = ""


class DependencyWatch:
    """Probes named dependencies and says which are down (see the module docstring)."""

    def __init__(
        self,
        probes: dict[str, Probe],
        *,
        interval: float = 1.0,
        timeout: float = 2.0,
        fail_after: int = 2,
        recover_after: int = 3,
    ) -> None:
        self._states = {name: _State(probe) for name, probe in probes.items()}
        self._interval = interval
        self._timeout = timeout
        self._fail_after = fail_after
        self._recover_after = recover_after
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    @property
    def problem(self) -> str:
        """Empty while every dependency is up; else which are down, and why."""
        down = [
            f"{name} ({state.last_error})" for name, state in self._states.items() if state.down
        ]
        return f"unreachable: {', '.join(down)}" if down else ""

    def start(self) -> None:
        """Probe in the background until ``aclose``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    async def probe_once(self) -> None:
        """One round: every dependency probed at once."""
        await asyncio.gather(*(self._probe(name, state) for name, state in self._states.items()))
        self.rounds += 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.probe_once()
            await asyncio.sleep(max(0.0, self._interval - (loop.time() - started)))

    async def _probe(self, name: str, state: _State) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await state.probe()
        except TimeoutError:
            self._failed(name, state, f"no answer within {self._timeout:g} s")
        except Exception as exc:
            self._failed(name, state, type(exc).__name__)
        else:
            state.failures = 0
            state.successes += 1
            if state.down and state.successes >= self._recover_after:
                state.down = False
                logger.warning("%s is reachable again: ready", name, extra={"dependency": name})

    def _failed(self, name: str, state: _State, error: str) -> None:
        state.successes = 0
        state.failures += 1
        state.last_error = error
        if not state.down and state.failures >= self._fail_after:
            state.down = True
            logger.error(
                "%s is unreachable (%s): not ready until it answers again",
                name,
                error,
                extra={"dependency": name},
            )
