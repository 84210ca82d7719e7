"""Every capability beyond chat over the OpenAI wire, through ``openai.AsyncOpenAI``.

One ``OpenAICapabilities`` serves the binding of any purpose (its model is the binding's):

    capability          request
    -----------------   ---------------------------------------------------------------------
    embed               POST {base_url}/embeddings
    rerank              POST {base_url}/rerank, the shape vLLM, Jina, Cohere (v2) and most
                        OpenAI-compatible servers share: {model, query, documents, top_n} ->
                        {results: [{index, relevance_score, document?}]}
    generate_image      POST {base_url}/images/generations (base64 images, or links)
    synthesize_speech   POST {base_url}/audio/speech
    transcribe          POST {base_url}/audio/transcriptions (multipart)
    video jobs          POST {base_url}/videos (multipart), GET /videos/{id} (honouring
                        ``openai-poll-after-ms``), GET /videos/{id}/content, DELETE /videos/{id}

The SDK's typed methods are used where it has them; rerank (which OpenAI does not serve) and
the video job API (whose SDK methods are deprecated) go through the client's generic requests,
with the same client, credential, timeout and retries. Every failure leaves as a
``ProviderError`` (``providers.errors``), with secrets redacted.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import httpx2
from openai import NOT_GIVEN, AsyncOpenAI, OpenAIError, omit
from openai._legacy_response import HttpxBinaryResponseContent

from ..capabilities.results import (
    Embeddings,
    GeneratedImage,
    Images,
    RankedDocument,
    Ranking,
    Speech,
    Transcription,
    VideoState,
)
from ..errors import ProviderError
from ..model import Usage
from .errors import configuration_error, redact, translate_errors

__all__ = ["AUDIO_MEDIA_TYPES", "OpenAICapabilities"]

# request options the SDK takes as arguments; every other param goes in the body
_SDK_OPTIONS = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})

#: The media type of each ``response_format`` of ``audio/speech``.
AUDIO_MEDIA_TYPES: Mapping[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

_VIDEO_STATES = ("queued", "in_progress", "completed", "failed")


class OpenAICapabilities:
    """Embeddings, rerank, images, speech, transcription and video jobs of one model.

    ``timeout`` and ``max_retries`` configure the SDK client (None keeps the SDK defaults);
    ``params`` go into every request, a call's own params win. Pass ``client`` to use a
    client you own; it is then yours to close.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        params: Mapping[str, Any] | None = None,
        provider_name: str = "openai",
        default_headers: Mapping[str, str] | None = None,
        client: AsyncOpenAI | None = None,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty string")
        self._model = model
        self.provider_name = provider_name
        self.params = dict(params or {})
        self._owns_client = client is None
        if client is None:
            options: dict[str, Any] = {}
            if timeout is not None:
                options["timeout"] = timeout
            if max_retries is not None:
                options["max_retries"] = max_retries
            try:
                client = AsyncOpenAI(
                    api_key=api_key, base_url=base_url, default_headers=default_headers, **options
                )
            except (OpenAIError, ValueError, TypeError) as exc:
                raise configuration_error(
                    exc,
                    what=f"could not build the {provider_name} client for model {model!r}",
                    secrets=[api_key] if api_key else [],
                ) from exc
        self._client = client
        self._secrets: tuple[str, ...] = tuple(
            key for key in (api_key, client.api_key) if isinstance(key, str) and key
        )
        self._closed = False

    def __repr__(self) -> str:
        base_url = redact(str(self._client.base_url), self._secrets)
        return (
            f"OpenAICapabilities(model={self._model!r}, base_url={base_url!r}, "
            f"closed={self._closed})"
        )

    @property
    def model_name(self) -> str:
        """The model the requests name."""
        return self._model

    @property
    def client(self) -> AsyncOpenAI:
        """The SDK client."""
        return self._client

    @property
    def closed(self) -> bool:
        """True once ``aclose`` ran."""
        return self._closed

    def prepare(self) -> None:
        """Import what a first call would (the SDK's resources); needs no loop."""
        self._client.embeddings  # noqa: B018 - the properties import the resource modules
        self._client.images  # noqa: B018
        self._client.audio.speech  # noqa: B018
        self._client.audio.transcriptions  # noqa: B018
        # the SDK decodes base64 embeddings with numpy when it is installed: a first import
        # of numpy takes a second, which must not happen on the loop
        for name in ("anyio._backends._asyncio", "h11", "httpcore2._async.http11", "numpy"):
            with contextlib.suppress(ImportError):
                importlib.import_module(name)

    async def aclose(self) -> None:
        """Close the SDK client if this provider built it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.close()

    # plumbing ---------------------------------------------------------------------------------

    def _errors(self) -> Any:
        if self._closed:
            raise ProviderError(
                f"the provider for model {self._model!r} is closed", provider=self.provider_name
            )
        return translate_errors(
            provider=self.provider_name, model=self._model, secrets=self._secrets
        )

    def _split(self, params: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(body params, SDK options) of the provider's params with the call's on top."""
        merged = {**self.params, **(params or {})}
        options = {key: merged.pop(key) for key in list(merged) if key in _SDK_OPTIONS}
        body = dict(options.pop("extra_body", None) or {})
        body.update(merged)
        return body, options

    def _bad(self, what: str) -> ProviderError:
        return ProviderError(f"model {self._model!r} answered {what}", provider=self.provider_name)

    # embeddings and rerank ----------------------------------------------------------------------

    async def embed(
        self,
        texts: Sequence[str],
        *,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Embeddings:
        """``POST /embeddings``: one vector per text, in order."""
        body, options = self._split(params)
        with self._errors():
            answer = await self._client.embeddings.create(
                model=self._model,
                input=list(texts),
                dimensions=dimensions if dimensions is not None else omit,
                extra_body=body or None,
                extra_headers=options.get("extra_headers"),
                extra_query=options.get("extra_query"),
                timeout=options.get("timeout", NOT_GIVEN),
            )
        rows = sorted(answer.data, key=lambda row: row.index)
        if len(rows) != len(texts):
            raise self._bad(f"{len(rows)} embeddings for {len(texts)} inputs")
        vectors: list[list[float]] = []
        for row in rows:
            # the SDK asks for base64 and decodes it (unless params chose the encoding, and
            # then floats or base64 alike come back decoded)
            vectors.append([float(value) for value in row.embedding])
        usage = Usage(answer.usage.prompt_tokens or 0, 0) if answer.usage else None
        return Embeddings(vectors=vectors, model=answer.model or self._model, usage=usage)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Ranking:
        """``POST /rerank``: the documents by relevance, most relevant first."""
        body, options = self._split(params)
        payload: dict[str, Any] = {
            "model": self._model,
            "query": query,
            "documents": list(documents),
            **body,
        }
        if top_n is not None:
            payload["top_n"] = top_n
        with self._errors():
            answer = await self._client.post(
                "/rerank",
                cast_to=object,
                body=payload,
                options=_request_options(options),
            )
        return self._ranking(answer, documents, top_n)

    def _ranking(self, answer: Any, documents: Sequence[str], top_n: int | None) -> Ranking:
        rows = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise self._bad("a rerank response without a results list")
        results: list[RankedDocument] = []
        for row in rows:
            index = row.get("index") if isinstance(row, dict) else None
            score = row.get("relevance_score", row.get("score")) if isinstance(row, dict) else None
            if (
                not isinstance(index, int)
                or isinstance(index, bool)
                or not 0 <= index < len(documents)
                or not isinstance(score, int | float)
                or isinstance(score, bool)
            ):
                raise self._bad("a rerank result without a valid index and relevance_score")
            results.append(RankedDocument(index, float(score), documents[index]))
        results.sort(key=lambda item: (-item.score, item.index))
        if top_n is not None:
            results = results[:top_n]
        usage = None
        meta = answer.get("usage") if isinstance(answer, dict) else None
        if isinstance(meta, dict):
            tokens = meta.get("total_tokens", meta.get("prompt_tokens"))
            if isinstance(tokens, int):
                usage = Usage(tokens, 0)
        model = answer.get("model") if isinstance(answer.get("model"), str) else self._model
        return Ranking(results=results, model=model, usage=usage)

    # images, speech, transcription ------------------------------------------------------------

    async def generate_image(
        self,
        prompt: str,
        *,
        n: int = 1,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Images:
        """``POST /images/generations``."""
        body, options = self._split(params)
        output_format = str(body.get("output_format") or "png")
        with self._errors():
            answer = await self._client.images.generate(
                model=self._model,
                prompt=prompt,
                n=n,
                size=cast(Any, size) if size is not None else omit,
                extra_body=body or None,
                extra_headers=options.get("extra_headers"),
                extra_query=options.get("extra_query"),
                timeout=options.get("timeout", NOT_GIVEN),
            )
        images: list[GeneratedImage] = []
        for item in answer.data or []:
            data: bytes | None = None
            if item.b64_json:
                try:
                    data = base64.b64decode(item.b64_json, validate=True)
                except (binascii.Error, ValueError):
                    raise self._bad("an image that is not valid base64") from None
            elif not item.url:
                raise self._bad("an image with neither data nor a url")
            images.append(
                GeneratedImage(
                    data=data,
                    url=item.url,
                    media_type=f"image/{'jpeg' if output_format == 'jpg' else output_format}",
                    revised_prompt=item.revised_prompt,
                )
            )
        if not images:
            raise self._bad("no image")
        usage = None
        if answer.usage is not None:
            usage = Usage(answer.usage.input_tokens or 0, answer.usage.output_tokens or 0)
        return Images(images=images, model=self._model, usage=usage)

    async def synthesize_speech(
        self,
        text: str,
        *,
        voice: str,
        response_format: str,
        params: Mapping[str, Any] | None = None,
    ) -> Speech:
        """``POST /audio/speech``: the audio bytes."""
        body, options = self._split(params)
        with self._errors():
            answer = await self._client.audio.speech.create(
                model=self._model,
                input=text,
                voice=cast(Any, voice),
                response_format=cast(Any, response_format),
                extra_body=body or None,
                extra_headers=options.get("extra_headers"),
                extra_query=options.get("extra_query"),
                timeout=options.get("timeout", NOT_GIVEN),
            )
            audio = answer.content
        media_type = AUDIO_MEDIA_TYPES.get(response_format) or _content_type(
            answer.response.headers, "application/octet-stream"
        )
        return Speech(audio=audio, media_type=media_type, model=self._model)

    async def transcribe(
        self,
        audio: bytes,
        *,
        filename: str,
        language: str | None = None,
        prompt: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Transcription:
        """``POST /audio/transcriptions`` (multipart): the recording's text."""
        body, options = self._split(params)
        response_format = str(body.pop("response_format", "json"))
        with self._errors():
            transcriptions: Any = self._client.audio.transcriptions
            answer: Any = await transcriptions.create(
                model=self._model,
                file=(filename, audio),
                language=language if language is not None else omit,
                prompt=prompt if prompt is not None else omit,
                response_format=cast(Any, response_format),
                extra_body=body or None,
                extra_headers=options.get("extra_headers"),
                extra_query=options.get("extra_query"),
                timeout=options.get("timeout", NOT_GIVEN),
            )
        if isinstance(answer, str):  # text, srt, vtt
            return Transcription(text=answer, model=self._model)
        text = getattr(answer, "text", None)
        if not isinstance(text, str):
            raise self._bad("a transcription without text")
        language_found = getattr(answer, "language", None)
        duration = getattr(answer, "duration", None)
        return Transcription(
            text=text,
            model=self._model,
            language=language_found if isinstance(language_found, str) else None,
            duration=float(duration) if isinstance(duration, int | float) else None,
        )

    # video jobs -------------------------------------------------------------------------------

    async def create_video(
        self,
        prompt: str,
        *,
        seconds: str | None = None,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> VideoState:
        """``POST /videos``: start a job upstream."""
        body, options = self._split(params)
        form: dict[str, Any] = {"model": self._model, "prompt": prompt, **body}
        if seconds is not None:
            form["seconds"] = seconds
        if size is not None:
            form["size"] = size
        request = _request_options(options)
        request["headers"] = {
            "Content-Type": "multipart/form-data",
            **dict(request.get("headers") or {}),
        }
        with self._errors():
            response = await self._client.post(
                "/videos", cast_to=httpx2.Response, body=form, options=cast(Any, request)
            )
        return self._video_state(response)

    async def video_state(self, video_id: str) -> VideoState:
        """``GET /videos/{id}``."""
        with self._errors():
            response = await self._client.get(f"/videos/{video_id}", cast_to=httpx2.Response)
        return self._video_state(response)

    def _video_state(self, response: httpx2.Response) -> VideoState:
        try:
            answer = response.json()
        except ValueError:
            raise self._bad("a video job that is not JSON") from None
        video_id = answer.get("id") if isinstance(answer, dict) else None
        status = answer.get("status") if isinstance(answer, dict) else None
        if not isinstance(video_id, str) or not video_id or status not in _VIDEO_STATES:
            raise self._bad("a video job without an id and a known status")
        progress = answer.get("progress")
        error = answer.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        poll_after: float | None = None
        header = response.headers.get("openai-poll-after-ms")
        if header:
            with contextlib.suppress(ValueError):
                poll_after = max(0.0, float(header) / 1000)
        return VideoState(
            id=video_id,
            status=cast(Literal["queued", "in_progress", "completed", "failed"], status),
            progress=int(progress) if isinstance(progress, int | float) else None,
            error=message if isinstance(message, str) else None,
            poll_after=poll_after,
        )

    async def download_video(self, video_id: str) -> tuple[bytes, str]:
        """``GET /videos/{id}/content``: the video's bytes and media type."""
        with self._errors():
            answer = await self._client.get(
                f"/videos/{video_id}/content",
                cast_to=HttpxBinaryResponseContent,
                options={"headers": {"Accept": "application/binary"}},
            )
            data = answer.content
        return data, _content_type(answer.response.headers, "video/mp4")

    async def delete_video(self, video_id: str) -> None:
        """``DELETE /videos/{id}``."""
        with self._errors():
            await self._client.delete(f"/videos/{video_id}", cast_to=object)


def _request_options(options: Mapping[str, Any]) -> Any:
    request: dict[str, Any] = {}
    if options.get("extra_headers"):
        request["headers"] = dict(options["extra_headers"])
    if options.get("extra_query"):
        request["params"] = dict(options["extra_query"])
    if "timeout" in options:
        request["timeout"] = options["timeout"]
    return request


def _content_type(headers: Mapping[str, str], default: str) -> str:
    value = headers.get("content-type", "")
    return value.split(";", 1)[0].strip() or default
