"""Capability work over HTTP: admitted calls (embeddings, rerank) and background media jobs.

Both take a place in the worker's ``Admission``, the same slots and queue runs use: a call or
job beyond them is refused (``overloaded``, or ``draining`` at shutdown). A synchronous call
(``admitted``) waits in the queue for at most ``queue_timeout``; a media job answers at once,
``queued`` until it gets a slot, then runs as a ``MediaJob`` of the runtime on this worker's
loop, holding its slot until it ends.

A job lives in the worker that accepted it, in memory: ``GET /v1/media/{id}`` must reach that
worker (with several workers behind a balancer, route by the job id or poll through one).
Finished jobs are kept ``ttl`` seconds, at most ``keep`` of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_runtime.bindings import ModelBinding, ModelBindings
from agent_runtime.capabilities import Images, MediaJob, Video, submit_image, submit_video
from agent_runtime.errors import ConfigurationError, InvalidInputError, ProviderError
from app.admission.slots import Admission, AdmissionRejected, QueueTimeout, Ticket
from app.agents.build import ConfiguredAgents
from app.errors import Draining, InvalidRequest, NotFound, Overloaded, ServiceError, UpstreamError

__all__ = ["MediaJobRecord", "MediaJobs", "admitted", "call_upstream"]

logger = logging.getLogger("app.capabilities.jobs")

MediaKind = Literal["image", "video"]
_RETRY_AFTER_BUSY = 1.0
_RETRY_AFTER_DRAINING = 5.0


def _refusal(exc: AdmissionRejected) -> ServiceError:
    if exc.reason == "draining":
        return Draining(
            "this server is shutting down and takes no new work; retry on another instance",
            retry_after=_RETRY_AFTER_DRAINING,
        )
    return Overloaded(str(exc), retry_after=_RETRY_AFTER_BUSY)


@contextlib.asynccontextmanager
async def admitted(
    admission: Admission, principal: str, queue_timeout: float
) -> AsyncIterator[None]:
    """Hold an execution slot for the block (waiting in the queue up to ``queue_timeout``)."""
    try:
        ticket = admission.reserve(principal)
    except AdmissionRejected as exc:
        raise _refusal(exc) from None
    try:
        try:
            await ticket.wait(queue_timeout)
        except AdmissionRejected as exc:
            raise _refusal(exc) from None
        yield
    finally:
        ticket.release()


@contextlib.contextmanager
def call_upstream() -> Any:
    """Turn the runtime's errors of a capability call into domain errors."""
    try:
        yield
    except InvalidInputError as exc:
        raise InvalidRequest(str(exc)) from exc
    except ProviderError as exc:
        raise UpstreamError(
            f"the model provider failed: {exc}", retry_after=exc.retry_after
        ) from exc
    except ConfigurationError as exc:
        raise UpstreamError(f"the model is not usable: {exc}") from exc


@dataclass(eq=False)
class MediaJobRecord:
    """One media job of the HTTP API: who owns it, its admission, the runtime's job."""

    id: str
    kind: MediaKind
    model: str
    principal: str
    ticket: Ticket
    created_at: float = field(default_factory=time.time)
    job: MediaJob[Any] | None = None
    waiter: asyncio.Task[None] | None = None
    error: tuple[str, str] | None = None
    """(code, message) of a job that never started (queue timeout, shutdown, cancel)."""
    finished_at: float | None = None

    @property
    def status(self) -> str:
        """``queued``, ``running``, ``completed``, ``failed`` or ``cancelled``."""
        if self.job is not None:
            status = self.job.status
            return "running" if status == "queued" else status
        if self.error is None:
            return "queued"
        return "cancelled" if self.error[0] == "cancelled" else "failed"

    @property
    def done(self) -> bool:
        """True once the job ended, however."""
        return self.status in ("completed", "failed", "cancelled")

    def failure(self) -> dict[str, str] | None:
        """The error of a failed job: a stable ``code`` and a message."""
        if self.error is not None and self.error[0] != "cancelled":
            return {"code": self.error[0], "message": self.error[1]}
        if self.job is None or self.job.status != "failed":
            return None
        exc = self.job.exception()
        if isinstance(exc, ProviderError):
            return {"code": "provider_error", "message": str(exc)}
        return {"code": "internal", "message": "the media job failed"}

    def result(self) -> Images | Video | None:
        """The runtime's result of a completed job."""
        if self.job is None or self.job.status != "completed":
            return None
        value = self.job.result()
        return value if isinstance(value, Images | Video) else None

    def finished(self) -> float | None:
        """When the job ended (None while it runs)."""
        if self.job is not None:
            return self.job.finished_at
        return self.finished_at


class MediaJobs:
    """The media jobs of one worker: submit, read, cancel, and cancel all at shutdown."""

    def __init__(
        self,
        agents: ConfiguredAgents,
        admission: Admission,
        *,
        queue_timeout: float,
        ttl: float = 3600.0,
        keep: int = 1000,
    ) -> None:
        self._agents = agents
        self._admission = admission
        self._queue_timeout = queue_timeout
        self._ttl = ttl
        self._keep = keep
        self._jobs: OrderedDict[str, MediaJobRecord] = OrderedDict()
        self._closed = False

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(
        self,
        kind: MediaKind,
        principal: str,
        model: str,
        prompt: str,
        options: Mapping[str, Any],
    ) -> MediaJobRecord:
        """Accept a job: admitted now (running) or queued; refusals raise domain errors."""
        self._prune()
        if self._closed:
            raise _refusal(AdmissionRejected("draining", "closed"))
        binding = self._agents.capability(kind, model)
        start = self._starter(kind, binding, prompt, options)
        try:
            ticket = self._admission.reserve(principal)
        except AdmissionRejected as exc:
            raise _refusal(exc) from None
        record = MediaJobRecord(
            id=f"media_{secrets.token_hex(16)}",
            kind=kind,
            model=model,
            principal=principal,
            ticket=ticket,
        )
        self._jobs[record.id] = record
        if ticket.granted:
            self._run(record, start)
        else:
            record.waiter = asyncio.get_running_loop().create_task(
                self._wait_for_slot(record, start), name=f"media-queue-{record.id}"
            )
        return record

    def _starter(
        self,
        kind: MediaKind,
        binding: ModelBinding | ModelBindings,
        prompt: str,
        options: Mapping[str, Any],
    ) -> Any:
        """A function that starts the runtime's job; the input is checked here, up front."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRequest("prompt must be a non-empty string")

        def start() -> MediaJob[Any]:
            with call_upstream():
                if kind == "image":
                    return submit_image(prompt, binding=binding, **options)
                return submit_video(prompt, binding=binding, **options)

        return start

    def _run(self, record: MediaJobRecord, start: Any) -> None:
        try:
            job: MediaJob[Any] = start()
        except ServiceError as exc:
            record.ticket.release()
            record.error = (exc.code, exc.detail)
            record.finished_at = time.time()
            return
        record.job = job
        job.task.add_done_callback(lambda _task: record.ticket.release())

    async def _wait_for_slot(self, record: MediaJobRecord, start: Any) -> None:
        try:
            await record.ticket.wait(self._queue_timeout)
        except QueueTimeout as exc:
            record.error = ("overloaded", str(exc))
        except AdmissionRejected as exc:
            if exc.reason == "aborted":
                record.error = ("cancelled", "cancelled while queued")
            else:
                record.error = ("draining", "the server shut down before the job started")
        if record.error is not None:
            record.ticket.release()
            record.finished_at = time.time()
            return
        self._run(record, start)

    def get(self, job_id: str, principal: str) -> MediaJobRecord:
        """The job, if it is the caller's; NotFound otherwise (another's job is not shown)."""
        self._prune()
        record = self._jobs.get(job_id)
        if record is None or record.principal != principal:
            raise NotFound(f"no media job {job_id!r}")
        return record

    def cancel(self, job_id: str, principal: str) -> bool:
        """Cancel the caller's job; False if it had already ended."""
        record = self.get(job_id, principal)
        if record.done:
            return False
        if record.job is not None:
            record.job.cancel("cancel_requested")
        else:
            record.ticket.abort()
        return True

    def _prune(self) -> None:
        horizon = time.time() - self._ttl
        finished = [
            record
            for record in self._jobs.values()
            if record.done and (record.finished() or 0) < horizon
        ]
        for record in finished:
            self._jobs.pop(record.id, None)
        while len(self._jobs) > self._keep:
            oldest = next((r for r in self._jobs.values() if r.done), None)
            if oldest is None:
                break
            self._jobs.pop(oldest.id, None)

    async def aclose(self) -> None:
        """Cancel every job still queued or running and wait until each has ended."""
        self._closed = True
        waiting: list[asyncio.Future[Any]] = []
        for record in self._jobs.values():
            if record.waiter is not None and not record.waiter.done():
                record.ticket.abort()
                waiting.append(record.waiter)
            if record.job is not None and not record.job.done():
                record.job.task.cancel("shutdown")
                waiting.append(record.job.task)
        if waiting:
            await asyncio.wait(waiting)
        # jobs that the waiters started just now
        late = [r.job.task for r in self._jobs.values() if r.job is not None and not r.job.done()]
        for task in late:
            task.cancel("shutdown")
        if late:
            await asyncio.wait(late)
