"""Schedule timing: cron on a zone's wall clock across DST changes, and what is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.errors import InvalidRequest
from app.schedules.timing import Timing, parse_timing, shortest_gap

BERLIN = ZoneInfo("Europe/Berlin")
NOW = datetime(2026, 3, 1, tzinfo=UTC)


def _walk(timing: Timing, start: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    moment = start
    for _ in range(count):
        due = timing.next_after(moment)
        assert due is not None
        found.append(due)
        moment = due
    return found


def _berlin(
    year: int, month: int, day: int, hour: int, minute: int = 0, *, fold: int = 0
) -> datetime:
    """A Berlin wall-clock time as a UTC instant (``fold=1``: a repeated time's second)."""
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN, fold=fold).astimezone(UTC)


def test_daily_cron_keeps_the_local_hour_across_the_change() -> None:
    timing = parse_timing(cron="0 9 * * *", at=None, timezone="Europe/Berlin", end_at=None, now=NOW)
    days = _walk(timing, _berlin(2026, 3, 27, 12), 3)
    assert [d.astimezone(BERLIN).hour for d in days] == [9, 9, 9]
    # 08:00 UTC before the change (CET), 07:00 UTC after it (CEST)
    assert [d.hour for d in days] == [8, 7, 7]


def test_spring_forward_gap_fires_once_at_the_end_of_the_gap() -> None:
    # 02:00-02:59 does not exist on 2026-03-29 in Berlin (02:00 CET -> 03:00 CEST)
    timing = parse_timing(
        cron="*/30 * * * *", at=None, timezone="Europe/Berlin", end_at=None, now=NOW
    )
    found = _walk(timing, _berlin(2026, 3, 29, 1, 15), 4)
    assert found == [
        _berlin(2026, 3, 29, 1, 30),
        _berlin(2026, 3, 29, 3, 0),  # 02:00 and 02:30 collapse into the gap's end
        _berlin(2026, 3, 29, 3, 30),
        _berlin(2026, 3, 29, 4, 0),
    ]
    assert found[1] - found[0] == timedelta(minutes=30)


def test_a_time_inside_the_gap_fires_at_the_gap_end() -> None:
    timing = parse_timing(
        cron="30 2 * * *", at=None, timezone="Europe/Berlin", end_at=None, now=NOW
    )
    due = timing.next_after(_berlin(2026, 3, 28, 12))
    assert due == _berlin(2026, 3, 29, 3, 0)
    assert due is not None
    assert due.astimezone(BERLIN).utcoffset() == timedelta(hours=2)
    # the next day is an ordinary 02:30 again
    assert timing.next_after(due) == _berlin(2026, 3, 30, 2, 30)


def test_fall_back_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    # 02:00-02:59 happens twice on 2026-10-25 in Berlin (CEST, then CET)
    timing = parse_timing(
        cron="30 2 * * *", at=None, timezone="Europe/Berlin", end_at=None, now=NOW
    )
    due = timing.next_after(_berlin(2026, 10, 24, 12))
    first = _berlin(2026, 10, 25, 2, 30, fold=0)
    assert due == first
    assert first.hour == 0  # 02:30 CEST is 00:30 UTC
    # not again at 02:30 CET (one hour later): next is the following day
    assert timing.next_after(first) == _berlin(2026, 10, 26, 2, 30)


def test_fall_back_hourly_does_not_repeat_the_wall_hour() -> None:
    timing = parse_timing(cron="0 * * * *", at=None, timezone="Europe/Berlin", end_at=None, now=NOW)
    found = _walk(timing, _berlin(2026, 10, 25, 0, 30), 4)
    assert [d.astimezone(BERLIN).strftime("%H:%M%z") for d in found] == [
        "01:00+0200",
        "02:00+0200",
        "03:00+0100",  # 02:00 CET (the repeat) does not fire
        "04:00+0100",
    ]
    assert found == sorted(set(found))


def test_six_fields_have_seconds_first() -> None:
    timing = parse_timing(cron="*/20 * * * * *", at=None, timezone="UTC", end_at=None, now=NOW)
    assert _walk(timing, NOW, 3) == [NOW + timedelta(seconds=s) for s in (20, 40, 60)]


def test_one_time_and_end_date() -> None:
    at = NOW + timedelta(hours=1)
    timing = parse_timing(cron=None, at=at, timezone="UTC", end_at=None, now=NOW)
    assert timing.next_after(NOW) == at
    assert timing.next_after(at) is None
    ends = parse_timing(
        cron="0 * * * *", at=None, timezone="UTC", end_at=NOW + timedelta(hours=2), now=NOW
    )
    assert _walk(ends, NOW, 2) == [NOW + timedelta(hours=1), NOW + timedelta(hours=2)]
    assert ends.next_after(NOW + timedelta(hours=2)) is None


def test_naive_at_is_read_in_the_zone() -> None:
    timing = parse_timing(
        cron=None, at=datetime(2026, 7, 1, 9, 0), timezone="Europe/Berlin", end_at=None, now=NOW
    )
    assert timing.at == datetime(2026, 7, 1, 7, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "at", "timezone", "code"),
    [
        ("61 * * * *", None, "UTC", "invalid_cron"),
        ("* * *", None, "UTC", "invalid_cron"),
        ("not a cron", None, "UTC", "invalid_cron"),
        ("0 9 * * *", None, "Mars/Olympus", "unknown_timezone"),
        ("0 9 * * *", None, "../../etc/passwd", "unknown_timezone"),
        ("0 9 * * *", None, "", "unknown_timezone"),
        # tz database files that are not a region's zone
        ("0 9 * * *", None, "localtime", "unknown_timezone"),
        ("0 9 * * *", None, "posixrules", "unknown_timezone"),
        ("0 9 * * *", None, "Factory", "unknown_timezone"),
        ("0 9 * * *", None, " UTC", "unknown_timezone"),
        # days no month has: never fires
        ("0 0 31 2 *", None, "UTC", "cron_never_fires"),
        ("0 0 30 2 *", None, "UTC", "cron_never_fires"),
        ("0 0 31 4,6,9,11 *", None, "UTC", "cron_never_fires"),
        (None, None, "UTC", "schedule_timing"),
        ("0 9 * * *", NOW + timedelta(days=1), "UTC", "schedule_timing"),
        (None, NOW - timedelta(seconds=1), "UTC", "schedule_in_past"),
        (None, NOW, "UTC", "schedule_in_past"),
    ],
)
def test_refused(cron: str | None, at: datetime | None, timezone: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_timing(cron=cron, at=at, timezone=timezone, end_at=None, now=NOW)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("cron", "gap"),
    [
        ("* * * * * *", 1),
        ("*/20 * * * * *", 20),
        ("5,10 * * * * *", 5),
        ("0 * * * * *", 60),
        ("* * * * *", 60),
        ("*/7 * * * *", 240),  # :56 to the next hour's :00
        ("0,59 0,23 * * *", 60),  # 23:59 to 00:00
        ("59 58 * * * *", 3600),
        ("0 9,17 * * 1-5", 8 * 3600),
        ("0 9 * * *", 86400),
    ],
)
def test_shortest_gap_between_firings(cron: str, gap: int) -> None:
    assert shortest_gap(cron) == gap


@pytest.mark.parametrize(
    ("cron", "refused"),
    [
        ("* * * * * *", True),
        ("*/30 * * * * *", True),
        ("59 * * * * *", False),
        ("* * * * *", False),
        ("0,59 0,23 * * *", False),
    ],
)
def test_a_minimum_interval_refuses_more_frequent_crons(cron: str, refused: bool) -> None:
    def parse() -> Timing:
        return parse_timing(
            cron=cron, at=None, timezone="UTC", end_at=None, now=NOW, min_interval=60
        )

    if refused:
        with pytest.raises(InvalidRequest) as caught:
            parse()
        assert caught.value.code == "cron_too_frequent"
    else:
        assert parse().cron == cron


def test_a_rare_cron_within_the_horizon_is_kept() -> None:
    # 29 February: the next one is in 2028, within the five years
    timing = parse_timing(cron="0 0 29 2 *", at=None, timezone="UTC", end_at=None, now=NOW)
    assert timing.next_after(NOW) == datetime(2028, 2, 29, tzinfo=UTC)


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires"])
def test_region_zones_are_accepted(name: str) -> None:
    timing = parse_timing(cron="0 9 * * *", at=None, timezone=name, end_at=None, now=NOW)
    assert timing.timezone == name


def test_missed_between_counts_and_finds_the_latest() -> None:
    timing = parse_timing(cron="* * * * *", at=None, timezone="UTC", end_at=None, now=NOW)
    first = NOW + timedelta(minutes=1)
    count, latest = timing.missed_between(first, first + timedelta(minutes=9, seconds=30))
    assert (count, latest) == (10, first + timedelta(minutes=9))
