"""When a schedule is due: cron expressions on a zone's wall clock, one-time moments, ends.

A cron expression is read on the local wall clock of the schedule's IANA zone (``zoneinfo``),
so ``0 9 * * *`` in ``Europe/Berlin`` fires at 09:00 Berlin time in summer and in winter. The
two wall-clock times that a change of offset makes odd follow one rule each:

- a local time that does not exist (the spring-forward gap, 02:30 on the last Sunday of March
  in Berlin) fires once, at the first instant after the gap (03:00 CEST); several times inside
  one gap make one firing;
- a local time that happens twice (the fall-back hour, 02:30 on the last Sunday of October)
  fires once, at its first occurrence (02:30 CEST); the repeated hour does not fire again.

Due times are instants (UTC), strictly increasing: a schedule never fires twice for one
instant. Parsing uses croniter; its errors become ``InvalidRequest`` here, in one place.

What a cron expression may ask is bounded: the shortest wall-clock time between two of its
firings is at least ``min_interval`` seconds (a gap a DST change shortens is not counted), and
it fires at least once within ``MAX_YEARS_TO_FIRST`` years (``0 0 31 2 *`` never does). A zone
is a name of the tz database (``zoneinfo.available_timezones()``) other than the names that are
not zones: ``localtime`` (the host's own setting), ``posixrules`` (a POSIX default rule) and
``Factory`` (a placeholder).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadDateError, CroniterError, croniter

from app.errors import InvalidRequest

__all__ = [
    "MAX_MISSED_COUNTED",
    "MAX_YEARS_TO_FIRST",
    "Timing",
    "parse_timing",
    "zone_of",
]

MAX_MISSED_COUNTED: Final = 10_000
"""How many missed due times a restart counts at most (the count is informative only)."""

_MINUTE: Final = timedelta(minutes=1)
# a gap is at most a few hours long (the largest on record is a day, Samoa's in 2011)
_MAX_GAP_MINUTES: Final = 25 * 60
# how far ahead a cron expression may first match (``0 0 29 2 1``: decades); beyond, it never does
_MAX_SEARCH: Final = 10_000

MAX_YEARS_TO_FIRST: Final = 5
"""A cron expression that does not fire within this many years is refused (it never will)."""

# tz database files that are not zones of a region
_NOT_ZONES: Final = frozenset({"localtime", "posixrules", "Factory"})
_DAY: Final = 86_400


@functools.cache
def _zone_names() -> frozenset[str]:
    # reads the tz database's directory once (tens of milliseconds): ``Schedules`` warms it
    return (frozenset(available_timezones()) - _NOT_ZONES) | {"UTC"}


def zone_names() -> frozenset[str]:
    """The zone names a schedule may have."""
    return _zone_names()


def zone_of(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ``InvalidRequest`` (``unknown_timezone``) if there is none."""
    try:
        if name not in _zone_names():
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidRequest(
            f"unknown timezone {name!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'",
            code="unknown_timezone",
        ) from None


def _all(values: Sequence[int | str], size: int) -> list[int]:
    """A croniter field's values, ``*`` spelled out."""
    if "*" in values:
        return list(range(size))
    return sorted(int(value) for value in values)


def _shortest_step(values: list[int]) -> int | None:
    """The least difference between two consecutive values; None with fewer than two."""
    return min((b - a for a, b in itertools.pairwise(values)), default=None)


def shortest_gap(expression: str) -> int:
    """The shortest wall-clock time in seconds between two firings of a checked expression.

    Times of day are the product hours x minutes x seconds, so the closest two are neighbours
    in one field with the fields below it at their extremes; counted as if every day fired
    (across midnight too), which can only make the answer shorter.
    """
    fields = expression.split()
    walker = croniter(expression, datetime(2000, 1, 1), second_at_beginning=len(fields) == 6)
    expanded = walker.expanded
    minutes, hours = _all(expanded[0], 60), _all(expanded[1], 24)
    seconds = _all(expanded[5], 60) if len(fields) == 6 else [0]
    within_minute = seconds[0] - seconds[-1]  # from the last second of one to the first of next
    within_hour = (minutes[0] - minutes[-1]) * 60 + within_minute
    candidates = [(24 + hours[0] - hours[-1]) * 3600 + within_hour]  # across midnight
    for step, unit, below in (
        (_shortest_step(seconds), 1, 0),
        (_shortest_step(minutes), 60, within_minute),
        (_shortest_step(hours), 3600, within_hour),
    ):
        if step is not None:
            candidates.append(step * unit + below)
    return min(candidates)


def _check_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) not in (5, 6) or "\x00" in expression:
        raise InvalidRequest(
            f"invalid cron expression {expression!r}: give 5 fields (minute hour day month "
            "weekday), or 6 with seconds first",
            code="invalid_cron",
        )
    normalised = " ".join(fields)
    try:
        croniter(normalised, datetime(2000, 1, 1), second_at_beginning=len(fields) == 6)
    except (CroniterError, ValueError, KeyError, IndexError, TypeError, OverflowError) as exc:
        raise InvalidRequest(
            f"invalid cron expression {expression!r}: {exc}", code="invalid_cron"
        ) from None
    return normalised


def _local_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant of the naive local ``wall`` time, by the module's rule."""
    first = wall.replace(tzinfo=zone, fold=0)
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall:
        return first.astimezone(UTC)  # exists (the first occurrence, if it repeats)
    # in a gap: the first whole minute after it that exists
    probe = wall.replace(second=0, microsecond=0)
    for _ in range(_MAX_GAP_MINUTES):
        probe += _MINUTE
        aware = probe.replace(tzinfo=zone, fold=0)
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == probe:
            return aware.astimezone(UTC)
    return first.astimezone(UTC)  # pragma: no cover - no zone has such a gap


@dataclass(frozen=True, slots=True)
class Timing:
    """A checked schedule timing: a cron expression or one moment, in a zone, with its end."""

    cron: str | None
    at: datetime | None
    timezone: str
    end_at: datetime | None = None

    def next_after(self, moment: datetime) -> datetime | None:
        """The first due time strictly after ``moment`` (aware), or None when there is none
        (a one-time schedule past its moment, a cron one past its end)."""
        if self.at is not None:
            due: datetime | None = self.at if self.at > moment else None
        else:
            try:
                due = self._next_cron(moment)
            except (OverflowError, ValueError):  # past the year 9999: never again
                due = None
        if due is not None and self.end_at is not None and due > self.end_at:
            return None
        return due

    def _next_cron(self, moment: datetime) -> datetime | None:
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        wall = moment.astimezone(zone).replace(tzinfo=None)
        seconds = len(self.cron.split()) == 6
        # croniter walks naive wall-clock times; each becomes an instant by the module's rule,
        # and the first instant after ``moment`` wins (the repeated hour's wall times map to
        # instants already past, and are skipped)
        walker = croniter(self.cron, wall, second_at_beginning=seconds)
        for _ in range(_MAX_SEARCH):
            try:
                candidate: datetime = walker.get_next(datetime)
            except (CroniterError, ValueError, OverflowError):
                return None
            instant = _local_instant(candidate, zone)
            if instant > moment:
                return instant
        return None

    def missed_between(self, first: datetime, now: datetime) -> tuple[int, datetime]:
        """How many due times from ``first`` (itself due) up to ``now`` (inclusive), and the
        latest of them; counted up to ``MAX_MISSED_COUNTED``."""
        count, latest = 1, first
        while count < MAX_MISSED_COUNTED:
            following = self.next_after(latest)
            if following is None or following > now:
                break
            count, latest = count + 1, following
        return count, latest


def _aware(value: datetime, zone: ZoneInfo, name: str) -> datetime:
    """``value`` as UTC; a naive one is read on the zone's wall clock."""
    try:
        if value.utcoffset() is None:
            return _local_instant(value, zone)
        return value.astimezone(UTC)
    except (OverflowError, ValueError):  # year 1 or 9999 shifted past the calendar's ends
        raise InvalidRequest(
            f"{name!r} ({value.isoformat()}) is out of range; give a moment between the years"
            " 1 and 9999 in UTC",
            code="validation_error",
        ) from None


def parse_timing(
    *,
    cron: str | None,
    at: datetime | None,
    timezone: str,
    end_at: datetime | None,
    now: datetime,
    min_interval: float = 0.0,
) -> Timing:
    """Check a schedule's timing: exactly one of ``cron`` and ``at``, a known zone, an
    ``at`` in the future, a cron expression firing no more often than every ``min_interval``
    seconds and at least once within ``MAX_YEARS_TO_FIRST`` years; ``InvalidRequest`` with a
    code that names what is wrong."""
    zone = zone_of(timezone)
    if (cron is None) == (at is None):
        raise InvalidRequest(
            "give either 'cron' (a recurring schedule) or 'at' (one time), not "
            + ("both" if cron is not None else "neither"),
            code="schedule_timing",
        )
    checked_cron = None if cron is None else _check_cron(cron)
    moment = None if at is None else _aware(at, zone, "at")
    if moment is not None and moment <= now:
        raise InvalidRequest(
            f"'at' ({moment.isoformat()}) is in the past; give a future moment",
            code="schedule_in_past",
        )
    end = None if end_at is None else _aware(end_at, zone, "end_after")
    if end is not None and end <= now:
        raise InvalidRequest(
            f"'end_after' ({end.isoformat()}) is in the past; give a future date or a count",
            code="schedule_in_past",
        )
    if checked_cron is not None:
        _check_cron_bounds(checked_cron, zone, now, min_interval)
    return Timing(checked_cron, moment, timezone, end)


def _check_cron_bounds(cron: str, zone: ZoneInfo, now: datetime, min_interval: float) -> None:
    gap = shortest_gap(cron)
    if gap < min_interval:
        raise InvalidRequest(
            f"cron expression {cron!r} fires {gap} s apart; this server allows at least "
            f"{min_interval:g} s between firings (AGENT_SCHEDULER_MIN_INTERVAL)",
            code="cron_too_frequent",
        )
    wall = now.astimezone(zone).replace(tzinfo=None)
    walker = croniter(
        cron,
        wall,
        second_at_beginning=len(cron.split()) == 6,
        max_years_between_matches=MAX_YEARS_TO_FIRST,
    )
    try:
        first: datetime = walker.get_next(datetime)
    except (CroniterBadDateError, OverflowError, ValueError):
        first = datetime.max
    if first - wall > timedelta(days=366 * MAX_YEARS_TO_FIRST):
        raise InvalidRequest(
            f"cron expression {cron!r} does not fire within {MAX_YEARS_TO_FIRST} years "
            "(a day that no month has, such as 31 February?)",
            code="cron_never_fires",
        )
