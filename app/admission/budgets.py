"""Token budgets per principal and per agent, per UTC day, checked when a run is admitted.

``AGENT_BUDGETS`` (``principal:alice=200000,agent:research=1000000,principal:*=50000``) and
an agent's ``tokens_per_day`` in ``AGENT_CONFIG`` set them; ``principal:*`` is every
principal's own budget unless one has a line of its own. A run must fit every budget that
applies to it (its principal's and its agent's).

How a run is counted: admission *reserves* ``AGENT_BUDGET_RESERVE_TOKENS`` on each of its
counters in one atomic step, refused when a counter would pass its budget; the run's end
replaces the reservation by the tokens it used. So the runs admitted at once never reserve
more than a budget, whichever workers admit them (with Redis the counters are shared and the
step is one script; without it they are this worker's memory). A refused run gets 429
``budget_exceeded`` with ``Retry-After`` at the window's reset (the next 00:00 UTC).

A run that has used up its reservation is charged as it goes: before each of its model calls
(``BudgetHold.draw``) its use so far is added to the counters, and if one of them has reached
its budget the run fails ``budget_exceeded`` instead of making the call. So a budget is
overrun by at most one model call's tokens per run in flight (the call that crossed it).

No storage round trip on the hot path: the counters live in memory or in Redis, seeded once
at start from the store's usage ledger (the day's finished runs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from agent_runtime.errors import RunError
from app.errors import BudgetExceeded

__all__ = [
    "BudgetCounters",
    "BudgetHold",
    "BudgetRules",
    "BudgetUsedUp",
    "Budgets",
    "LocalBudgetCounters",
    "day_window",
    "parse_budgets",
]

logger = logging.getLogger("app.admission.budgets")

_DAY: Final = 86_400.0


def parse_budgets(value: str) -> tuple[dict[str, int], dict[str, int]]:
    """``AGENT_BUDGETS`` as (principal budgets, agent budgets); ValueError names the entry."""
    principals: dict[str, int] = {}
    agents: dict[str, int] = {}
    for index, item in enumerate(value.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        target, sep, amount = item.partition("=")
        kind, colon, name = target.strip().partition(":")
        kind, name = kind.strip(), name.strip()
        if not sep or not colon or kind not in ("principal", "agent") or not name:
            raise ValueError(
                f"AGENT_BUDGETS entry {index} is not of the form principal:NAME=TOKENS or "
                "agent:NAME=TOKENS (principal:*=TOKENS for every principal)"
            )
        try:
            tokens = int(amount.strip())
        except ValueError:
            tokens = -1
        if tokens < 0:
            raise ValueError(f"AGENT_BUDGETS entry {index}: tokens must be an integer >= 0")
        table = principals if kind == "principal" else agents
        if name in table:
            raise ValueError(f"AGENT_BUDGETS entry {index} repeats {kind}:{name}")
        table[name] = tokens
    return principals, agents


def day_window(now: float) -> tuple[str, float]:
    """The UTC day of ``now`` (``YYYY-MM-DD``) and the seconds until it ends."""
    moment = datetime.fromtimestamp(now, UTC)
    start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    end = start + timedelta(days=1)
    return start.date().isoformat(), (end - moment).total_seconds()


@dataclass(frozen=True, slots=True)
class BudgetRules:
    """Tokens per UTC day, by principal (``*``: each principal without its own) and agent."""

    principals: Mapping[str, int] = field(default_factory=dict)
    agents: Mapping[str, int] = field(default_factory=dict)
    reserve: int = 1000
    """Tokens a run reserves on admission, replaced by its actual use at its end."""

    @property
    def enabled(self) -> bool:
        return bool(self.principals or self.agents)

    def charges(self, principal: str, agent: str) -> list[tuple[str, int]]:
        """The counters a run of ``principal`` on ``agent`` draws on: (name, budget)."""
        found: list[tuple[str, int]] = []
        limit = self.principals.get(principal, self.principals.get("*"))
        if limit is not None:
            found.append((f"principal:{principal}", limit))
        limit = self.agents.get(agent)
        if limit is not None:
            found.append((f"agent:{agent}", limit))
        return found


class BudgetCounters(Protocol):
    """The day's counters (used plus reserved tokens), local or shared."""

    async def reserve(
        self, day: str, charges: Sequence[tuple[str, int]], amount: int, ttl: float
    ) -> str | None:
        """Add ``amount`` to every counter of ``charges`` unless one would pass its budget:
        all or nothing, atomically. None when added; else the name of a full counter."""
        ...

    async def adjust(self, day: str, names: Sequence[str], delta: int, ttl: float) -> None:
        """Add ``delta`` (negative to give back) to each counter."""
        ...

    async def charge(
        self, day: str, charges: Sequence[tuple[str, int]], amount: int, ttl: float
    ) -> str | None:
        """Add ``amount`` to every counter of ``charges`` (tokens already spent: never
        refused); the name of a counter now at or past its budget, else None."""
        ...

    async def seed(self, day: str, used: Mapping[str, int], ttl: float) -> None:
        """Set counters that do not exist yet (this day's usage before this worker)."""
        ...


class LocalBudgetCounters:
    """This worker's counters, in memory (one worker, or workers that share nothing)."""

    def __init__(self) -> None:
        self._day = ""
        self._values: dict[str, int] = {}

    def _today(self, day: str) -> dict[str, int]:
        if day != self._day:
            self._day, self._values = day, {}
        return self._values

    async def reserve(
        self, day: str, charges: Sequence[tuple[str, int]], amount: int, ttl: float
    ) -> str | None:
        values = self._today(day)
        for name, limit in charges:
            if values.get(name, 0) + amount > limit:
                return name
        for name, _limit in charges:
            values[name] = values.get(name, 0) + amount
        return None

    async def charge(
        self, day: str, charges: Sequence[tuple[str, int]], amount: int, ttl: float
    ) -> str | None:
        await self.adjust(day, [name for name, _limit in charges], amount, ttl)
        for name, limit in charges:
            if await self.value(day, name) >= limit:
                return name
        return None

    async def adjust(self, day: str, names: Sequence[str], delta: int, ttl: float) -> None:
        if day < self._day:
            return  # that day's counters are gone: nothing to correct
        self._today(day)  # a new day's first count may be an adjustment (a resumed run's)
        for name in names:
            self._values[name] = self._values.get(name, 0) + delta

    async def seed(self, day: str, used: Mapping[str, int], ttl: float) -> None:
        values = self._today(day)
        for name, tokens in used.items():
            values.setdefault(name, tokens)

    async def value(self, day: str, name: str) -> int:
        """The counter's tokens (used and reserved) on ``day``; 0 if it has none."""
        return self._values.get(name, 0) if day == self._day else 0


class BudgetUsedUp(RunError):
    """A run stopped before a model call: one of its daily token budgets is used up."""

    code = "budget_exceeded"

    def __init__(self, budget: str, limit: int) -> None:
        super().__init__(
            f"the daily token budget of {budget} ({limit} tokens) is used up; the run stopped "
            "before its next model call (the budget resets at 00:00 UTC)"
        )
        self.budget = budget


class BudgetHold:
    """A run's reservation; ``draw`` (before each model call) charges what the run used past
    it, ``settle`` (once, at the run's end) replaces what was counted by the tokens the run
    used, ``release`` gives it back (a start undone)."""

    __slots__ = ("_budgets", "_done", "charges", "counted", "day", "reserved")

    def __init__(
        self, budgets: Budgets, day: str, charges: list[tuple[str, int]], reserved: int
    ) -> None:
        self._budgets = budgets
        self.day = day
        self.charges = charges
        self.reserved = reserved
        self.counted = reserved
        """The tokens the counters hold for this run: its reservation, then its use."""
        self._done = False

    @property
    def names(self) -> list[str]:
        """The counters the run draws on."""
        return [name for name, _limit in self.charges]

    async def draw(self, used: int) -> str | None:
        """Before a model call, with ``used`` the run's tokens so far: None to go on, or the
        name of a budget that is used up (within its reservation, no counter is touched)."""
        if self._done or used < self.counted:
            return None
        try:
            full = await self._budgets.counters.charge(
                self.day, self.charges, used - self.counted, 2 * _DAY
            )
        except Exception:
            # the counters are out of reach: the run goes on, and counts this at its end
            # (a charge made but not confirmed is then counted twice: the safe side)
            logger.warning("could not charge a run's token budget", extra={"budgets": self.names})
            return None
        self.counted = used
        return full

    async def settle(self, used: int) -> None:
        if self._done:
            return
        self._done = True
        delta = used - self.counted
        if delta:
            await self._budgets.adjust(self, delta)

    async def release(self) -> None:
        await self.settle(0)


class Budgets:
    """The admission check and accounting of the budgets (see the module docstring)."""

    def __init__(
        self,
        rules: BudgetRules,
        counters: BudgetCounters,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rules = rules
        self.counters = counters
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self.rules.enabled

    async def hold(self, principal: str, agent: str) -> BudgetHold | None:
        """Reserve for a run of ``principal`` on ``agent``; None when no budget applies.
        Raises ``BudgetExceeded`` (with ``retry_after`` at the window's reset)."""
        charges = self.rules.charges(principal, agent)
        if not charges:
            return None
        day, left = day_window(self._clock())
        amount = self.rules.reserve
        full = await self.counters.reserve(day, charges, amount, left + _DAY)
        if full is not None:
            limit = dict(charges)[full]
            resets = datetime.fromisoformat(day).replace(tzinfo=UTC) + timedelta(days=1)
            raise BudgetExceeded(
                f"the daily token budget of {full} ({limit} tokens) is used up; it resets at "
                "00:00 UTC",
                retry_after=max(1.0, left),
                extra={"budget": full, "limit": limit, "resets_at": resets.isoformat()},
            )
        return BudgetHold(self, day, charges, amount)

    def account(self, principal: str, agent: str) -> BudgetHold | None:
        """A hold that reserves and refuses nothing, for a run admitted earlier that goes on
        here (resumed): its end adds the tokens it used here. None when no budget applies."""
        charges = self.rules.charges(principal, agent)
        if not charges:
            return None
        day, _ = day_window(self._clock())
        return BudgetHold(self, day, charges, 0)

    async def adjust(self, hold: BudgetHold, delta: int) -> None:
        try:
            await self.counters.adjust(hold.day, hold.names, delta, 2 * _DAY)
        except Exception:
            # the run is over either way; its reservation stays counted (the safe side)
            logger.warning("could not settle a run's token budget", extra={"budgets": hold.names})

    def _budgeted(self, name: str) -> bool:
        kind, _, who = name.partition(":")
        if kind == "agent":
            return who in self.rules.agents
        return kind == "principal" and (
            who in self.rules.principals or "*" in self.rules.principals
        )

    async def seed(self, used: Mapping[str, int]) -> None:
        """This day's usage so far (``principal:NAME``/``agent:NAME`` → tokens)."""
        day, left = day_window(self._clock())
        wanted = {name: tokens for name, tokens in used.items() if self._budgeted(name)}
        if wanted:
            await self.counters.seed(day, wanted, left + _DAY)
