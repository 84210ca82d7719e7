"""What the capability calls return: plain dataclasses, one per capability."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..model import Usage

__all__ = [
    "Embeddings",
    "GeneratedImage",
    "Images",
    "RankedDocument",
    "Ranking",
    "Speech",
    "Transcription",
    "Video",
    "VideoState",
]


@dataclass(slots=True)
class Embeddings:
    """One vector per input text, in input order."""

    vectors: list[list[float]]
    model: str
    usage: Usage | None = None

    @property
    def dimensions(self) -> int:
        """The length of each vector (0 when there are none)."""
        return len(self.vectors[0]) if self.vectors else 0


@dataclass(frozen=True, slots=True)
class RankedDocument:
    """One document of a ranking: its position in the input, its score and its text."""

    index: int
    score: float
    document: str


@dataclass(slots=True)
class Ranking:
    """The documents by relevance to the query, most relevant first."""

    results: list[RankedDocument]
    model: str
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class GeneratedImage:
    """One image: its bytes (``data``) or, when the upstream answered with a link, ``url``."""

    data: bytes | None = field(default=None, repr=False)
    url: str | None = None
    media_type: str = "image/png"
    revised_prompt: str | None = None


@dataclass(slots=True)
class Images:
    """The images of one generation."""

    images: list[GeneratedImage]
    model: str
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Speech:
    """Synthesized audio."""

    audio: bytes = field(repr=False)
    media_type: str
    model: str


@dataclass(frozen=True, slots=True)
class Transcription:
    """The text of an audio recording."""

    text: str
    model: str
    language: str | None = None
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class VideoState:
    """An upstream video job as its API reports it."""

    id: str
    status: Literal["queued", "in_progress", "completed", "failed"]
    progress: int | None = None
    error: str | None = None
    poll_after: float | None = None
    """Seconds the upstream asks to wait before the next poll, when it says."""


@dataclass(frozen=True, slots=True)
class Video:
    """A generated video: its bytes and the upstream job that made it."""

    data: bytes = field(repr=False)
    media_type: str
    model: str
    remote_id: str
