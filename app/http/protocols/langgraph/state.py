"""A thread's state, status and history of checkpoints, read from the store and the log.

A thread is a session. Its checkpoints are not kept apart: each completed turn (a run whose
messages are stored) is one checkpoint, whose values are the conversation up to that turn
on its branch (``app.runs.branches``), and a run waiting for an answer adds one on top, with
the interrupt as its task. A checkpoint's id is derived from the thread and the turn's run (a
UUID, version 5), so it is the same on every worker and after a restart; its parent is the
checkpoint of the turn it continues.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.bus.wire import iso_ms
from app.http.protocols.common import snapshot
from app.http.protocols.langgraph.fold import RunFold
from app.http.protocols.langgraph.messages import lc_messages
from app.runs import RunHandle
from app.runs.branches import START, parents, turns_of
from app.server.services import Services
from app.storage import RunRecord, SessionRecord

__all__ = ["ThreadView", "checkpoint_id", "read_thread"]

_NAMESPACE = uuid.UUID("6f2b1c1e-2f0a-4c55-9d43-1b5e6c0f7a10")


def checkpoint_id(thread_id: str, run_id: str, suffix: str = "") -> str:
    """The id of the checkpoint a run's turn (or its interrupt) makes in a thread."""
    return str(uuid.uuid5(_NAMESPACE, f"{thread_id}\x00{run_id}\x00{suffix}"))


def _checkpoint(thread_id: str, id_: str | None) -> dict[str, Any] | None:
    if id_ is None:
        return None
    return {
        "thread_id": thread_id,
        "checkpoint_ns": "",
        "checkpoint_id": id_,
        "checkpoint_map": None,
    }


@dataclass
class ThreadView:
    """What a thread is now: its session, metadata, stored turns and its active run."""

    session: SessionRecord
    metadata: dict[str, Any]
    turns: list[tuple[str, list[dict[str, Any]]]]  # (run id, LangChain messages) in order
    parents: dict[str, str | None]  # each turn's parent turn (app.runs.branches)
    active: RunFold | None
    active_status: str | None
    last_status: str | None

    @property
    def thread_id(self) -> str:
        return self.session.id

    @property
    def status(self) -> str:
        """``busy``, ``interrupted``, ``error`` or ``idle``."""
        if self.active is not None:
            return "interrupted" if self.active.interrupts else "busy"
        return "error" if self.last_status == "failed" else "idle"

    def path(self, head: str | None = None) -> list[str]:
        """The run ids of the turns from the first to ``head`` (default: the latest; none for
        ``START``, a new first turn)."""
        if not self.turns or head == START:
            return []
        current: str | None = head if head in self.parents else self.turns[-1][0]
        path: list[str] = []
        while current is not None and current not in path:
            path.append(current)
            current = self.parents.get(current)
        path.reverse()
        return path

    def checkpoint_run(self, checkpoint: str) -> str | None:
        """The run whose turn made ``checkpoint``, if one did."""
        for run_id, _ in self.turns:
            if checkpoint_id(self.thread_id, run_id) == checkpoint:
                return run_id
        return None

    def stored_messages(self, head: str | None = None) -> list[dict[str, Any]]:
        """The messages of the branch ending at ``head`` (default: the latest turn)."""
        by_run = dict(self.turns)
        return [m for run_id in self.path(head) for m in by_run[run_id]]

    def values(self) -> dict[str, Any]:
        if self.active is not None:
            return self.active.values
        return {"messages": self.stored_messages()}

    def interrupts(self) -> list[dict[str, Any]]:
        return list(self.active.interrupts.values()) if self.active is not None else []

    def thread(self) -> dict[str, Any]:
        """The thread object (``Thread``)."""
        interrupts = self.interrupts()
        return {
            "thread_id": self.thread_id,
            "created_at": iso_ms(self.session.created_at.timestamp()),
            "updated_at": iso_ms(self.session.updated_at.timestamp()),
            "metadata": self.metadata,
            "status": self.status,
            "values": self.values(),
            "interrupts": {i["id"]: [i] for i in interrupts},
            "config": {},
        }

    def history(self) -> list[dict[str, Any]]:
        """Every checkpoint, newest first (``ThreadState`` objects)."""
        states: list[dict[str, Any]] = []
        parent: str | None = None
        for run_id, _ in self.turns:
            up = self.parents.get(run_id)
            id_ = checkpoint_id(self.thread_id, run_id)
            states.append(
                self._state(
                    self.stored_messages(run_id),
                    id_,
                    checkpoint_id(self.thread_id, up) if up is not None else None,
                    run_id,
                    [],
                )
            )
        if self.turns:
            parent = checkpoint_id(self.thread_id, self.turns[-1][0])
        if self.active is not None and self.active.interrupts:
            id_ = checkpoint_id(self.thread_id, self.active.run_id, "interrupt")
            tasks = self.interrupts()
            states.append(
                self._state(self.active.values["messages"], id_, parent, self.active.run_id, tasks)
            )
        states.reverse()
        return states

    def state(self) -> dict[str, Any]:
        """The current state (``ThreadState``): the newest checkpoint, or the live run's."""
        history = self.history()
        if self.active is not None and not self.active.interrupts:
            parent = history[0]["checkpoint"]["checkpoint_id"] if history else None
            return self._state(self.active.values["messages"], None, parent, self.active.run_id, [])
        if history:
            return history[0]
        return self._state([], None, None, None, [])

    def _state(
        self,
        messages: list[dict[str, Any]],
        id_: str | None,
        parent: str | None,
        run_id: str | None,
        interrupts: list[dict[str, Any]],
    ) -> dict[str, Any]:
        tasks = [
            {
                "id": i["id"],
                "name": "agent",
                "error": None,
                "interrupts": [i],
                "checkpoint": None,
                "state": None,
                "result": None,
            }
            for i in interrupts
        ]
        return {
            "values": {"messages": messages},
            "next": ["agent"] if interrupts else [],
            "checkpoint": _checkpoint(self.thread_id, id_)
            or {"thread_id": self.thread_id, "checkpoint_ns": "", "checkpoint_id": None},
            "metadata": {"run_id": run_id, "source": "loop", **self.metadata},
            "created_at": iso_ms(self.session.updated_at.timestamp()),
            "parent_checkpoint": _checkpoint(self.thread_id, parent),
            "tasks": tasks,
            "interrupts": interrupts,
        }


async def read_thread(
    services: Services,
    session: SessionRecord,
    metadata: Mapping[str, Any] | None = None,
) -> ThreadView:
    """The thread of ``session`` (already checked to be the caller's)."""
    store = services.store
    if metadata is None:
        metadata = await store.thread_metadata(session.id)
    stored = turns_of(await store.list_messages(session.id))
    turns = [
        (turn.run_id, lc_messages([(m.run_id, m.message) for m in turn.messages]))
        for turn in stored
    ]
    active: RunFold | None = None
    active_status: str | None = None
    holder = await services.bus.locks.holder(session.id)
    if holder is not None and holder.startswith("run_"):
        found = await services.manager.find(holder, session.principal, session.id)
        if found is not None and not _finished(found):
            branch = found.options.branch_from if isinstance(found, RunHandle) else None
            view = ThreadView(session, dict(metadata), turns, parents(stored), None, None, None)
            active = RunFold(holder, session.id, view.stored_messages(branch), found.input)
            for document in await snapshot(services.bus.events, holder) or []:
                active.feed(document)
            if active.ended:
                active = None
            else:
                active_status = "waiting" if active.interrupts else "running"
    last_status: str | None = None
    if session.last_run_id is not None and active is None:
        last = await store.get_run(session.last_run_id)
        last_status = last.status if last is not None else None
    return ThreadView(
        session, dict(metadata), turns, parents(stored), active, active_status, last_status
    )


def _finished(found: RunHandle | RunRecord) -> bool:
    if isinstance(found, RunRecord):
        return found.is_finished
    return found.status in ("completed", "failed", "cancelled")
