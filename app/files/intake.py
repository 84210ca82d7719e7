"""A run's input as the service takes it: a string, or content parts, checked and stored.

Every surface that starts a run (the native API, and each protocol once it has mapped its own
parts) hands its input to ``take_input``. The native parts::

    {"type": "text", "text": "..."}
    {"type": "image", "file_id": "file_..."}   or   {"type": "image", "url": "https://..."}
    {"type": "file",  "file_id": "file_..."}   or   {"type": "file",  "url": "data:...;base64,..."}

with an optional ``filename`` and ``media_type`` on the media parts. A ``file`` part may hold
an image or a document (it becomes the runtime's ``ImagePart`` or ``DocumentPart`` by what its
bytes are); an ``image`` part must hold an image.

- ``file_id``: one of the caller's files (``POST /v1/files``); another principal's file and a
  missing one are the same answer (404 ``file_not_found``).
- ``data:`` URL: decoded (in a thread when large) and stored as a file of the caller on
  arrival, its declared media type checked against its bytes. From then on the run, its
  messages, its checkpoints and its event log hold the file id, never the bytes.
- ``https:`` URL: handed to the model provider as it is; the service never fetches it. Any
  other scheme is refused.

All of it is checked before anything is stored: the number of parts, each part's shape, the
media bytes of the run (its files and data URLs together), each file and each data URL's
bytes. Then the data URLs are stored, and should one of them be refused there (the file
service looks deeper than the check here: a truncated image), the files this call stored are
deleted again. A refusal is a domain error with a stable ``code``:

=========================  ======  ==========================================================
code                       status  why
=========================  ======  ==========================================================
``validation_error``       422     a part of no known type, or a media part with neither or
                                   both of ``file_id`` and ``url``
``empty_input``            422     a text part without text, or a list of no parts
``too_many_parts``         422     more than ``InputLimits.max_parts`` parts
``unsupported_url``        422     a URL that is neither ``https:`` nor ``data:``
``invalid_data_url``       422     a ``data:`` URL that does not decode (base64 or percent)
``input_too_large``        413     more media bytes than ``InputLimits.max_media_bytes``
``file_not_found``         404     a ``file_id`` that is not one of the caller's files
``unsupported_media_type`` 415     bytes of a type the service does not take, not the type
                                   declared, or an ``image`` part that is not an image
=========================  ======  ==========================================================

plus what ``FileService.put`` refuses a data URL's bytes for (``malformed_file``, ...).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote_to_bytes

from agent_runtime.content import (
    DOCUMENT_MEDIA_TYPES,
    IMAGE_MEDIA_TYPES,
    ContentPart,
    DocumentPart,
    ImagePart,
    TextPart,
    content_text,
    sniff_media_type,
)
from app.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unavailable,
    UnsupportedMediaType,
)
from app.files.checks import normalise_media_type
from app.files.records import FileRecord
from app.files.service import FileService

__all__ = [
    "DEFAULT_MAX_PARTS",
    "InputLimits",
    "RunInput",
    "discard_input",
    "input_limits",
    "run_body_limit",
    "take_input",
]

logger = logging.getLogger("app.files")

DEFAULT_MAX_PARTS: Final = 64
"""Parts one run's input may have (text and media together)."""

MAX_URL_CHARS: Final = 8192
"""The longest ``https`` URL a part may carry (a data URL is bounded by its bytes instead)."""

_OFFLOAD_CHARS: Final = 64 * 1024
# a data URL's payload longer than this is decoded in a thread: decoding 20 MiB of base64
# takes tens of milliseconds, which other requests on this loop must not wait for
_CHUNK_CHARS: Final = 256 * 1024
# and piece by piece there: base64's decoder holds the GIL for as long as one call lasts, so
# one call over the whole payload would stop the loop all the same (a piece takes ~2 ms)

_DATA_URL_SLACK: Final = 64 * 1024
# a run body's room beyond its data URLs' payloads: their headers, quotes and commas

_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_KINDS: Final = frozenset({"text", "image", "file"})
_MEDIA_FIELDS: Final = frozenset({"type", "file_id", "url", "filename", "media_type"})
_SUPPORTED: Final = IMAGE_MEDIA_TYPES | DOCUMENT_MEDIA_TYPES


@dataclass(frozen=True, slots=True)
class InputLimits:
    """The bounds of one run's input.

    ``max_media_bytes``: the bytes of its images and documents together (its files and its
    data URLs), what one model request can carry (providers take 20 to 50 MB a request,
    base64 included); the service uses ``AGENT_MAX_FILE_BYTES``.
    """

    max_media_bytes: int
    max_parts: int = DEFAULT_MAX_PARTS


def input_limits(files: FileService) -> InputLimits:
    """The service's bounds: a run's media come to one file's limit at most."""
    return InputLimits(max_media_bytes=files.max_bytes)


def run_body_limit(max_body_bytes: int, max_media_bytes: int) -> int:
    """The most a run start's body may carry: ``max_body_bytes`` of its own, plus the
    base64 of ``max_media_bytes`` in data URLs (and a little for their headers)."""
    return max_body_bytes + -(-max_media_bytes * 4 // 3) + _DATA_URL_SLACK


@dataclass(frozen=True, slots=True)
class RunInput:
    """A run's input once taken: its text (titles, records, logs) and its content parts
    (empty for a plain string), media by file id (``ref``) or ``https`` URL.

    ``stored``: the ids of the files this input's data URLs were stored as (the start of a
    run that is then refused deletes them again: ``discard_input``).
    """

    text: str
    parts: tuple[ContentPart, ...] = ()
    stored: tuple[str, ...] = ()


# --- taking it --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Media:
    """One media part, checked for shape; then its file, or its data URL's bytes."""

    index: int
    kind: str  # "image" or "file", as the part says
    filename: str | None
    declared: str | None  # the media type the part (or its data URL) declares
    file_id: str | None = None
    url: str | None = None
    file: FileRecord | None = None
    data: bytes | None = None

    @property
    def data_url(self) -> bool:
        return self.url is not None and self.url[:5].lower() == "data:"


class _Budget:
    """The media bytes of one run's input, against its limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def add(self, index: int, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise PayloadTooLarge(
                f"input[{index}] brings the run's images and documents to more than "
                f"{self.limit} bytes, the most one run takes: send fewer or smaller files",
                code="input_too_large",
                extra={"part": index, "max_media_bytes": self.limit},
            )


async def take_input(
    files: FileService | None,
    principal: str,
    value: str | Sequence[Mapping[str, Any]],
    *,
    limits: InputLimits | None = None,
) -> RunInput:
    """``value`` (a string, or native parts) as a run takes it.

    Checks every part first, then stores the data URLs as files of ``principal``; raises a
    domain error (see the module's table) with nothing stored. ``limits``: by default
    ``input_limits(files)``. Without ``files`` (a worker built without them) only text is
    taken: a media part is ``Unavailable``.
    """
    if isinstance(value, str):
        return RunInput(value)
    if not isinstance(value, list | tuple):  # a protocol's mapping may hand over anything
        raise InvalidRequest("input is a string or a list of content parts")
    if not value:
        raise InvalidRequest("input has no parts: give at least one", code="empty_input")
    max_parts = limits.max_parts if limits is not None else DEFAULT_MAX_PARTS
    if len(value) > max_parts:
        raise InvalidRequest(
            f"input has {len(value)} parts; a run takes at most {max_parts}: put the text in "
            "fewer parts, or send the files over several runs",
            code="too_many_parts",
            extra={"max_parts": max_parts},
        )
    texts: dict[int, str] = {}
    media: list[_Media] = []
    for index, raw in enumerate(value):
        if not isinstance(raw, Mapping):
            raise _invalid(index, "is not an object")
        kind = raw.get("type")
        if kind == "text":
            texts[index] = _text(index, raw)
        elif kind in ("image", "file"):
            media.append(_shape(index, kind, raw))
        else:
            raise _invalid(index, f"has type {str(kind)[:40]!r}; a part is text, image or file")
    if not media:
        only_text = tuple(TextPart(texts[index]) for index in range(len(value)))
        return RunInput(content_text(only_text), only_text)
    if files is None:
        raise Unavailable("this server keeps no files: it takes no images or documents")
    limits = limits or input_limits(files)
    budget = _Budget(limits.max_media_bytes)
    # sizes before any work: nothing is looked up or decoded for a run that is too large
    for item in media:
        if item.data_url and item.url is not None:
            budget.add(item.index, _base64_size(item.url))
    for item in media:
        if item.file_id is not None:
            item.file = await _caller_file(files, principal, item, item.file_id)
            budget.add(item.index, item.file.bytes)
        elif item.data_url:
            item.data = await _decode(item)
            if not _is_base64(item.url or ""):
                budget.add(item.index, len(item.data))
            _check_bytes(item, item.data)
    stored = await _store(files, principal, media)
    parts: list[ContentPart] = []
    by_index = {item.index: item for item in media}
    for index in range(len(value)):
        text = texts.get(index)
        parts.append(TextPart(text) if text is not None else _part(by_index[index]))
    return RunInput(content_text(parts), tuple(parts), stored)


async def discard_input(files: FileService, principal: str, taken: RunInput) -> None:
    """Delete the files ``taken``'s data URLs were stored as (its run did not start);
    best effort: what cannot be deleted now goes with the unreferenced uploads' retention."""
    for file_id in taken.stored:
        try:
            await files.delete(principal, file_id)
        except Exception as exc:  # a cleanup never hides why the start failed
            logger.warning("could not delete an input's file %s: %s", file_id, exc)


# --- the checks -------------------------------------------------------------------------------


def _invalid(index: int, what: str, code: str | None = None) -> InvalidRequest:
    return InvalidRequest(f"input[{index}] {what}", code=code, extra={"part": index})


def _unsupported(index: int, what: str) -> UnsupportedMediaType:
    return UnsupportedMediaType(f"input[{index}] {what}", extra={"part": index})


def _text(index: int, raw: Mapping[str, Any]) -> str:
    extra = set(raw) - {"type", "text"}
    if extra:
        raise _invalid(index, f"has fields a text part does not take: {_names(extra)}")
    text = raw.get("text")
    if not isinstance(text, str):
        raise _invalid(index, "is a text part whose text is not a string")
    if not text.strip():
        raise _invalid(index, "is a text part with no text", code="empty_input")
    return text


def _names(fields: set[Any]) -> str:
    return ", ".join(sorted(str(name)[:40] for name in fields)[:8])


def _optional_str(index: int, raw: Mapping[str, Any], name: str, longest: int) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > longest:
        raise _invalid(index, f"has a {name} that is not a string of 1 to {longest} characters")
    return value


def _shape(index: int, kind: str, raw: Mapping[str, Any]) -> _Media:
    """A media part's fields, checked for shape (nothing looked up or decoded yet)."""
    extra = set(raw) - _MEDIA_FIELDS
    if extra:
        raise _invalid(index, f"has fields a {kind} part does not take: {_names(extra)}")
    file_id, url = raw.get("file_id"), raw.get("url")
    if (file_id is None) == (url is None):
        raise _invalid(index, f"is a {kind} part: give exactly one of file_id and url")
    filename = _optional_str(index, raw, "filename", 255)
    declared = _optional_str(index, raw, "media_type", 255)
    if declared is not None:
        declared = normalise_media_type(declared)
    if declared is not None:
        if not _MEDIA_TYPE.match(declared):
            raise _invalid(index, f"has a media_type that is not one: {declared[:80]!r}")
        _check_declared(index, kind, declared)
    item = _Media(index, kind, filename, declared)
    if file_id is not None:
        if not isinstance(file_id, str) or not file_id:
            raise _invalid(index, "has a file_id that is not a non-empty string")
        item.file_id = file_id
        return item
    if not isinstance(url, str) or not url:
        raise _invalid(index, "has a url that is not a non-empty string")
    colon = url.find(":", 0, 16)
    scheme = url[:colon].lower() if colon > 0 else ""
    if scheme == "data":
        carried = _data_url_type(index, url)
        if declared is not None and carried and carried != declared:
            raise _unsupported(
                index, f"says its media type is {declared}, but its data: URL says {carried}"
            )
        if carried:
            _check_declared(index, kind, carried)
        item.declared = declared or carried or None
    elif scheme == "https":
        if len(url) > MAX_URL_CHARS or any(ch <= " " or ch == "\x7f" for ch in url):
            raise _invalid(
                index,
                f"has an https URL longer than {MAX_URL_CHARS} characters, or with white "
                "space or control characters in it",
                code="unsupported_url",
            )
    else:
        shown = f"a {scheme[:16]}: URL" if scheme else "a URL without a scheme"
        raise _invalid(
            index,
            f"has {shown}: give an https URL (handed to the model's provider, never fetched "
            "here), a data: URL (the bytes, stored as a file), or the file_id of a file "
            "uploaded to POST /v1/files",
            code="unsupported_url",
        )
    item.url = url
    return item


def _check_declared(index: int, kind: str, media_type: str) -> None:
    """A declared media type must be one the service takes, and an image for an image part."""
    allowed = IMAGE_MEDIA_TYPES if kind == "image" else _SUPPORTED
    if media_type not in allowed:
        takes = ", ".join(sorted(allowed))
        raise _unsupported(index, f"is an {kind} part of type {media_type}; it takes {takes}")


def _data_url_type(index: int, url: str) -> str:
    """The media type a data URL declares ('' for none); ``invalid_data_url`` without a
    comma in its header."""
    comma = url.find(",", 0, 300)  # only the header is read here, never the payload
    if comma < 0:
        raise _invalid(index, "has a data: URL without a comma", code="invalid_data_url")
    media_type = normalise_media_type(url[5:comma]) or ""
    if media_type and not _MEDIA_TYPE.match(media_type):
        raise _invalid(
            index, "has a data: URL whose media type is not one", code="invalid_data_url"
        )
    return media_type


def _is_base64(url: str) -> bool:
    header = url[: url.find(",", 0, 300)]
    return header.lower().endswith(";base64")


def _base64_size(url: str) -> int:
    """The size a base64 data URL decodes to (0 for a percent-encoded one, counted once
    decoded): computed from its length, so a run too large is refused before decoding."""
    if not _is_base64(url):
        return 0
    payload = len(url) - url.find(",") - 1
    padding = 2 if url.endswith("==") else 1 if url.endswith("=") else 0
    return max(0, payload * 3 // 4 - padding)


async def _decode(item: _Media) -> bytes:
    """The bytes of the item's data URL (in a thread when it is large)."""
    url = item.url or ""
    try:
        if len(url) > _OFFLOAD_CHARS:
            return await asyncio.to_thread(_decode_data_url, url)
        return _decode_data_url(url)
    except ValueError:  # binascii.Error is one; so is a non-ASCII payload
        raise _invalid(
            item.index,
            "has a data: URL whose payload does not decode: base64 (with ';base64' in its "
            "header, no line breaks) or percent-encoded bytes",
            code="invalid_data_url",
        ) from None


def _decode_data_url(url: str) -> bytes:
    """The bytes of a data URL; ValueError when its payload does not decode."""
    start = url.find(",") + 1
    if not _is_base64(url):
        return unquote_to_bytes(url[start:])
    if (len(url) - start) % 4:
        raise ValueError("base64 comes in groups of 4 characters")
    pieces: list[bytes] = []
    last = len(url)
    for at in range(start, last, _CHUNK_CHARS):
        piece = url[at : at + _CHUNK_CHARS]
        if at + _CHUNK_CHARS < last and "=" in piece:
            raise ValueError("base64 padding before the end")
        pieces.append(base64.b64decode(piece, validate=True))
    return b"".join(pieces)


def _check_bytes(item: _Media, data: bytes) -> None:
    """The data URL's bytes are what it declares, and of the part's kind."""
    index = item.index
    if not data:
        raise _invalid(index, "has a data: URL with no bytes", code="empty_file")
    seen = sniff_media_type(data)
    if seen is None or seen not in _SUPPORTED:
        raise _unsupported(
            index,
            "holds bytes of no type the service takes (PNG, JPEG, GIF, WebP, PDF, UTF-8 text)",
        )
    declared = item.declared
    text_family = seen == "text/plain" and (declared or "").startswith("text/")
    if declared is not None and declared != seen and not text_family:
        raise _unsupported(index, f"says it is {declared}, but its bytes are {seen}")
    if item.kind == "image" and seen not in IMAGE_MEDIA_TYPES:
        raise _unsupported(index, f"is an image part, but its bytes are {seen}")


def _no_file(index: int) -> NotFound:
    return NotFound(
        f"input[{index}] names no file of yours: upload it with POST /v1/files first",
        code="file_not_found",
        extra={"part": index},
    )


async def _caller_file(
    files: FileService, principal: str, item: _Media, file_id: str
) -> FileRecord:
    """The caller's file ``file_id``, of the part's kind and declared type."""
    try:
        record = await files.get(principal, file_id)
    except NotFound:
        raise _no_file(item.index) from None
    if item.kind == "image" and record.media_type not in IMAGE_MEDIA_TYPES:
        raise _unsupported(
            item.index, f"is an image part, but file {file_id} is {record.media_type}"
        )
    declared = item.declared
    texts = (declared or "").startswith("text/") and record.media_type.startswith("text/")
    if declared is not None and declared != record.media_type and not texts:
        raise _unsupported(
            item.index, f"says it is {item.declared}, but file {file_id} is {record.media_type}"
        )
    return record


async def _store(files: FileService, principal: str, media: Sequence[_Media]) -> tuple[str, ...]:
    """Store the data URLs as files of ``principal`` (the same URL twice, once); their ids.
    A refusal deletes what this call stored, and is raised with the part it concerns."""
    stored: dict[str, FileRecord] = {}
    try:
        for item in media:
            if item.data is None or item.url is None:
                continue
            record = stored.get(item.url)
            if record is None:
                try:
                    record = await files.put(
                        principal, item.data, filename=item.filename, declared=item.declared
                    )
                except ServiceError as exc:
                    exc.extra.setdefault("part", item.index)
                    exc.detail = f"input[{item.index}]: {exc.detail}"
                    raise
                stored[item.url] = record
            item.file = record
            item.data = None  # the bytes are the file's now
    except BaseException:
        taken = RunInput("", (), tuple(record.file_id for record in stored.values()))
        await asyncio.shield(discard_input(files, principal, taken))
        raise
    return tuple(record.file_id for record in stored.values())


def _part(item: _Media) -> ContentPart:
    """The runtime's part of a checked (and stored) media part."""
    record = item.file
    if record is not None:
        image = record.media_type in IMAGE_MEDIA_TYPES
        return (ImagePart if image else DocumentPart)(
            media_type=record.media_type,
            ref=record.file_id,
            size=record.bytes,
            sha256=record.sha256,
            filename=item.filename or record.filename,
        )
    image = item.kind == "image" or (item.declared or "") in IMAGE_MEDIA_TYPES
    return (ImagePart if image else DocumentPart)(
        media_type=item.declared, url=item.url, filename=item.filename
    )
