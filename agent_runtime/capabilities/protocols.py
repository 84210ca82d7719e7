"""What a provider must offer to serve each capability (``typing.Protocol``, checked at run time).

A supplied provider (``ModelBinding.embed(provider=...)``) needs only the method of its
purpose. The built-in ones are ``providers.openai_capabilities.OpenAICapabilities`` (every
purpose, over the OpenAI wire and the common ``/rerank`` shape) and the in-process providers of
``agent_runtime.local``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .results import Embeddings, Images, Ranking, Speech, Transcription, VideoState

__all__ = [
    "EmbeddingProvider",
    "ImageProvider",
    "RerankProvider",
    "SpeechProvider",
    "TranscriptionProvider",
    "VideoProvider",
]


@runtime_checkable
class EmbeddingProvider(Protocol):
    """Turns texts into vectors."""

    async def embed(
        self,
        texts: Sequence[str],
        *,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Embeddings:
        """One vector per text, in order."""
        ...


@runtime_checkable
class RerankProvider(Protocol):
    """Orders documents by relevance to a query."""

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Ranking:
        """The documents, most relevant first (the best ``top_n`` when given)."""
        ...


@runtime_checkable
class ImageProvider(Protocol):
    """Generates images from a prompt."""

    async def generate_image(
        self,
        prompt: str,
        *,
        n: int = 1,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Images:
        """``n`` images for ``prompt``."""
        ...


@runtime_checkable
class SpeechProvider(Protocol):
    """Speaks text."""

    async def synthesize_speech(
        self,
        text: str,
        *,
        voice: str,
        response_format: str,
        params: Mapping[str, Any] | None = None,
    ) -> Speech:
        """The audio of ``text``."""
        ...


@runtime_checkable
class TranscriptionProvider(Protocol):
    """Turns speech into text."""

    async def transcribe(
        self,
        audio: bytes,
        *,
        filename: str,
        language: str | None = None,
        prompt: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Transcription:
        """The text of ``audio``."""
        ...


@runtime_checkable
class VideoProvider(Protocol):
    """Runs video generation jobs upstream: create, poll, download, delete."""

    async def create_video(
        self,
        prompt: str,
        *,
        seconds: str | None = None,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> VideoState:
        """Start a job upstream."""
        ...

    async def video_state(self, video_id: str) -> VideoState:
        """The job's current state."""
        ...

    async def download_video(self, video_id: str) -> tuple[bytes, str]:
        """The finished video's bytes and media type."""
        ...

    async def delete_video(self, video_id: str) -> None:
        """Stop (or remove) the job upstream."""
        ...
