"""The bodies of ``/v1/schedules``: what a client sends, and what it reads back."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from annotated_types import Interval
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from app.http.api.schemas import SESSION_ID_PATTERN, unicode_text

__all__ = [
    "FiringView",
    "ScheduleCreate",
    "ScheduleList",
    "SchedulePatch",
    "ScheduleView",
]

_NO_NUL = r"^[^\x00]*$"
_TEXT = r"^[^\x00]*$"


def _not_bool(value: Any) -> Any:
    # JSON's true is no count (Python would read it as 1)
    if isinstance(value, bool):
        raise ValueError("a count of firings is an integer, not a boolean")
    return value


def _no_null(schema: dict[str, Any]) -> None:
    # PATCH: leaving a field out keeps it; null is not a value of these fields
    branches = schema.pop("anyOf", None)
    if branches is not None:
        schema.update(next(b for b in branches if b.get("type") != "null"))
    schema.pop("default", None)


Count = Annotated[int, Interval(ge=1, le=1_000_000_000), BeforeValidator(_not_bool)]


def _text_moment(value: Any) -> Any:
    # a moment is RFC 3339 text, never a number (which pydantic would read as a Unix time)
    if not isinstance(value, str | datetime):
        raise ValueError("a date-time is RFC 3339 text, such as 2030-01-01T09:00:00Z")
    return value


Moment = Annotated[datetime, BeforeValidator(_text_moment)]
EndAfter = Count | Moment

_CRON_DESCRIPTION = (
    "A cron expression on the wall clock of `timezone`: 5 fields (minute hour day month "
    "weekday), or 6 with seconds first. Exactly one of `cron` and `at`."
)
_AT_DESCRIPTION = (
    "One time (RFC 3339); without an offset, read in `timezone`. Must be in the future. "
    "Exactly one of `cron` and `at`."
)
_END_DESCRIPTION = (
    "When the schedule ends: a count of firings (at least 1), or a date after which "
    "nothing fires; null: never."
)
_MISFIRE_DESCRIPTION = (
    "What a due time missed while no worker ran does: `skip` (record it as skipped) or "
    "`run_once` (one run for the latest missed time)."
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return unicode_text(data)


class ScheduleCreate(_Body):
    """``POST /v1/schedules``."""

    agent: str = Field(
        "default", min_length=1, max_length=128, pattern=_NO_NUL, description="Agent name."
    )
    input: str = Field(pattern=_TEXT, description="The message each firing's run is given.")
    cron: str | None = Field(None, max_length=256, pattern=_NO_NUL, description=_CRON_DESCRIPTION)
    at: Moment | None = Field(None, description=_AT_DESCRIPTION)
    timezone: str = Field(
        "UTC", min_length=1, max_length=64, pattern=_NO_NUL, description="An IANA zone name."
    )
    session_id: str | None = Field(
        None,
        pattern=SESSION_ID_PATTERN,
        description="The session every firing runs in; null: a new session per firing.",
    )
    end_after: EndAfter | None = Field(None, description=_END_DESCRIPTION)
    misfire: Literal["skip", "run_once"] = Field("skip", description=_MISFIRE_DESCRIPTION)
    paused: bool = Field(False, description="A paused schedule fires nothing until resumed.")


class SchedulePatch(_Body):
    """``PATCH /v1/schedules/{schedule_id}``: the fields given change; the agent and the
    session do not (create another schedule)."""

    input: str | None = Field(
        None,
        pattern=_TEXT,
        json_schema_extra=_no_null,
        description="The message of each firing's run.",
    )
    cron: str | None = Field(
        None, max_length=256, pattern=_NO_NUL, description="A new cron timing (drops `at`)."
    )
    at: Moment | None = Field(None, description="A new one-time timing (drops `cron`).")
    timezone: str | None = Field(
        None,
        json_schema_extra=_no_null,
        min_length=1,
        max_length=64,
        pattern=_NO_NUL,
        description="An IANA zone name.",
    )
    end_after: EndAfter | None = Field(None, description=_END_DESCRIPTION)
    misfire: Literal["skip", "run_once"] | None = Field(
        None, json_schema_extra=_no_null, description=_MISFIRE_DESCRIPTION
    )
    paused: bool | None = Field(
        None,
        json_schema_extra=_no_null,
        description="Pause, or resume (from now: missed times don't fire).",
    )

    @model_validator(mode="after")
    def _no_null_settings(self) -> SchedulePatch:
        # null means "no end" for end_after and "not this timing" for cron/at; for these it
        # means nothing, so it is refused rather than guessed
        for name in ("input", "timezone", "misfire", "paused"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be null; leave it out to keep it")
        return self


class FiringView(BaseModel):
    """One due time of a schedule and what came of it."""

    due_at: str
    status: Literal["claimed", "retrying", "started", "skipped", "failed"]
    run_id: str | None
    attempts: int
    detail: str | None = Field(description="Why it was refused (`code: message`), if it was.")
    missed: int = Field(description="Due times missed while no worker ran, folded into this one.")
    updated_at: str


class ScheduleView(BaseModel):
    """A schedule as the API shows it."""

    schedule_id: str
    agent: str
    input: str
    cron: str | None
    at: str | None
    timezone: str
    session_id: str | None
    end_after: int | str | None
    misfire: Literal["skip", "run_once"]
    paused: bool
    next_due_at: str | None = Field(description="null once the schedule has ended.")
    fired_count: int
    created_at: str
    updated_at: str
    firings: list[FiringView] | None = Field(
        None, description="The latest firings, newest first (in GET of one schedule)."
    )


class ScheduleList(BaseModel):
    """``GET /v1/schedules``."""

    schedules: list[ScheduleView]
