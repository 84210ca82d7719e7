"""The driver: a run's task, from its slot to its outcome.

::

    execute(handle)
      wait for a slot (background runs) → begin(handle), then stream(handle, history)
        begin: the session's stored messages (conversation(handle)), the run marked running
        stream(handle, history): agent.stream(...), every AgentEvent → wire event (seq, JSON
        once) → the run's event log; the runtime's terminal event → the run's Outcome
      → Finalizer.finalize(handle, outcome), on every path

``stream`` takes the conversation the run continues from, so a run can be driven from
something other than the session's stored messages (a checkpoint of a run begun elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, cast

from agent_runtime.agent import AgentRunConfig, AgentRunContext, ModelGate
from agent_runtime.checkpoints import RunCheckpoint
from agent_runtime.errors import AgentClosedError, RunError
from agent_runtime.events import AgentEvent, AgentEventType, EventTap
from agent_runtime.messages import Message, ToolCall, message_from_dict
from agent_runtime.run_options import RunOptions
from app.admission.budgets import BudgetHold, BudgetUsedUp
from app.admission.slots import AdmissionRejected, QueueTimeout
from app.bus.base import AppendNowait, BusError, WireEvent
from app.bus.wire import delta_json, encode_data
from app.runs.branches import branch_path, turns_of
from app.runs.checkpoints import RunCheckpointSink
from app.runs.context import RunContext
from app.runs.fencing import Fencing
from app.runs.finalize import Finalizer
from app.runs.handle import CANCEL_REASONS, HANDOVER, Outcome, RunHandle, lost_outcome, now
from app.runs.records import RunRecords
from app.runs.turns import model_history
from app.storage import StorageUnavailable, WebhookMessage

__all__ = ["Driver"]

logger = logging.getLogger("app.runs")

_WAITING_EVENT = "confirmation_requested"
_TOOL_COMPLETED = AgentEventType.TOOL_CALL_COMPLETED
_RUN_RESUMED = AgentEventType.RUN_RESUMED
_CUSTOM = AgentEventType.CUSTOM
_TERMINAL_TYPES = frozenset(
    {AgentEventType.RUN_COMPLETED, AgentEventType.RUN_FAILED, AgentEventType.RUN_CANCELLED}
)


class Driver:
    """Drives this worker's runs."""

    def __init__(
        self, context: RunContext, records: RunRecords, finalizer: Finalizer, fencing: Fencing
    ) -> None:
        self._context = context
        self._records = records
        self._finalizer = finalizer
        self._fencing = fencing

    async def execute(self, handle: RunHandle) -> None:
        """The run's task: wait for its slot, drive it, end it (always through finalize)."""
        outcome: Outcome | None = None
        try:
            if not handle.ticket.granted and handle.cancel_reason is None:
                remaining = self._context.queue_timeout - (time.monotonic() - handle.t_accepted)
                try:
                    await handle.ticket.wait(max(0.0, remaining))
                except QueueTimeout as exc:
                    outcome = Outcome.failed("queue_timeout", str(exc))
                except AdmissionRejected as exc:
                    reason = "shutdown" if exc.reason == "draining" else "cancel_requested"
                    outcome = Outcome.cancelled(handle.cancel_reason or reason)
            if outcome is None:
                if handle.cancel_reason is not None:
                    outcome = Outcome.cancelled(handle.cancel_reason)
                else:
                    # the conversation read first, then streamed on: one frame fewer while the
                    # run waits for an answer (a run may wait for hours). A run that had its
                    # slot at once has its first checkpoint stored with its record
                    # (app.runs.checkpoints.first_with_record); one that waited stores it now
                    queued = handle.status == "queued"
                    history = await self.begin(handle)
                    outcome = await self.stream(handle, history, first_checkpoint=queued)
        except asyncio.CancelledError:
            # only the run manager cancels a run's task (a run not yet in the runtime); the
            # terminal event must still go out, so finalize shielded, then propagate
            if not handle.finalizing:
                cancelled = Outcome.cancelled(handle.cancel_reason or "shutdown")
                await asyncio.shield(self._finalizer.finalize(handle, cancelled))
            raise
        except BusError as exc:
            # the run's log failed under it: Redis unreachable past the call's bound, its data
            # lost (a restart without persistence, FLUSHALL), or the lease taken over. This
            # worker can no longer keep the log, so it stops acting for the run and ends
            # nothing: the worker that next takes the lease resumes the run from its
            # checkpoint (or, without one, ends it worker_lost) (app.runs.fencing)
            logger.error("run stopped by a bus failure: %s", exc, extra={"run_id": handle.run_id})
            self._fencing.fence_off(handle, f"its event log failed ({exc})", stop=False)
            outcome = lost_outcome()
        except StorageUnavailable as exc:
            # the store failed where the run cannot go on without it (its conversation could
            # not be read): a clear end, stored once the store answers (app.runs.final_write)
            logger.error("run stopped by a store outage: %s", exc, extra={"run_id": handle.run_id})
            outcome = Outcome.failed(
                "unavailable", "the store (the database) could not be reached during the run"
            )
        except Exception:
            logger.exception("run failed unexpectedly", extra={"run_id": handle.run_id})
            outcome = Outcome.failed("internal", "the run failed unexpectedly; it was logged")
        await self._finalizer.finalize(handle, outcome)

    async def begin(self, handle: RunHandle) -> list[Message]:
        """Load the conversation and mark the run running: what ``stream`` continues."""
        history = await self.conversation(handle)
        if handle.status == "queued":
            handle.status = "running"
            handle.started_at = now()
            await self._records.status(handle, "running")
        return history

    async def conversation(self, handle: RunHandle) -> list[Message]:
        """The session's stored messages the run continues."""
        # a new session has nothing to read back: skip the query on the way to the first event
        if not handle.history_size:
            return []
        stored = await self._context.store.list_messages(handle.session_id)
        path = branch_path(turns_of(stored), handle.options.branch_from)
        return model_history(
            [message_from_dict(item.message) for turn in path for item in turn.messages]
        )

    async def stream(
        self, handle: RunHandle, history: Sequence[Message], *, first_checkpoint: bool = True
    ) -> Outcome:
        """Run the agent on ``history`` and forward its events to the run's log; with
        ``first_checkpoint``, store a new run's first checkpoint beside its first model call
        (unless its record carried it)."""
        context = self._context
        run_id = handle.run_id
        options, sink = self._options(handle, first_checkpoint)
        # a run resumed here: its first event is the service's own run.resumed (why, and
        # from which log position); a confirmation asked for again stays out of a log that
        # still holds the first request (it is the same, with the same id and deadline)
        resumed_data = _resumed_data(handle)
        repeat_confirmations = handle.resumed_from is not None and not context.bus.shared
        terminal: AgentEvent | None = None
        encode = handle.encoder.encode_json
        text_delta = AgentEventType.TEXT_DELTA
        reasoning_delta = AgentEventType.REASONING_DELTA
        append_nowait = context.append_nowait
        fence = handle.lease.token
        usage = handle.usage
        handle.in_runtime = True

        tap = _delta_tap(handle, append_nowait) if append_nowait is not None else None
        try:
            stream = self._agent_events(handle, history, options, tap)
            del options, history  # the runtime keeps what it needs; the run may wait for hours
            try:
                async for event in stream:
                    # the hot path: one encode, one append
                    event_type = event.type
                    seq = handle.seq + 1
                    if event_type is text_delta:
                        wire = encode(seq, "text.delta", event.ts, delta_json(event.delta))
                    elif event_type is reasoning_delta:  # as frequent as text while it thinks
                        wire = encode(seq, "reasoning.delta", event.ts, delta_json(event.delta))
                    elif event_type in _TERMINAL_TYPES:
                        terminal = event
                        continue
                    elif event_type is _RUN_RESUMED:
                        wire = encode(seq, "run.resumed", event.ts, encode_data(resumed_data or {}))
                    elif (
                        event_type is AgentEventType.CUSTOM
                        and event.name == _WAITING_EVENT
                        and _asked_again(event)
                        and not repeat_confirmations
                    ):
                        await self._wait_again(handle)
                        del event
                        continue
                    else:
                        if event_type is _TOOL_COMPLETED:
                            _tool_finished(handle, event)
                        wire = encode(seq, event_type.value, event.ts, encode_data(event.data()))
                    if handle.fenced:
                        continue  # past its lease: nothing of the run goes out from here
                    handle.seq = seq
                    if append_nowait is not None and event_type is not _CUSTOM:
                        append_nowait(run_id, wire, fence=fence)
                    else:
                        await self._append_waited(handle, wire, fence)
                    if handle.t_first_event is None:
                        self._first_event(handle)
                    if event_type is AgentEventType.USAGE:
                        usage.add(event.usage)
                    elif (
                        event_type is AgentEventType.RUN_STARTED
                        or event_type is _CUSTOM
                        or handle.status == "waiting"
                    ):
                        await self._after_event(handle, event)
                    del event  # a run now waiting for an answer keeps no event (nor its payload)
            except BusError as exc:
                # fenced off before the runtime's run is closed: what it would store while
                # closing (a call cut short as its result) must not become the checkpoint the
                # run is resumed from
                self._fencing.fence_off(handle, f"its event log failed ({exc})", stop=False)
                raise
            except Exception as exc:
                # the runtime yields its terminal event before it raises the failure:
                # run.failed or run.cancelled for its own errors, run.failed with the error's
                # own code for another's (a checkpoint sink's CheckpointUnavailable:
                # "unavailable"). That event is the run's outcome, not an unexpected failure
                failed = terminal is not None and terminal.type is AgentEventType.RUN_FAILED
                if not (isinstance(exc, RunError) or failed):
                    raise
            finally:
                await stream.aclose()
        except AgentClosedError:
            return Outcome.cancelled(handle.cancel_reason or "shutdown")
        finally:
            handle.in_runtime = False
            if sink is not None:
                first = sink.first
                if first is not None and not first.done():
                    await asyncio.wait([first])
                # a completed run's end deletes its checkpoint: its final answer's is not
                # written (nor one of a run fenced off); any other end stores it first
                completed = terminal is not None and terminal.type is AgentEventType.RUN_COMPLETED
                await sink.settle(ended=completed or handle.fenced)
        if terminal is None:  # pragma: no cover - the runtime always ends with a terminal event
            return Outcome.failed("internal", "the run ended without a result")
        return self.outcome_of(handle, terminal)

    async def _wait_again(self, handle: RunHandle) -> None:
        """The run waits again on a question its log already holds (a resumed run's)."""
        handle.status = "waiting"
        await self._records.status(handle, "waiting")
        handle.ask()

    async def _append_waited(self, handle: RunHandle, wire: WireEvent, fence: int) -> None:
        """Append an event to the run's log, and wait until it is there."""
        # a custom event may be a question the run then waits on (a confirmation request):
        # written before the run reads as waiting, so whoever sees that status finds the
        # question in the log
        handle.appending = True
        try:
            await self._context.events.append(handle.run_id, wire, fence=fence)
        finally:
            handle.appending = False

    def _first_event(self, handle: RunHandle) -> None:
        handle.t_first_event = time.monotonic()
        self._context.metrics.time_to_first_event.observe(handle.t_first_event - handle.t_accepted)

    def _options(
        self, handle: RunHandle, first_checkpoint: bool
    ) -> tuple[RunOptions, RunCheckpointSink | None]:
        """The run's options (its gates, its checkpoint sink), and its checkpoint sink (None
        without resume), storing its first checkpoint (``first``) with ``first_checkpoint``
        unless it was resumed."""
        context = self._context
        options = run_options(handle)
        if context.bus.shared:
            options["tool_gate"] = self._tool_gate(handle)
        if handle.budget is not None:
            options["model_gate"] = _budget_gate(handle, handle.budget)
        sink: RunCheckpointSink | None = None
        if context.resume_runs:
            sink = RunCheckpointSink(context, self._records, self._fencing, handle)
            options["checkpoint_sink"] = sink
            if first_checkpoint and handle.resumed_from is None:  # beside the first model call
                sink.save_first()
        return options, sink

    def _agent_events(
        self,
        handle: RunHandle,
        history: Sequence[Message],
        options: RunOptions,
        tap: EventTap | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """The run's events from its agent: a new run, or one resumed from its checkpoint."""
        config = AgentRunConfig(
            session_id=handle.session_id,
            request_id=handle.run_id,
            run_id=handle.run_id,
            metadata=handle.metadata,
        )
        agent = self._context.agent_for(handle)
        resumed = handle.resumed_from
        if resumed is not None:
            source = agent.resume(
                RunCheckpoint.from_dict(resumed.data),
                config=config,
                conversation=list(history),
                tap=tap,
                **options,
            )
        else:
            source = agent.stream(
                handle.options.prompt,
                config=config,
                conversation=list(history),
                tap=tap,
                **options,
            )
        return cast(AsyncGenerator[AgentEvent, None], source)

    async def _after_event(self, handle: RunHandle, event: AgentEvent) -> None:
        """What a logged event changes: the run's shared trace, its waiting status."""
        context = self._context
        tracing = context.tracing if context.bus.shared else None
        if event.type is AgentEventType.RUN_STARTED and tracing is not None:
            # where a worker answering this run's confirmation finds its trace
            try:
                await tracing.remember(context.bus.values, handle.session_id, handle.run_id)
            except BusError as exc:  # a trace never fails a run
                logger.warning(
                    "could not share the run's trace context: %s",
                    exc,
                    extra={"run_id": handle.run_id},
                )
        elif event.type is AgentEventType.CUSTOM and event.name == _WAITING_EVENT:
            handle.status = "waiting"
            await self._records.status(handle, "waiting", self._webhook(handle, event))
            handle.ask()
        elif handle.status == "waiting":
            handle.asking = False
            handle.status = "running"
            await self._records.status(handle, "running")

    def _tool_gate(self, handle: RunHandle) -> Callable[[ToolCall], str | None]:
        """The run's last word on each tool call, right before it starts: none starts once the
        run's lease may have lapsed, even before the watchdog's turn (app.runs.fencing)."""
        context = self._context
        fencing = self._fencing

        def gate(call: ToolCall) -> str | None:
            if not context.lapsed(handle):
                handle.tool_started(call.id)  # until its tool.call.completed
                return None
            fencing.fence_off(handle, "its lease deadline passed before a tool call started")
            return "not run: this worker lost the run's session lease"

        return gate

    def _webhook(self, handle: RunHandle, event: AgentEvent) -> WebhookMessage | None:
        """The message of a confirmation request, when the run has a webhook."""
        context = self._context
        url = context.webhook_url(handle)
        if context.webhooks is None or url is None:
            return None
        payload = event.data().get("payload")
        return context.webhooks.confirmation(
            url,
            run_id=handle.run_id,
            session_id=handle.session_id,
            agent=handle.agent,
            payload=payload if isinstance(payload, dict) else {},
        )

    def outcome_of(self, handle: RunHandle, event: AgentEvent) -> Outcome:
        """The outcome of the runtime's terminal event."""
        data = event.data()
        if event.type is AgentEventType.RUN_COMPLETED:
            if event.usage is not None:
                handle.usage = event.usage
            return Outcome(
                "completed",
                "run.completed",
                data,
                output=data["output"],
                messages=list(event.messages or ()),
            )
        if event.type is AgentEventType.RUN_FAILED:
            if event.usage is not None:
                handle.usage = event.usage
            error = dict(data["error"])
            return Outcome("failed", "run.failed", {"error": error}, error=error)
        reason = handle.cancel_reason or event.reason or "cancel_requested"
        if reason == HANDOVER:  # the run goes on elsewhere (app.runs.handover)
            return Outcome.cancelled(HANDOVER)
        if reason not in CANCEL_REASONS:
            # the runtime's own words for a cancellation we did not ask for
            reason = "shutdown" if self._context.agent_for(handle).closed else "cancel_requested"
        if event.usage is not None:
            handle.usage = event.usage
        stopped = Outcome.cancelled(reason)
        stopped.messages = list(event.messages or ())  # the stopped turn (app.runs.turns)
        return stopped


def _budget_gate(handle: RunHandle, hold: BudgetHold) -> ModelGate:
    """Before each model call: charge what the run used past its reservation, and stop it
    (``budget_exceeded``) once one of its budgets is used up (app.admission.budgets)."""

    async def gate(context: AgentRunContext) -> None:
        usage = context.state.usage  # the runtime's own, current (the log's may lag behind)
        used = max(0, usage.input_tokens + usage.output_tokens - handle.usage_before)
        full = await hold.draw(used)
        if full is not None:
            raise BudgetUsedUp(full, dict(hold.charges)[full])

    return gate


def _asked_again(event: AgentEvent) -> bool:
    """True for a confirmation request a resumed run repeats (asked before it moved here)."""
    data = event.data()
    payload = data.get("payload")
    return bool(data.get("resumed")) or (isinstance(payload, dict) and bool(payload.get("resumed")))


def _resumed_data(handle: RunHandle) -> dict[str, Any] | None:
    """The data of a resumed run's ``run.resumed``: why, and from which log position."""
    resumed = handle.resumed_from
    if resumed is None:
        return None
    return {
        "reason": resumed.handover or "worker_lost",
        "from_seq": min(resumed.event_seq, handle.seq),
    }


def _tool_finished(handle: RunHandle, event: AgentEvent) -> None:
    if not handle.tool_finished(event.tool_call_id):
        return
    if handle.fenced:
        logger.error(
            "a tool call of a fenced-off run finished after the run's lease",
            extra={"run_id": handle.run_id, "tool": event.name},
        )


def run_options(handle: RunHandle) -> RunOptions:
    """The agent's run options, with the request's own over the profile's."""
    profile = handle.profile
    options = profile.run_options()
    # the profile's limits stand in for those the request leaves unset
    if profile.run_timeout is not None:
        options["run_timeout"] = profile.run_timeout
    if profile.max_iterations is not None:
        options["max_iterations"] = profile.max_iterations
    options.update(handle.options.run_options())
    return options


def _delta_tap(handle: RunHandle, append_nowait: AppendNowait) -> EventTap:
    """The driver's taker of a token's delta, the run's most frequent event: logged in the
    runtime's task while the driver waits for it, one task wake-up a token instead of two.
    Anything else (or a delta with more to do than its append) goes to the driver's loop."""
    encode = handle.encoder.encode_json
    text_delta = AgentEventType.TEXT_DELTA
    reasoning_delta = AgentEventType.REASONING_DELTA
    run_id = handle.run_id
    fence = handle.lease.token

    def tap(event: AgentEvent) -> bool:
        event_type = event.type
        if event_type is text_delta:
            name = "text.delta"
        elif event_type is reasoning_delta:
            name = "reasoning.delta"
        else:
            return False
        if handle.fenced or handle.status == "waiting" or handle.t_first_event is None:
            return False
        seq = handle.seq + 1
        wire = encode(seq, name, event.ts, delta_json(event.delta))
        try:
            append_nowait(run_id, wire, fence=fence)
        except Exception:  # the loop's own append meets it again, and handles it
            return False
        handle.seq = seq
        return True

    return tap
