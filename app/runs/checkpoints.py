"""The checkpoint sink of a run: each checkpoint the runtime takes, stored with the run's
event log position, under the run's lease token.

The runtime calls ``save`` after each model response, around each approval, before a
non-idempotent tool's body starts and after each tool result (``agent_runtime.checkpoints``);
an exception from it ends the run. A store outage does not: a checkpoint that cannot be stored
is skipped (the run stays resumable from its last stored one), except the one recording the
start of a tool call that must not run twice, which is retried for ``START_WAIT`` seconds
before the call, then ends the run ``unavailable`` without making the call. The store refuses
a save whose token is older than one the run was written with (``StaleFence``): the run was
taken over elsewhere, so this worker fences it off and the run stops here instead of going
on unrecorded.

A final answer's checkpoint (no call open, the model's last message calls no tool) waits
``FINAL_WAIT`` seconds before it is written: the run's end almost always comes first, and its
own write deletes the run's checkpoint in the same transaction, so this one is dropped
(``settle``), a store round trip saved. A run still going on by then (a slow extension), or
ending some other way (handed over, stopped), has it stored as any other. A worker that dies in
between leaves the run resumable from its checkpoint before: resuming from the final answer's
would call the model again all the same (with that answer in the conversation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from agent_runtime.checkpoints import RunCheckpoint
from agent_runtime.content import parts_from_dicts
from agent_runtime.messages import AssistantMessage, UserMessage
from agent_runtime.model import Usage
from agent_runtime.run_context import BARE_CONTEXT
from app.runs.context import RunContext
from app.runs.fencing import Fencing
from app.runs.handle import REQUEST_OPTIONS, RunHandle, RunRequestOptions
from app.runs.records import RunRecords
from app.storage import CheckpointRecord, RunRecord, StaleFence, StorageError, StorageUnavailable

__all__ = [
    "FINAL_WAIT",
    "REQUEST_KEY",
    "STORED_OPTIONS",
    "CheckpointFenced",
    "CheckpointUnavailable",
    "RunCheckpointSink",
    "checkpoint_record",
    "first_checkpoint",
    "first_with_record",
    "request_options",
    "resumed_options",
]

REQUEST_KEY = "request"
"""Where a stored checkpoint keeps the options its run was requested with (the runtime's
``RunCheckpoint.from_dict`` reads only its own keys)."""

logger = logging.getLogger("app.runs")


START_WAIT: Final = 10.0
"""Seconds the start of a tool call that must not run twice waits for the store to record it
(retried meanwhile): a short outage delays the call, a long one ends the run ``unavailable``."""
FINAL_WAIT: Final = 0.5
"""Seconds a final answer's checkpoint waits for the run's end before it is written."""
_RETRY_FIRST: Final = 0.1
_RETRY_MAX: Final = 1.0


class CheckpointFenced(StorageError):
    """A checkpoint of a run this worker no longer holds (fenced off, or taken over)."""


class CheckpointUnavailable(StorageError):
    """The store could not record the start of a tool call that must not run twice within
    ``START_WAIT``: the call does not start, and the run ends with this ``code``."""

    code = "unavailable"


def first_checkpoint(handle: RunHandle) -> RunCheckpoint:
    """The checkpoint of a run before its first model response (step 0): a worker that dies
    while the first answer streams leaves a run that is resumed from its prompt."""
    return RunCheckpoint(
        run_id=handle.run_id,
        session_id=handle.session_id,
        step=0,
        prompt=handle.input,
        added=(UserMessage(handle.options.prompt),),
        iteration=0,
        usage=Usage(),
        calls=(),
        skill=handle.options.skill,
        structured_answers=0,
    )


STORED_OPTIONS = (*REQUEST_OPTIONS, "webhook_url", "branch_from")
"""The options of a run request a checkpoint keeps: the runtime's, the webhook's and the
turn it branches from."""


def request_options(options: RunRequestOptions) -> dict[str, Any]:
    """The options of a run request a resumed run must keep, as JSON (those set)."""
    kept: dict[str, Any] = {}
    for name in STORED_OPTIONS:
        value = getattr(options, name)
        if isinstance(value, Mapping):
            value = dict(value) or None
        if value is not None:
            kept[name] = value
    # a run its client reads (or waits for) and that ends when the client leaves: resumed
    # elsewhere, it is cancelled unless a reader is found (app.runs.grace)
    if not options.background and options.on_disconnect == "cancel":
        kept["on_disconnect"] = "cancel"
    return kept


def first_with_record(context: RunContext, handle: RunHandle) -> CheckpointRecord | None:
    """The run's first checkpoint, stored with its record (one write): for a new run that
    starts at once, when runs are resumable. A run that waits for a slot first stores its own
    when it starts (``Driver``): until then there is nothing to resume."""
    if not context.resume_runs or handle.resumed_from is not None or handle.status != "running":
        return None
    return checkpoint_record(handle, first_checkpoint(handle), handle.seq)


def checkpoint_record(
    handle: RunHandle, checkpoint: RunCheckpoint, event_seq: int
) -> CheckpointRecord:
    """``checkpoint`` as the store keeps it: at ``event_seq``, under the run's lease token, the
    request's own options beside the runtime's state (a resumed run keeps them)."""
    return CheckpointRecord(
        run_id=handle.run_id,
        session_id=handle.session_id,
        step=checkpoint.step,
        event_seq=event_seq,
        data={**checkpoint.to_dict(), REQUEST_KEY: request_options(handle.options)},
        fence=handle.lease.token,
        updated_at=datetime.now(UTC),
    )


def resumed_options(
    record: RunRecord, data: Mapping[str, Any], profile_timeout: float | None
) -> RunRequestOptions:
    """The options of a run resumed from a checkpoint stored as ``data``: the request's own
    (its input, parts included, from its record), with what is left of its deadline
    (``run_timeout`` counts from the run's start, as it does for a run that never moved; past
    it, the resumed run times out at once)."""
    kept = data.get(REQUEST_KEY)
    request: Mapping[str, Any] = kept if isinstance(kept, Mapping) else {}
    stored: dict[str, Any] = {name: request.get(name) for name in STORED_OPTIONS}
    run_timeout = stored["run_timeout"] or profile_timeout
    if run_timeout is not None and record.started_at is not None:
        elapsed = (datetime.now(UTC) - record.started_at).total_seconds()
        run_timeout = max(float(run_timeout) - elapsed, _EXPIRED)
    stored["run_timeout"] = run_timeout
    if not isinstance(stored["response_format"], Mapping):
        stored["response_format"] = None
    return RunRequestOptions(
        input=record.input,
        parts=tuple(parts_from_dicts(record.input_parts)),
        agent=record.agent,
        background=True,
        on_disconnect="continue",
        metadata=record.metadata,
        **stored,
    )


# the run_timeout of a resumed run whose deadline has passed: it ends run_timeout at once
_EXPIRED = 0.001


class RunCheckpointSink:
    """Stores one run's checkpoints (``agent_runtime.CheckpointSink``)."""

    __slots__ = ("_context", "_fencing", "_final", "_handle", "_late", "_records", "first")

    def __init__(
        self, context: RunContext, records: RunRecords, fencing: Fencing, handle: RunHandle
    ) -> None:
        self._context = context
        self._records = records
        self._fencing = fencing
        self._handle = handle
        # the store of the run's first checkpoint, while it goes on (``save_first``)
        self.first: asyncio.Task[None] | None = None
        # a final answer's checkpoint waiting for the run's end, and its write once late
        self._final: tuple[asyncio.TimerHandle, RunCheckpoint, int] | None = None
        self._late: asyncio.Task[None] | None = None

    def save_first(self) -> None:
        """Start storing the run's step-0 checkpoint, at the log's position now (before the
        run's first event, whatever the model streams meanwhile: a resume drops its text).
        A failure only costs the run its resume until its first model response (the
        runtime's own saves fail the run if they fail)."""
        handle = self._handle
        task = self._context.spawn(self._save_first(handle.seq), f"{handle.run_id}:step0")
        self.first = task
        task.add_done_callback(self._first_saved, context=BARE_CONTEXT)

    def _first_saved(self, task: asyncio.Task[None]) -> None:
        if self.first is task:
            self.first = None  # a done task keeps its coroutine: a run may wait for hours

    async def _save_first(self, event_seq: int) -> None:
        handle = self._handle
        try:
            await self.save(first_checkpoint(handle), event_seq=event_seq)
        except Exception as exc:
            logger.warning(
                "could not store the run's first checkpoint: %s",
                exc,
                extra={"run_id": handle.run_id},
            )

    async def save(self, checkpoint: RunCheckpoint, *, event_seq: int | None = None) -> None:
        """Store ``checkpoint`` with the seq of the run's last event before it (by default
        the last so far: the runtime saves between two events); raises ``CheckpointFenced``
        once the run is no longer this worker's. A final answer's waits (see the module)."""
        handle = self._handle
        if self._context.lapsed(handle):
            self._fencing.fence_off(handle, "its lease deadline passed before a checkpoint")
            raise CheckpointFenced(f"run {handle.run_id!r} is no longer held by this worker")
        if event_seq is None and _final_answer(checkpoint):
            timer = asyncio.get_running_loop().call_later(FINAL_WAIT, self._write_late)
            self._final = (timer, checkpoint, handle.seq)
            return
        await self._store(checkpoint, handle.seq if event_seq is None else event_seq)

    async def settle(self, *, ended: bool) -> None:
        """The runtime is done with the run: a final answer's checkpoint still waiting is
        dropped if the run ``ended`` (its end's write deletes the run's checkpoint), else
        stored now; and a late one's write is over before the run's end is written."""
        final, self._final = self._final, None
        if final is not None:
            timer, checkpoint, event_seq = final
            timer.cancel()
            if not ended:
                await self._store_late(checkpoint, event_seq)
        if self._late is not None:
            await asyncio.wait([self._late])

    def _write_late(self) -> None:
        """The run did not end within ``FINAL_WAIT``: its final answer's checkpoint now."""
        final, self._final = self._final, None
        if final is not None:
            _, checkpoint, event_seq = final
            self._late = asyncio.get_running_loop().create_task(
                self._store_late(checkpoint, event_seq)
            )

    async def _store_late(self, checkpoint: RunCheckpoint, event_seq: int) -> None:
        # the runtime went on without waiting for it: a refusal fences the run off (in
        # _store), and is not raised to anyone
        try:
            await self._store(checkpoint, event_seq)
        except CheckpointFenced:
            return
        except Exception:
            logger.warning(
                "could not store a final answer's checkpoint",
                exc_info=True,
                extra={"run_id": self._handle.run_id, "step": checkpoint.step},
            )

    async def _store(self, checkpoint: RunCheckpoint, event_seq: int) -> None:
        handle = self._handle
        context = self._context
        if not await self._records.stored(handle):
            return  # the start is being undone: there is no run to resume
        record = checkpoint_record(handle, checkpoint, event_seq)
        starting = any(call.state == "started" for call in checkpoint.calls)
        began = time.monotonic()
        delay = _RETRY_FIRST
        while True:
            try:
                await context.store.save_checkpoint(record, fence=handle.lease.token)
                break
            except StaleFence as exc:
                self._fencing.fence_off(handle, "the store refused its checkpoint (a newer lease)")
                raise CheckpointFenced(str(exc)) from exc
            except StorageUnavailable as exc:
                details = {"run_id": handle.run_id, "step": checkpoint.step}
                if not starting:
                    # an outage must not end a run that can finish (its end waits in memory
                    # for the store, app.runs.final_write): it stays resumable from its last
                    # stored checkpoint
                    logger.warning("could not store a checkpoint; the run goes on", extra=details)
                    return
                # a tool that must not run twice starts only once its start is recorded: the
                # call waits for the store, within bounds
                if time.monotonic() - began >= START_WAIT:
                    raise CheckpointUnavailable(
                        "the store (the database) could not record the start of a tool call "
                        f"for {START_WAIT:.0f} s; the call was not made"
                    ) from exc
                if delay == _RETRY_FIRST:
                    logger.warning(
                        "could not record a tool call's start; retrying before it starts",
                        extra=details,
                    )
            await asyncio.sleep(delay)
            delay = min(_RETRY_MAX, delay * 2)
            if context.lapsed(handle):
                self._fencing.fence_off(handle, "its lease deadline passed before a tool call")
                raise CheckpointFenced(f"run {handle.run_id!r} is no longer held by this worker")
        handle.checkpoint_step = max(handle.checkpoint_step or 0, checkpoint.step)
        context.metrics.checkpoints_saved.inc()


def _final_answer(checkpoint: RunCheckpoint) -> bool:
    """True for the checkpoint of a run's final answer: no call open, and the model's last
    message calls no tool (the run's end follows)."""
    if checkpoint.calls or not checkpoint.added:
        return False
    last = checkpoint.added[-1]
    return isinstance(last, AssistantMessage) and not last.tool_calls
