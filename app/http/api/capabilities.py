"""Capabilities over HTTP: embeddings (OpenAI shape), rerank, and media jobs.

- ``POST /openai/v1/embeddings``: the OpenAI Embeddings API (the ``openai`` SDK's
  ``client.embeddings.create`` works against it); ``model`` names an ``[embeddings.NAME]``
  section of the configuration or an agent with an ``embed`` model.
- ``POST /v1/rerank``: the rerank shape of vLLM, Jina and Cohere; ``model`` names a
  ``[rerankers.NAME]`` section or an agent with a ``rerank`` model.
- ``POST /v1/media/images`` and ``/v1/media/videos``: 202 with a job id; ``GET
  /v1/media/{job_id}`` its status and result, ``GET /v1/media/{job_id}/content`` the bytes,
  ``POST /v1/media/{job_id}/cancel``.

Every call takes a place in the worker's admission control, like a run (``app.capabilities.jobs``).
"""

from __future__ import annotations

import base64
import struct
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.convertors import Convertor, register_url_convertor
from starlette.responses import JSONResponse, Response

from agent_runtime.capabilities import Images, Video, embed, rerank
from app.auth.keys import principal_of
from app.capabilities.jobs import MediaJobRecord, MediaJobs, admitted, call_upstream
from app.errors import InvalidRequest, NotFound, Unavailable
from app.http.api.schemas import Problem
from app.server.services import Services, ServicesDep

__all__ = ["router"]

router = APIRouter(tags=["capabilities"])

Principal = Annotated[str, Depends(principal_of)]

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {"application/problem+json": {}}}
    for status in (401, 404, 422, 429, 502, 503)
}

_MAX_INPUTS = 2048


class _MediaJobId(Convertor[str]):
    """A media job id in a path, so that ``/v1/media/images`` is never read as a job's id."""

    regex = "media_[0-9a-f]{32}"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("media_job", _MediaJobId())


class EmbeddingsRequest(BaseModel):
    """``POST /openai/v1/embeddings`` (the OpenAI request; unknown fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="An embeddings section or an agent's name.")
    input: str | list[str] = Field(description="A text or a list of texts.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class RerankDocument(BaseModel):
    """A document as an object (Cohere's and Jina's form)."""

    model_config = ConfigDict(extra="forbid")

    text: str


class RerankRequest(BaseModel):
    """``POST /v1/rerank``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="A rerankers section or an agent's name.")
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1, max_length=1000)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True


class ImageJobRequest(BaseModel):
    """``POST /v1/media/images``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="An images section or an agent's name.")
    prompt: str = Field(min_length=1, max_length=32000)
    n: int = Field(1, ge=1, le=10)
    size: str | None = Field(None, max_length=32)
    params: dict[str, Any] | None = Field(None, description="Sent with the request upstream.")


class VideoJobRequest(BaseModel):
    """``POST /v1/media/videos``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="A videos section or an agent's name.")
    prompt: str = Field(min_length=1, max_length=32000)
    seconds: int | str | None = None
    size: str | None = Field(None, max_length=32)
    params: dict[str, Any] | None = None


class MediaJobAccepted(BaseModel):
    """The 202 answer of a media job."""

    job_id: str
    kind: str
    status: str
    status_url: str


def _media(services: Services) -> MediaJobs:
    if services.media is None:  # pragma: no cover - built with the services
        raise Unavailable("media jobs are not available on this worker")
    return services.media


@router.post(
    "/openai/v1/embeddings",
    summary="Create embeddings (OpenAI)",
    # the OpenAI API reference documents it, errors in OpenAI's shape (not problems) included
    include_in_schema=False,
)
async def create_embeddings(
    body: EmbeddingsRequest, principal: Principal, services: ServicesDep
) -> Response:
    """One vector per input text, in the OpenAI Embeddings shape."""
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts or len(texts) > _MAX_INPUTS:
        raise InvalidRequest(f"input must hold 1 to {_MAX_INPUTS} texts")
    binding = services.agents.capability("embed", body.model)
    async with admitted(services.admission, principal, services.settings.queue_timeout):
        with call_upstream():
            result = await embed(texts, binding=binding, dimensions=body.dimensions)
    data: list[dict[str, Any]] = []
    for index, vector in enumerate(result.vectors):
        value: Any = vector
        if body.encoding_format == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = result.usage.input_tokens if result.usage is not None else 0
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": body.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


@router.post("/v1/rerank", summary="Rerank documents", responses=_PROBLEMS)
async def create_rerank(
    body: RerankRequest, principal: Principal, services: ServicesDep
) -> Response:
    """The documents by relevance to the query, most relevant first."""
    texts = [doc if isinstance(doc, str) else doc.text for doc in body.documents]
    binding = services.agents.capability("rerank", body.model)
    async with admitted(services.admission, principal, services.settings.queue_timeout):
        with call_upstream():
            ranking = await rerank(body.query, texts, binding=binding, top_n=body.top_n)
    results: list[dict[str, Any]] = []
    for item in ranking.results:
        row: dict[str, Any] = {"index": item.index, "relevance_score": item.score}
        if body.return_documents:
            row["document"] = {"text": item.document}
        results.append(row)
    tokens = ranking.usage.input_tokens if ranking.usage is not None else 0
    return JSONResponse(
        {
            "id": f"rerank-{id(ranking):x}",
            "model": body.model,
            "results": results,
            "usage": {"total_tokens": tokens},
        }
    )


def _accepted(record: MediaJobRecord) -> Response:
    url = f"/v1/media/{record.id}"
    answer = MediaJobAccepted(
        job_id=record.id, kind=record.kind, status=record.status, status_url=url
    )
    return JSONResponse(answer.model_dump(), status_code=202, headers={"Location": url})


@router.post(
    "/v1/media/images",
    summary="Start an image generation job",
    status_code=202,
    response_model=MediaJobAccepted,
    responses=_PROBLEMS,
)
async def create_image_job(
    body: ImageJobRequest, principal: Principal, services: ServicesDep
) -> Response:
    """Accept the job (202) and run it in the background; read it at ``status_url``."""
    options = {"n": body.n, "size": body.size, "params": body.params}
    record = _media(services).submit("image", principal, body.model, body.prompt, options)
    return _accepted(record)


@router.post(
    "/v1/media/videos",
    summary="Start a video generation job",
    status_code=202,
    response_model=MediaJobAccepted,
    responses=_PROBLEMS,
)
async def create_video_job(
    body: VideoJobRequest, principal: Principal, services: ServicesDep
) -> Response:
    """Accept the job (202) and follow the upstream job in the background."""
    options = {"seconds": body.seconds, "size": body.size, "params": body.params}
    record = _media(services).submit("video", principal, body.model, body.prompt, options)
    return _accepted(record)


def _view(record: MediaJobRecord) -> dict[str, Any]:
    view: dict[str, Any] = {
        "job_id": record.id,
        "kind": record.kind,
        "model": record.model,
        "status": record.status,
        "progress": record.job.progress if record.job is not None else None,
        "created_at": record.created_at,
        "finished_at": record.finished(),
        "result": None,
        "error": record.failure(),
    }
    result = record.result()
    content = f"/v1/media/{record.id}/content"
    if isinstance(result, Images):
        view["result"] = {
            "images": [
                {
                    "b64_json": base64.b64encode(image.data).decode("ascii")
                    if image.data is not None
                    else None,
                    "url": image.url,
                    "media_type": image.media_type,
                    "revised_prompt": image.revised_prompt,
                    "content_url": f"{content}?index={index}" if image.data is not None else None,
                }
                for index, image in enumerate(result.images)
            ],
            "usage": result.usage.to_dict() if result.usage is not None else None,
        }
    elif isinstance(result, Video):
        view["result"] = {
            "media_type": result.media_type,
            "bytes": len(result.data),
            "remote_id": result.remote_id,
            "content_url": content,
        }
    return view


@router.get(
    "/v1/media/{job_id:media_job}", summary="A media job's status and result", responses=_PROBLEMS
)
async def get_media_job(job_id: str, principal: Principal, services: ServicesDep) -> Response:
    """The job's status, progress, and (once completed) its result."""
    return JSONResponse(_view(_media(services).get(job_id, principal)))


@router.get(
    "/v1/media/{job_id:media_job}/content",
    summary="A completed media job's bytes",
    responses={200: {"content": {"image/png": {}, "video/mp4": {}}}, **_PROBLEMS},
)
async def get_media_content(
    job_id: str,
    principal: Principal,
    services: ServicesDep,
    index: Annotated[int, Query(ge=0, description="Which image of the job")] = 0,
) -> Response:
    """The image (by ``index``) or the video, with its media type."""
    record = _media(services).get(job_id, principal)
    result = record.result()
    if isinstance(result, Images):
        if index >= len(result.images) or result.images[index].data is None:
            raise NotFound(f"media job {job_id!r} has no image {index} to download")
        image = result.images[index]
        assert image.data is not None
        return Response(image.data, media_type=image.media_type)
    if isinstance(result, Video):
        return Response(result.data, media_type=result.media_type)
    raise NotFound(f"media job {job_id!r} has no content ({record.status})")


@router.post(
    "/v1/media/{job_id:media_job}/cancel",
    summary="Cancel a media job",
    responses={202: {"description": "cancelling"}, **_PROBLEMS},
)
async def cancel_media_job(job_id: str, principal: Principal, services: ServicesDep) -> Response:
    """202 while the job stops; 200 with its final status if it had already ended."""
    media = _media(services)
    if media.cancel(job_id, principal):
        return JSONResponse({"job_id": job_id, "status": "cancelling"}, status_code=202)
    record = media.get(job_id, principal)
    return JSONResponse({"job_id": job_id, "status": record.status})
