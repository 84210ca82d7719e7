"""A resumed run keeps the options its request asked for (app.runs.checkpoints)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from app.runs.checkpoints import REQUEST_KEY, request_options, resumed_options
from app.runs.handle import RunRequestOptions
from app.storage import RunRecord


def record(started: datetime | None) -> RunRecord:
    return RunRecord(
        run_id="run_1",
        session_id="s1",
        principal="p",
        agent="default",
        input="hello",
        status="waiting",
        started_at=started,
        metadata={"k": "v"},
    )


def stored(options: RunRequestOptions) -> dict[str, object]:
    # what the store keeps is JSON: read it back as a resuming worker would
    loaded: dict[str, object] = json.loads(json.dumps({REQUEST_KEY: request_options(options)}))
    return loaded


def test_every_kept_option_survives_a_resume() -> None:
    asked = RunRequestOptions(
        input="hello",
        max_iterations=7,
        system_prompt="Be brief.",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        webhook_url="https://example.com/hook",
        skill="review",
    )
    resumed = resumed_options(record(datetime.now(UTC)), stored(asked), None)
    assert resumed.max_iterations == 7
    assert resumed.system_prompt == "Be brief."
    assert resumed.response_format == asked.response_format
    assert resumed.webhook_url == "https://example.com/hook"
    assert resumed.skill == "review"
    assert resumed.run_timeout is None
    assert resumed.input == "hello"
    assert resumed.metadata == {"k": "v"}
    assert resumed.background is True
    assert resumed.on_disconnect == "continue"


@pytest.mark.parametrize(
    ("background", "on_disconnect", "kept"),
    [(False, "cancel", "cancel"), (False, "continue", None), (True, "cancel", None)],
)
def test_a_run_read_by_its_client_keeps_its_disconnect_policy(
    background: bool, on_disconnect: str, kept: str | None
) -> None:
    asked = RunRequestOptions(
        input="hello",
        background=background,
        on_disconnect=on_disconnect,  # type: ignore[arg-type]
    )
    assert stored(asked)[REQUEST_KEY].get("on_disconnect") == kept  # type: ignore[attr-defined]
    # the resumed handle itself has no response to lose: the grace looks for readers instead
    assert resumed_options(record(None), stored(asked), None).on_disconnect == "continue"


@pytest.mark.parametrize("from_request", [True, False])
def test_the_deadline_counts_from_the_run_s_start(from_request: bool) -> None:
    asked = RunRequestOptions(input="hello", run_timeout=60 if from_request else None)
    started = datetime.now(UTC) - timedelta(seconds=45)
    resumed = resumed_options(record(started), stored(asked), None if from_request else 60)
    assert resumed.run_timeout is not None
    assert 10 < resumed.run_timeout <= 15


def test_a_deadline_that_passed_while_parked_times_out_at_once() -> None:
    asked = RunRequestOptions(input="hello", run_timeout=5)
    started = datetime.now(UTC) - timedelta(hours=2)
    resumed = resumed_options(record(started), stored(asked), None)
    assert resumed.run_timeout is not None
    assert 0 < resumed.run_timeout < 0.01


def test_a_checkpoint_stored_without_the_request_resumes_with_the_agent_s_defaults() -> None:
    resumed = resumed_options(record(None), {}, None)
    assert resumed.run_timeout is None
    assert resumed.system_prompt is None
    assert resumed.max_iterations is None
