"""Media jobs: image and video generation running in the background of one event loop.

``submit_image`` and ``submit_video`` start the work at once and return a ``MediaJob``, a handle
around an ``asyncio.Task`` of the loop that called them::

    job = submit_image("a red panda on a skateboard", binding=image)
    job.status          # queued, running, completed, failed or cancelled (readable anywhere)
    images = await job  # the result, or the job's exception; cancelling this wait leaves the
                        # job running
    job.cancel()        # stop it (a video job also deletes its upstream job)

Only the creating loop can drive or cancel the job: awaiting or cancelling it from another
loop (or thread) raises ``LoopAffinityError``. The job holds a lease on its provider for its
whole life, so a credential rotation meanwhile does not close the provider under it. The
bindings it runs on track it: ``ModelBinding.aclose()`` (and so ``AgentCore.aclose()``) cancels
it and waits for it before closing the providers. A job body that ignores its cancellation
delays that close; a task cannot be killed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Coroutine, Generator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from ..bindings import ModelBinding
from ..errors import InvalidInputError, LoopAffinityError, ProviderError
from .calls import BindingArg, _check_prompt, chain_for, with_failover
from .protocols import ImageProvider, VideoProvider
from .results import Images, Video, VideoState

__all__ = ["JobStatus", "MediaJob", "submit_image", "submit_video"]

logger = logging.getLogger("agent_runtime.capabilities")

JobStatus: TypeAlias = Literal["queued", "running", "completed", "failed", "cancelled"]
T = TypeVar("T")

#: Seconds between two polls of an upstream video job that does not say (``openai-poll-after-ms``)
DEFAULT_POLL_INTERVAL = 2.0
#: Seconds a cancelled video job gives the upstream to delete its job before it stops asking
CANCEL_GRACE = 5.0


class MediaJob(Generic[T]):
    """A background media job of one event loop. See the module docstring.

    ``id`` is random; ``kind`` is ``"image"`` or ``"video"``; ``progress`` (0-100) and
    ``remote_id`` come from the upstream when it reports them.
    """

    def __init__(self, kind: str, body: Coroutine[Any, Any, T]) -> None:
        self.id = f"job_{secrets.token_hex(12)}"
        self.kind = kind
        self.progress: int | None = None
        self.remote_id: str | None = None
        self.created_at = time.time()
        self.finished_at: float | None = None
        self._status: JobStatus = "queued"
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[T] = self._loop.create_task(
            self._run(body), name=f"media-job-{self.id}"
        )
        self._task.add_done_callback(_retrieve)

    def __repr__(self) -> str:
        return f"<MediaJob {self.id} kind={self.kind} status={self._status}>"

    async def _run(self, body: Coroutine[Any, Any, T]) -> T:
        self._status = "running"
        try:
            result = await body
        except asyncio.CancelledError:
            self._status = "cancelled"
            raise
        except BaseException:
            self._status = "failed"
            raise
        finally:
            self.finished_at = time.time()
        self._status = "completed"
        return result

    # state (readable from any thread) ---------------------------------------------------------

    @property
    def status(self) -> JobStatus:
        """``queued``, ``running``, ``completed``, ``failed`` or ``cancelled``."""
        return self._status

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the job runs on."""
        return self._loop

    @property
    def task(self) -> asyncio.Task[T]:
        """The task of the job (for ``asyncio.wait`` and the like, on its loop)."""
        return self._task

    def done(self) -> bool:
        """True once the job completed, failed or was cancelled."""
        return self._task.done()

    def result(self) -> T:
        """The result of a finished job; its exception if it failed (``InvalidStateError``
        while it runs, ``CancelledError`` if it was cancelled)."""
        return self._task.result()

    def exception(self) -> BaseException | None:
        """The exception of a failed job, None if it completed."""
        return self._task.exception()

    # driving it (on its own loop only) --------------------------------------------------------

    def _check_loop(self, action: str) -> asyncio.AbstractEventLoop | None:
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is not self._loop:
            raise LoopAffinityError(
                f"media job {self.id} belongs to loop {hex(id(self._loop))}; it cannot be "
                f"{action} from {'no running loop' if current is None else 'another loop'}. "
                "Hand the work to its loop (asyncio.run_coroutine_threadsafe)",
                owner_loop=self._loop,
                current_loop=current,
            )
        return current

    def cancel(self, msg: str | None = None) -> bool:
        """Ask the job to stop; False if it had already finished."""
        self._check_loop("cancelled")
        return self._task.cancel(msg)

    def __await__(self) -> Generator[Any, None, T]:
        self._check_loop("awaited")
        # shielded: a waiter that gives up (a cancelled request) leaves the job running
        return asyncio.shield(self._task).__await__()


def _retrieve(task: asyncio.Task[Any]) -> None:
    # a job nobody awaits must not log "exception was never retrieved": its status tells
    if not task.cancelled():
        task.exception()


def _start(kind: str, chain: Sequence[ModelBinding], body: Coroutine[Any, Any, T]) -> MediaJob[T]:
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"submit_{kind} needs a running event loop: call it from async code"
            ) from None
        for binding in chain:
            binding.claim_loop()
    except BaseException:
        body.close()  # never started: no "coroutine was never awaited" warning
        raise
    job = MediaJob(kind, body)
    for binding in chain:
        binding.track_job(job.task)
    return job


def submit_image(
    prompt: str,
    *,
    binding: BindingArg,
    n: int = 1,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> MediaJob[Images]:
    """Start generating ``n`` images for ``prompt`` in the background; needs a running loop."""
    _check_prompt(prompt, n)
    chain = chain_for(binding, "image")

    async def body() -> Images:
        return await with_failover(
            chain,
            ImageProvider,  # type: ignore[type-abstract]
            lambda provider: provider.generate_image(prompt, n=n, size=size, params=params),
        )

    return _start("image", chain, body())


def submit_video(
    prompt: str,
    *,
    binding: BindingArg,
    seconds: str | int | None = None,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
    poll_interval: float | None = None,
) -> MediaJob[Video]:
    """Start a video job upstream and follow it in the background until its video is
    downloaded; needs a running loop.

    The job is created on the first binding that accepts it (the next one on a retryable
    ProviderError), then polled every ``poll_interval`` seconds (default: what the upstream
    asks, else 2). Cancelling the job deletes the upstream job.
    """
    _check_prompt(prompt, 1)
    if poll_interval is not None and not poll_interval > 0:
        raise InvalidInputError("poll_interval must be a positive number of seconds")
    chain = chain_for(binding, "video")
    length = str(seconds) if seconds is not None else None
    job: MediaJob[Video] | None = None

    async def body() -> Video:
        for index, item in enumerate(chain):
            try:
                async with item.lease_as(VideoProvider) as provider:  # type: ignore[type-abstract]
                    state = await provider.create_video(
                        prompt, seconds=length, size=size, params=params
                    )
                    return await _follow(provider, state, item.model)
            except ProviderError as exc:
                # failover only while no upstream job exists (the create itself failed)
                if not exc.retryable or index == len(chain) - 1 or _remote_started():
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _remote_started() -> bool:
        return job is not None and job.remote_id is not None

    async def _follow(provider: VideoProvider, state: VideoState, model: str) -> Video:
        assert job is not None
        job.remote_id = state.id
        job.progress = state.progress
        try:
            while state.status in ("queued", "in_progress"):
                wait = poll_interval or state.poll_after or DEFAULT_POLL_INTERVAL
                await asyncio.sleep(wait)
                state = await provider.video_state(state.id)
                job.progress = state.progress
            if state.status == "failed":
                raise ProviderError(
                    f"the upstream video job {state.id} of model {model!r} failed"
                    + (f": {state.error}" if state.error else "")
                )
            data, media_type = await provider.download_video(state.id)
        except asyncio.CancelledError:
            await _delete_upstream(provider, state.id)
            raise
        job.progress = 100
        return Video(data=data, media_type=media_type, model=model, remote_id=state.id)

    job = _start("video", chain, body())
    return job


async def _delete_upstream(provider: VideoProvider, video_id: str) -> None:
    """Tell the upstream to drop a job we no longer want; bounded, and never masks the
    cancellation that brought us here."""
    try:
        async with asyncio.timeout(CANCEL_GRACE):
            await provider.delete_video(video_id)
    except Exception as exc:  # a failed courtesy: the cancellation goes on regardless
        logger.warning(
            "could not delete a cancelled upstream video job",
            extra={"video_id": video_id, "error": type(exc).__name__},
        )
    except asyncio.CancelledError:
        pass  # cancelled again while deleting: stop asking; the outer cancellation propagates
