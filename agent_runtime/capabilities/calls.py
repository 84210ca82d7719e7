"""The capability calls: ``embed``, ``rerank``, ``generate_image``, ``synthesize_speech``,
``transcribe``.

Each takes ``binding=``: one ``ModelBinding`` of its purpose, or ``ModelBindings`` (then the
purpose's chain is walked: the next binding is tried on a retryable ``ProviderError``, as the
agent does for chat). A call is a first use like ``chat()``: it builds the provider if needed,
claims the running loop (not for a loop-agnostic provider) and holds a lease on the provider
for its duration, so a credential rotation meanwhile cannot close it::

    async with ModelBinding.embed(model="text-embedding-3-small", api_key=key) as binding:
        result = await embed(["first text", "second text"], binding=binding)
        result.vectors  # two lists of floats
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from ..bindings import ModelBinding, ModelBindings
from ..errors import ConfigurationError, InvalidInputError, ProviderError
from .protocols import (
    EmbeddingProvider,
    ImageProvider,
    RerankProvider,
    SpeechProvider,
    TranscriptionProvider,
)
from .results import Embeddings, Images, Ranking, Speech, Transcription

__all__ = [
    "AudioInput",
    "BindingArg",
    "chain_for",
    "embed",
    "generate_image",
    "rerank",
    "synthesize_speech",
    "transcribe",
    "with_failover",
]

BindingArg: TypeAlias = ModelBinding | ModelBindings
AudioInput: TypeAlias = bytes | bytearray | memoryview | str | os.PathLike[str]
P = TypeVar("P")
R = TypeVar("R")


def chain_for(binding: BindingArg, purpose: str) -> list[ModelBinding]:
    """The bindings a call of ``purpose`` may use, in order; ConfigurationError if none."""
    if isinstance(binding, ModelBindings):
        chain = binding.for_purpose(purpose)
        if not chain:
            raise ConfigurationError(
                f"these ModelBindings have no {purpose} binding: pass {purpose}=... to "
                "ModelBindings"
            )
        return chain
    if isinstance(binding, ModelBinding):
        if binding.purpose != purpose:
            raise ConfigurationError(
                f"binding {binding.model!r} is a {binding.purpose} binding; this call needs "
                f"one built with ModelBinding.{purpose}(...)"
            )
        return [binding]
    raise ConfigurationError(
        f"binding= must be a ModelBinding or ModelBindings, got {type(binding).__name__}"
    )


async def with_failover(
    chain: Sequence[ModelBinding],
    kind: type[P],
    call: Callable[[P], Awaitable[R]],
) -> R:
    """``call`` on the first binding's provider; on a retryable ProviderError, the next one."""
    last: ProviderError | None = None
    for binding in chain:
        try:
            async with binding.lease_as(kind) as provider:
                return await call(provider)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            last = exc
    assert last is not None
    raise last


def _texts(texts: str | Sequence[str], what: str) -> list[str]:
    items = [texts] if isinstance(texts, str) else list(texts)
    if not items:
        raise InvalidInputError(f"{what} needs at least one text")
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidInputError(f"{what}[{index}] is {type(item).__name__}, not a string")
    return items


async def embed(
    texts: str | Sequence[str],
    *,
    binding: BindingArg,
    dimensions: int | None = None,
    params: Mapping[str, Any] | None = None,
) -> Embeddings:
    """Embed one text or several: ``Embeddings.vectors`` has one vector per text, in order.

    ``dimensions`` asks models that support it for shorter vectors; ``params`` go into the
    request (or to the local provider).
    """
    items = _texts(texts, "texts")
    if dimensions is not None and (isinstance(dimensions, bool) or dimensions < 1):
        raise InvalidInputError("dimensions must be a positive integer or None")
    return await with_failover(
        chain_for(binding, "embed"),
        EmbeddingProvider,  # type: ignore[type-abstract]
        lambda provider: provider.embed(items, dimensions=dimensions, params=params),
    )


async def rerank(
    query: str,
    documents: Sequence[str],
    *,
    binding: BindingArg,
    top_n: int | None = None,
    params: Mapping[str, Any] | None = None,
) -> Ranking:
    """Order ``documents`` by relevance to ``query``, most relevant first.

    ``Ranking.results`` holds each document's index in ``documents``, its score and its text;
    ``top_n`` keeps only the best ones.
    """
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty string")
    items = _texts(documents, "documents")
    if top_n is not None and (isinstance(top_n, bool) or top_n < 1):
        raise InvalidInputError("top_n must be a positive integer or None")
    return await with_failover(
        chain_for(binding, "rerank"),
        RerankProvider,  # type: ignore[type-abstract]
        lambda provider: provider.rerank(query, items, top_n=top_n, params=params),
    )


async def generate_image(
    prompt: str,
    *,
    binding: BindingArg,
    n: int = 1,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> Images:
    """Generate ``n`` images for ``prompt`` and wait for them (see ``submit_image`` for a job
    that runs in the background)."""
    _check_prompt(prompt, n)
    return await with_failover(
        chain_for(binding, "image"),
        ImageProvider,  # type: ignore[type-abstract]
        lambda provider: provider.generate_image(prompt, n=n, size=size, params=params),
    )


async def synthesize_speech(
    text: str,
    *,
    binding: BindingArg,
    voice: str = "alloy",
    response_format: str = "mp3",
    params: Mapping[str, Any] | None = None,
) -> Speech:
    """Speak ``text``: the audio bytes in ``response_format`` (``mp3``, ``wav``, ``opus``...)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("text must be a non-empty string")
    return await with_failover(
        chain_for(binding, "tts"),
        SpeechProvider,  # type: ignore[type-abstract]
        lambda provider: provider.synthesize_speech(
            text, voice=voice, response_format=response_format, params=params
        ),
    )


async def transcribe(
    audio: AudioInput,
    *,
    binding: BindingArg,
    filename: str | None = None,
    language: str | None = None,
    prompt: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> Transcription:
    """The text of a recording: its bytes, or the path of a file (read off the loop).

    ``filename`` tells the upstream the format (by its extension); a path gives its own.
    """
    data, name = await _audio(audio, filename)
    return await with_failover(
        chain_for(binding, "asr"),
        TranscriptionProvider,  # type: ignore[type-abstract]
        lambda provider: provider.transcribe(
            data, filename=name, language=language, prompt=prompt, params=params
        ),
    )


def _check_prompt(prompt: str, n: int) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("prompt must be a non-empty string")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidInputError("n must be a positive integer")


async def _audio(audio: AudioInput, filename: str | None) -> tuple[bytes, str]:
    if isinstance(audio, bytes | bytearray | memoryview):
        data = bytes(audio)
        name = filename or "audio.wav"
    elif isinstance(audio, str | os.PathLike):
        path = Path(audio)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise InvalidInputError(f"cannot read the audio file {str(path)!r}: {exc}") from exc
        name = filename or path.name
    else:
        raise InvalidInputError(
            f"audio must be bytes or the path of a file, got {type(audio).__name__}"
        )
    if not data:
        raise InvalidInputError("the audio is empty")
    if not Path(name).suffix:
        raise InvalidInputError(
            f"cannot tell the audio format from the file name {name!r}; pass filename= with "
            "an extension such as .wav, .mp3 or .webm"
        )
    return data, name
