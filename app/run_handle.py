"""Moved to ``app.runs.handle``; this name stays for code that imports it from here."""

from app.runs.handle import (
    CANCEL_REASONS,
    Outcome,
    RunHandle,
    RunRequestOptions,
    new_run_id,
    now,
    record_view,
)

__all__ = [
    "CANCEL_REASONS",
    "Outcome",
    "RunHandle",
    "RunRequestOptions",
    "new_run_id",
    "now",
    "record_view",
]
