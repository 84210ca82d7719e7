"""``AgentCore``'s capability calls and media jobs, on the agent's own bindings.

``agent.embed(...)``, ``agent.rerank(...)``... are the functions of ``calls`` with
``binding=agent.bindings``: they walk the agent's chain of that purpose. ``submit_image`` and
``submit_video`` also register the job with the agent, whose ``aclose()`` cancels and awaits it
before the providers close. A closed agent refuses all of them (``AgentClosedError``, a
RuntimeError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..bindings import ModelBindings
from . import calls, jobs
from .results import Embeddings, Images, Ranking, Speech, Transcription, Video

__all__ = ["CapabilityCalls", "CapabilityHost"]


class CapabilityHost(Protocol):
    """What ``CapabilityCalls`` needs from the class it is mixed into (``AgentCore``)."""

    bindings: ModelBindings
    _media_jobs: set[jobs.MediaJob[Any]]

    def _check_usable(self) -> None:
        """Raise if the agent is closed or used from another loop."""
        ...


class CapabilityCalls:
    """Mixed into ``AgentCore``: capability calls and media jobs on ``self.bindings``.

    Each method takes its host as a ``CapabilityHost``: a host without one of its members is a
    type error where the method is used.
    """

    @property
    def media_jobs(self: CapabilityHost) -> tuple[jobs.MediaJob[Any], ...]:
        """The media jobs this agent started that have not finished."""
        return tuple(self._media_jobs)

    async def embed(
        self: CapabilityHost,
        texts: str | Sequence[str],
        *,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Embeddings:
        """``capabilities.embed`` on the agent's ``embed`` chain."""
        self._check_usable()
        return await calls.embed(texts, binding=self.bindings, dimensions=dimensions, params=params)

    async def rerank(
        self: CapabilityHost,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Ranking:
        """``capabilities.rerank`` on the agent's ``rerank`` chain."""
        self._check_usable()
        return await calls.rerank(
            query, documents, binding=self.bindings, top_n=top_n, params=params
        )

    async def generate_image(
        self: CapabilityHost,
        prompt: str,
        *,
        n: int = 1,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Images:
        """``capabilities.generate_image`` on the agent's ``image`` chain."""
        self._check_usable()
        return await calls.generate_image(
            prompt, binding=self.bindings, n=n, size=size, params=params
        )

    async def synthesize_speech(
        self: CapabilityHost,
        text: str,
        *,
        voice: str = "alloy",
        response_format: str = "mp3",
        params: Mapping[str, Any] | None = None,
    ) -> Speech:
        """``capabilities.synthesize_speech`` on the agent's ``tts`` chain."""
        self._check_usable()
        return await calls.synthesize_speech(
            text,
            binding=self.bindings,
            voice=voice,
            response_format=response_format,
            params=params,
        )

    async def transcribe(
        self: CapabilityHost,
        audio: calls.AudioInput,
        *,
        filename: str | None = None,
        language: str | None = None,
        prompt: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Transcription:
        """``capabilities.transcribe`` on the agent's ``asr`` chain."""
        self._check_usable()
        return await calls.transcribe(
            audio,
            binding=self.bindings,
            filename=filename,
            language=language,
            prompt=prompt,
            params=params,
        )

    def submit_image(
        self: CapabilityHost,
        prompt: str,
        *,
        n: int = 1,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> jobs.MediaJob[Images]:
        """``capabilities.submit_image`` on the agent's ``image`` chain; ``aclose()`` cancels
        and awaits the job."""
        self._check_usable()
        job = jobs.submit_image(prompt, binding=self.bindings, n=n, size=size, params=params)
        _adopt(self._media_jobs, job)
        return job

    def submit_video(
        self: CapabilityHost,
        prompt: str,
        *,
        seconds: str | int | None = None,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
        poll_interval: float | None = None,
    ) -> jobs.MediaJob[Video]:
        """``capabilities.submit_video`` on the agent's ``video`` chain; ``aclose()`` cancels
        and awaits the job."""
        self._check_usable()
        job = jobs.submit_video(
            prompt,
            binding=self.bindings,
            seconds=seconds,
            size=size,
            params=params,
            poll_interval=poll_interval,
        )
        _adopt(self._media_jobs, job)
        return job

    async def _drain_media_jobs(self: CapabilityHost) -> None:
        """Cancel every media job of this agent and wait until each has ended."""
        pending = [job.task for job in self._media_jobs if not job.done()]
        for task in pending:
            task.cancel("shutdown")
        if pending:
            # a job that ignores cancellation holds this up: a task cannot be killed
            await asyncio.wait(pending)


def _adopt(media_jobs: set[jobs.MediaJob[Any]], job: jobs.MediaJob[Any]) -> None:
    media_jobs.add(job)
    job.task.add_done_callback(lambda _task: media_jobs.discard(job))
