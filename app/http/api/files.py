"""Files: upload one (multipart), read its metadata and its bytes, delete it; the limits of
an upload and of a run's input (``GET /v1/files/limits``, so a page can refuse a file before
sending it).

A file is the caller's: another principal's is 404 on every route. Its bytes are served as an
attachment of the type found in them, with ``nosniff`` and a sandboxing CSP, so that a browser
neither renders an upload as a page of this origin nor guesses another type for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.errors import Unavailable
from app.files import ACCEPTED_MEDIA_TYPES, FILE_ID_PATTERN, FileRecord, FileService
from app.files.intake import input_limits
from app.http.api.multipart import FILE_FIELD, read_upload
from app.http.api.schemas import Problem
from app.server.services import Services, ServicesDep

__all__ = ["UPLOAD_PATH", "content_disposition", "router"]

router = APIRouter(tags=["files"])


class _FileIdConvertor(Convertor[str]):
    """A path segment that has the shape of a file id (``app.files.records``): the file
    routes match no other, so ``/v1/files/limits`` is not taken for one and each path's
    ``Allow`` names its own methods only (any other segment is a plain 404)."""

    regex = FILE_ID_PATTERN.removeprefix("^").removesuffix("$")

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("file_id", _FileIdConvertor())

Principal = Annotated[str, Depends(principal_of)]

UPLOAD_PATH: Final = "/v1/files"
"""Where files are uploaded (its body limit is ``AGENT_MAX_FILE_BYTES`` and the framing)."""

_PROBLEM = {"model": Problem, "content": {"application/problem+json": {}}}
# what a browser that opens a file's bytes may do with them: nothing
_CONTENT_CSP: Final = "default-src 'none'; sandbox"
_ASCII_SAFE: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ._-()+,"
)


class FileView(BaseModel):
    """A stored file."""

    file_id: str = Field(description="``file_`` and 128 random bits in hex")
    filename: str | None = Field(description="The name it was uploaded with (its last path part)")
    media_type: str = Field(description="The type its bytes are (never the one declared)")
    bytes: int
    sha256: str
    created_at: datetime


_UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": [FILE_FIELD],
                "properties": {FILE_FIELD: {"type": "string", "format": "binary"}},
            }
        }
    },
}


class FileLimits(BaseModel):
    """What an upload and a run's input may be."""

    max_bytes: int = Field(description="Bytes of one file at most (``AGENT_MAX_FILE_BYTES``)")
    media_types: list[str] = Field(description="The media types a file's bytes may be")
    max_input_bytes: int = Field(description="Bytes of a run's images and documents together")
    max_input_parts: int = Field(description="Content parts of a run's input at most")


def _files(services: Services) -> FileService:
    if services.files is None:  # pragma: no cover - the lifespan always builds it
        raise Unavailable("files are not available on this worker", retry_after=1)
    return services.files


@router.post(
    UPLOAD_PATH,
    summary="Upload a file",
    status_code=201,
    response_model=FileView,
    responses={401: _PROBLEM, 413: _PROBLEM, 415: _PROBLEM, 422: _PROBLEM},
    openapi_extra={"requestBody": _UPLOAD_BODY},
)
async def upload_file(request: Request, principal: Principal, services: ServicesDep) -> Response:
    """Store the ``file`` field of a multipart form as a file of the caller.

    Its type is found in its bytes: PNG, JPEG, GIF, WebP, PDF or UTF-8 text (415 otherwise, or
    when the part's declared type disagrees); 422 ``empty_file`` or ``malformed_file`` for
    bytes cut short; 413 past ``AGENT_MAX_FILE_BYTES``.
    """
    files = _files(services)
    staged = files.staging()
    try:
        upload = await read_upload(request.stream(), request.headers.get("content-type"), staged)
        record = await files.put_upload(
            principal, staged, filename=upload.filename, declared=upload.declared
        )
    except ClientDisconnect:
        return Response(status_code=400)  # the client went away: nobody reads this
    finally:
        await staged.discard()
    return JSONResponse(
        record.to_json(), status_code=201, headers={"Location": f"{UPLOAD_PATH}/{record.file_id}"}
    )


# (the file routes take only a file id: "limits" is never one, see _FileIdConvertor)
@router.get(
    "/v1/files/limits",
    summary="What a file and a run's input may be",
    response_model=FileLimits,
    responses={401: _PROBLEM},
    dependencies=[Depends(principal_of)],
)
async def get_file_limits(services: ServicesDep) -> Response:
    """The size limit of one file, the media types taken, and the bounds of a run's input
    (its media bytes together, its parts)."""
    files = _files(services)
    limits = input_limits(files)
    return JSONResponse(
        {
            "max_bytes": files.max_bytes,
            "media_types": sorted(ACCEPTED_MEDIA_TYPES),
            "max_input_bytes": limits.max_media_bytes,
            "max_input_parts": limits.max_parts,
        }
    )


@router.get(
    "/v1/files/{file_id:file_id}",
    summary="A file's metadata",
    response_model=FileView,
    responses={401: _PROBLEM, 404: _PROBLEM},
)
async def get_file(file_id: str, principal: Principal, services: ServicesDep) -> Response:
    """The file's name, type, size, sha256 and upload time."""
    record = await _files(services).get(principal, file_id)
    return JSONResponse(record.to_json())


@router.get(
    "/v1/files/{file_id:file_id}/content",
    summary="A file's bytes",
    response_class=Response,
    responses={
        200: {
            "content": {kind: {} for kind in sorted(ACCEPTED_MEDIA_TYPES)},
            "description": "The bytes, of the type stored (text as UTF-8)",
        },
        304: {"description": "Not modified (``If-None-Match`` named its ETag)"},
        401: _PROBLEM,
        404: _PROBLEM,
    },
)
async def get_file_content(
    file_id: str, request: Request, principal: Principal, services: ServicesDep
) -> Response:
    """The file's bytes, as an attachment of its stored type; its ETag is its sha256."""
    files = _files(services)
    record = await files.get(principal, file_id)
    headers = _content_headers(record)
    if _etag(record) in _if_none_match(request.headers.get("if-none-match")):
        return Response(status_code=304, headers=headers)
    data = await files.read(principal, file_id)
    return Response(data, media_type=_served_type(record), headers=headers)


@router.delete(
    "/v1/files/{file_id:file_id}",
    summary="Delete a file",
    status_code=204,
    responses={401: _PROBLEM, 404: _PROBLEM, 409: _PROBLEM},
)
async def delete_file(file_id: str, principal: Principal, services: ServicesDep) -> Response:
    """Delete the file; 409 ``file_in_use`` while a stored conversation refers to it (delete
    the session first)."""
    await _files(services).delete(principal, file_id)
    return Response(status_code=204)


def _etag(record: FileRecord) -> str:
    return f'"{record.sha256}"'


def _if_none_match(value: str | None) -> set[str]:
    if not value:
        return set()
    return {tag.strip().removeprefix("W/") for tag in value.split(",")}


def _served_type(record: FileRecord) -> str:
    if record.media_type.startswith("text/"):
        return f"{record.media_type}; charset=utf-8"
    return record.media_type


def _content_headers(record: FileRecord) -> dict[str, str]:
    return {
        "Content-Disposition": content_disposition(record.filename or record.file_id),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": _CONTENT_CSP,
        "Cache-Control": "private, no-cache",
        "ETag": _etag(record),
    }


def content_disposition(filename: str) -> str:
    """``attachment`` with ``filename``: an ASCII fallback, and the exact name as RFC 6266's
    ``filename*`` (UTF-8, percent-encoded) when the fallback differs."""
    fallback = "".join(c if c in _ASCII_SAFE else "_" for c in filename).strip() or "file"
    value = f'attachment; filename="{fallback}"'
    if fallback != filename:
        value += f"; filename*=UTF-8''{quote(filename, safe='')}"
    return value
