"""The run options a request sets are the runtime's ``RunOptions``, with the same types."""

from __future__ import annotations

from dataclasses import fields
from typing import ForwardRef

from agent_runtime.run_options import OPTION_NAMES, RunOptions
from app.http.api.schemas import RunRequest
from app.runs.checkpoints import STORED_OPTIONS
from app.runs.handle import REQUEST_OPTIONS, RunRequestOptions


def _written(annotation: object) -> str:
    return annotation.__forward_arg__ if isinstance(annotation, ForwardRef) else str(annotation)


def test_a_requests_run_options_are_typed_as_the_runtimes() -> None:
    assert REQUEST_OPTIONS
    declared = {item.name: item.type for item in fields(RunRequestOptions)}
    for name in REQUEST_OPTIONS:
        assert _written(declared[name]) == _written(RunOptions.__annotations__[name]), name


def test_the_edges_run_options_all_reach_the_runtime() -> None:
    assert set(RunRequest.model_fields) & OPTION_NAMES <= set(REQUEST_OPTIONS)
    assert set(REQUEST_OPTIONS) <= set(STORED_OPTIONS)
