"""Images and documents in the protocols' own parts, as the native run input's parts.

Each protocol names media its own way: Responses ``input_image`` / ``input_file``, Chat
Completions ``image_url`` / ``file``, the AI SDK's ``file`` part, AG-UI's ``image`` /
``document`` parts (and the draft's ``binary``), A2A's file parts. Each protocol's module maps
its parts to the native run input's parts, the ones ``POST /v1/sessions/{id}/runs`` takes::

    {"type": "text", "text": ...}
    {"type": "image", "file_id" | "url": ...}
    {"type": "file", "file_id" | "url": ..., "filename"?: ...}

where ``url`` is an ``https`` URL or a ``data:`` URL. From there a protocol's run starts as a
native one does (``app.files.intake``): data URLs are stored as files of the caller, file ids
must name the caller's files, bytes must be what their media type says, and the stored
conversation holds file references only, whichever path brought them.

What a protocol's part can say that the run cannot take (audio, video, a provider's own file
handle, a URL of another scheme, a declared media type its own data contradicts) is refused
here with ``PartRefused``, named by the protocol's own field; never dropped.
"""

from __future__ import annotations

import asyncio
import base64
import mimetypes
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from agent_runtime.content import ContentPart
from app.errors import ServiceError, UnsupportedMediaType
from app.files import FileService
from app.files.intake import RunInput, discard_input, input_limits, take_input
from app.http.protocols.common import RefusedValue
from app.server.services import Services

__all__ = [
    "FILE_PROVIDER",
    "WHERE",
    "NativePart",
    "PartRefused",
    "TakenInput",
    "data_url",
    "data_url_of_bytes",
    "data_url_type",
    "has_media",
    "kind_of",
    "media_part",
    "media_refused",
    "parts_text",
    "run_input",
    "text_part",
    "unsupported_kind",
]

NativePart = dict[str, Any]
"""One part of the native run input (``{"type": "text" | "image" | "file", ...}``)."""

FILE_PROVIDER = "agent-server"
"""Who issues the file ids of ``POST /v1/files``, where a protocol names a file's issuer
(AG-UI's ``file`` source ``provider``)."""

_DATA = "data:"


class PartRefused(RefusedValue):
    """A part a protocol's request carries that the run cannot take as it is (its shape).

    ``param`` names the part in the protocol's own terms (``input[0].content[1]``); it is in
    ``extra`` too, so a problem answer carries it.
    """

    def __init__(self, param: str, detail: str) -> None:
        super().__init__(param, detail)
        self.extra["param"] = param


def media_refused(param: str, detail: str) -> UnsupportedMediaType:
    """The refusal of a part's media (audio, video, a type its own data contradicts):
    ``unsupported_media_type``, as the intake refuses bytes of a type it does not take."""
    return UnsupportedMediaType(detail, extra={"param": param})


def unsupported_kind(param: str, kind: str) -> UnsupportedMediaType:
    """The refusal of an audio or video part (``kind``), which no agent here takes."""
    return media_refused(
        param, f"{param}: {kind} input is not supported; send images and documents"
    )


WHERE = "where"
"""The key under which a mapped part keeps its name in the protocol (``input[0].content[1]``),
for a refusal to name it; taken off before the parts go to the intake."""


def text_part(text: str) -> NativePart:
    """A native text part."""
    return {"type": "text", "text": text}


def kind_of(media_type: str | None) -> Literal["image", "file"] | None:
    """``image`` for an ``image/...`` media type (or the bare ``image`` the AI SDK allows),
    ``file`` for any other, None when there is none."""
    if not media_type:
        return None
    return "image" if media_type.lower().split("/", 1)[0].strip() == "image" else "file"


def data_url_type(url: str) -> str | None:
    """The media type a ``data:`` URL declares (lower case, no parameters); None for a URL of
    another scheme, and ``""`` for a data URL that declares none."""
    head = url[:300]  # only the header is read, never the payload
    if head[:5].lower() != _DATA:
        return None
    comma = head.find(",")
    header = head[5:comma] if comma >= 0 else head[5:]
    return header.split(";", 1)[0].strip().lower()


def data_url(media_type: str, encoded: str) -> str:
    """``data:<media_type>;base64,<encoded>`` (``encoded`` is base64 already)."""
    return f"data:{media_type};base64,{encoded}"


_ENCODE_PIECE = 192 * 1024  # a multiple of 3: the pieces' base64 joins into the whole's


def data_url_of_bytes(media_type: str, data: bytes) -> str:
    """A data URL holding ``data``; call it off the event loop when ``data`` is large.

    Encoded piece by piece: the encoder holds the GIL for as long as one call lasts, so one
    call over megabytes would stop the event loop even from a thread (a piece takes ~1 ms).
    """
    pieces = [
        base64.b64encode(data[at : at + _ENCODE_PIECE]).decode("ascii")
        for at in range(0, len(data), _ENCODE_PIECE)
    ]
    return data_url(media_type, "".join(pieces))


def _check_url(url: str, param: str) -> None:
    scheme = urlsplit(url[:2048]).scheme.lower() if ":" in url[:64] else ""
    if scheme not in ("https", "data"):
        shown = f"{scheme}: URLs" if scheme else "URLs without a scheme"
        raise PartRefused(
            param,
            f"{param}: {shown} cannot be used: give an https URL, a data: URL (the bytes, "
            "base64), or the file_id of a file uploaded to POST /v1/files",
        )


def _agree(declared: str | None, url: str, param: str) -> str | None:
    """The media type of the part: the declared one, which a data URL must agree with."""
    carried = data_url_type(url)
    if carried is None or not declared:
        return declared or carried or None
    declared_type = declared.split(";", 1)[0].strip().lower()
    if "/" in declared_type and not declared_type.endswith("/*"):
        agrees = declared_type == carried
    else:  # a top-level type only ("image", "image/*")
        agrees = carried.split("/", 1)[0] == declared_type.split("/", 1)[0]
    if not agrees:
        raise media_refused(
            param,
            f"{param} says its media type is {declared_type}, but its data: URL says "
            f"{carried or 'none'}",
        )
    return carried or declared_type


def _guess_type(url: str) -> str | None:
    path = urlsplit(url[:2048]).path
    guessed, _ = mimetypes.guess_type(path, strict=False)
    return guessed


def media_part(
    param: str,
    *,
    url: str | None = None,
    file_id: str | None = None,
    media_type: str | None = None,
    filename: str | None = None,
    kind: Literal["image", "file"] | None = None,
) -> NativePart:
    """The native part of an image or a document given by ``url`` (https or data) or
    ``file_id``; ``kind`` when the protocol's part says it, else told by the media type.

    ``media_type`` is what the protocol's part declares: a data URL must agree with it.
    Raises ``PartRefused`` (named ``param``) for no source or two, a URL of another scheme,
    or a URL whose kind nothing tells; ``UnsupportedMediaType`` for a data URL that
    contradicts the declared media type, and for audio and video.
    """
    if (url is None) == (file_id is None):
        raise PartRefused(
            param, f"{param}: give exactly one of a URL (https or data:) and a file id"
        )
    part: NativePart = {WHERE: param}
    declared = media_type
    if url is not None:
        if not url:
            raise PartRefused(param, f"{param}: the URL is empty")
        _check_url(url, param)
        declared = _agree(media_type, url, param)
        top = (declared or "").split("/", 1)[0]
        if top in ("audio", "video"):
            raise unsupported_kind(param, top)
        kind = kind or kind_of(declared) or kind_of(_guess_type(url))
        if kind is None:
            raise PartRefused(
                param,
                f"{param}: nothing says whether this URL is an image or a document: give "
                "its media type",
            )
        part.update(type=kind, url=url)
    else:
        assert file_id is not None
        if not file_id:
            raise PartRefused(param, f"{param}: the file id is empty")
        # a file's stored media type decides what it is; the declared one is a hint
        part.update(type=kind or kind_of(media_type) or "file", file_id=file_id)
    full = _full_type(declared)
    if full is not None:
        part["media_type"] = full
    if filename:
        part["filename"] = filename
    return part


def _full_type(media_type: str | None) -> str | None:
    """``type/subtype`` of a declared media type; None for none or a top-level one only."""
    if not media_type:
        return None
    bare = media_type.split(";", 1)[0].strip().lower()
    if "/" not in bare or bare.endswith("/*"):
        return None
    return bare


def has_media(parts: Sequence[NativePart]) -> bool:
    """True if ``parts`` hold an image or a document (not only text)."""
    return any(part["type"] != "text" for part in parts)


def parts_text(parts: Sequence[NativePart], separator: str = "\n") -> str:
    """The text of the text parts, joined."""
    return separator.join(part["text"] for part in parts if part["type"] == "text")


class TakenInput:
    """A protocol request's run input once taken: its ``text`` and its ``parts`` (empty for
    text alone), for the run's ``RunRequestOptions``.

    An async context manager around the run's start: should the start fail (or be refused),
    the files its data URLs were stored as are deleted again.
    """

    __slots__ = ("_files", "_principal", "_taken")

    def __init__(self, taken: RunInput, files: FileService | None, principal: str) -> None:
        self._taken = taken
        self._files = files
        self._principal = principal

    @property
    def text(self) -> str:
        """The run's text (its record, its title, its logs)."""
        return self._taken.text

    @property
    def parts(self) -> tuple[ContentPart, ...]:
        """The run's content parts, media by file id or https URL; empty for text alone."""
        return self._taken.parts

    async def __aenter__(self) -> TakenInput:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None and self._files is not None and self._taken.stored:
            await asyncio.shield(discard_input(self._files, self._principal, self._taken))


async def run_input(
    services: Services,
    principal: str,
    parts: Sequence[NativePart],
    *,
    separator: str = "\n",
) -> TakenInput:
    """The run input of ``parts``, taken as the native run start takes its parts
    (``app.files.intake.take_input``): data URLs stored as the caller's files, file ids
    checked to be the caller's, bytes checked against their media type. Text alone is the
    text, its parts joined by ``separator``, exactly as a string input.

    Raises the intake's domain errors (``UnsupportedMediaType``, ``NotFound``
    ``file_not_found``, ``PayloadTooLarge``, ``InvalidRequest``), their message naming the
    part as the protocol does and ``extra["param"]`` that name, for each protocol's edge to
    answer in its own shape.
    """
    if not has_media(parts):
        return TakenInput(RunInput(parts_text(parts, separator)), None, principal)
    # white space between media is no content (and a text part of none is refused)
    kept = [p for p in parts if p["type"] != "text" or p["text"].strip()]
    wheres = [part.get(WHERE) for part in kept]
    native = [{k: v for k, v in part.items() if k != WHERE} for part in kept]
    files = services.files
    if files is None:  # a worker assembled without its files (some tests' services)
        raise PartRefused("input", "this server takes no images or documents")
    try:
        taken = await take_input(files, principal, native, limits=input_limits(files))
    except ServiceError as exc:
        raise _named(exc, wheres) from None
    return TakenInput(taken, files, principal)


def _named(exc: ServiceError, wheres: Sequence[str | None]) -> ServiceError:
    """``exc`` with the native part it names (``input[2]``) named as the protocol does."""
    index = exc.extra.pop("part", None)
    if isinstance(index, int) and 0 <= index < len(wheres):
        where = wheres[index]
        if where is not None:
            exc.detail = exc.detail.replace(f"input[{index}]", where, 1)
            exc.extra["param"] = where
    return exc
