"""Cancels and answers: to a run held here (the bus's ``CommandHandler`` side), or through the
bus to the worker that holds it.

Cancelling: a run inside the runtime is cancelled with ``agent.cancel_run`` (the runtime tells
its extensions and yields ``run.cancelled``); a run not yet there (queued, loading its
conversation) has its task cancelled. The first reason given wins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agent_runtime.agent import AgentRunConfig
from agent_runtime.errors import AgentClosedError
from agent_runtime.extensions.external import ExternalEvent
from app.errors import NotFound
from app.runs.context import RunContext
from app.runs.handle import RunHandle
from app.storage import RunStatus

__all__ = ["Routing"]


class Routing:
    """Where a cancel or an answer goes, and what it does on arrival."""

    def __init__(self, context: RunContext) -> None:
        self._context = context

    # --- arriving here (CommandHandler) ------------------------------------------------------

    def cancel_local(self, run_id: str, reason: str) -> bool:
        """Cancel a run held here; False if there is no such unfinished run."""
        handle = self._context.runs.get(run_id)
        if handle is None or handle.done:
            return False
        if handle.finalizing:  # its terminal event is being written: too late to change it
            return True
        if handle.cancel_reason is None:
            handle.cancel_reason = reason
        if handle.in_runtime:
            # False means the runtime's run already ended: its terminal event is on its way
            self._context.agent_for(handle).cancel_run(run_id, handle.cancel_reason)
            return True
        task = handle.task
        if task is None:  # still in start(): queued, or storing its record
            handle.ticket.abort()
            return True
        if not handle.task_cancelled:
            handle.task_cancelled = True
            task.cancel()
        return True

    def deliver_local(
        self, session_id: str, run_id: str | None, name: str, payload: Mapping[str, Any]
    ) -> list[str]:
        """Offer an external answer to the agent holding the run (found by run, else session)."""
        context = self._context
        event = ExternalEvent(name, dict(payload))
        config = AgentRunConfig(session_id=session_id, request_id=run_id)
        handle = context.runs.get(run_id) if run_id is not None else None
        if handle is None:
            handle = next((h for h in context.runs.values() if h.session_id == session_id), None)
        # no run here: any agent's extension may still hold it (they check session and run)
        agents = [context.agent_for(handle)] if handle is not None else context.all_agents()
        for agent in agents:
            try:
                accepted = agent.emit_external_event(event, config=config)
            except AgentClosedError:
                continue
            if accepted:
                return accepted
        return []

    # --- from a request ----------------------------------------------------------------------

    async def cancel(self, run_id: str, principal: str) -> tuple[str, RunStatus] | None:
        """``POST /v1/runs/{id}/cancel``: ("cancelling" | "finished", status), None if unknown."""
        context = self._context
        found = await context.find(run_id, principal)
        if found is None:
            return None
        if isinstance(found, RunHandle):
            if found.finalizing and not found.done:
                # its outcome is being stored: answer with it, not with "running" (shielded: a
                # client that leaves must not cancel the run's own future)
                await asyncio.shield(found.finished)
            if found.done or found.finalizing:
                return "finished", found.status
            self.cancel_local(run_id, "cancel_requested")
            return "cancelling", context.live_status(found)
        if found.is_finished:
            return "finished", found.status
        if not await context.bus.router.cancel(run_id, "cancel_requested"):
            # no worker holds it: it has just ended, or its worker is lost (the sweep ends it)
            record = await context.store.get_run(run_id)
            if record is not None and record.is_finished:
                return "finished", record.status
        return "cancelling", found.status

    async def external_event(
        self,
        principal: str,
        session_id: str,
        run_id: str | None,
        name: str,
        payload: Mapping[str, Any],
    ) -> list[str]:
        """Deliver an answer to a waiting run of the caller's session; 404 if not theirs."""
        context = self._context
        local = context.runs.get(run_id) if run_id is not None else None
        if local is not None and local.session_id == session_id:
            # the run is held here: its handle answers the ownership question without a query
            owned = local.principal == principal
            if not owned:
                # the query an unknown run costs, so that the refusal's timing tells nothing
                await context.store.get_session(session_id)
        else:
            session = await context.store.get_session(session_id)
            owned = session is not None and session.principal == principal
        if not owned:
            context.metrics.external_events.labels("not_found").inc()
            raise NotFound(f"no session {session_id!r}")
        accepted = await context.bus.router.deliver_external(session_id, run_id, name, payload)
        context.metrics.external_events.labels("accepted" if accepted else "not_accepted").inc()
        return accepted
