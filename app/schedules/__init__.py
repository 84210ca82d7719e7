"""Scheduled runs: timing (cron on a zone's wall clock), the principal's schedules, and the
scheduler that fires each due time once across every worker."""

from __future__ import annotations

from app.schedules.scheduler import Scheduler, firing_session
from app.schedules.service import Schedules, ScheduleSpec
from app.schedules.timing import Timing, parse_timing, zone_of

__all__ = [
    "ScheduleSpec",
    "Scheduler",
    "Schedules",
    "Timing",
    "firing_session",
    "parse_timing",
    "zone_of",
]
