"""Content parts of a message: text, images and documents, and where their bytes live.

A user message's content is a string or a list of parts. An image or a document is given one
of three ways:

- ``data``: the bytes themselves, with their media type. The runtime stores them in its
  ``ContentStore`` when the run starts, so the conversation, its checkpoints and its log only
  ever hold the reference (``ref``); bytes never travel inline through serialisation.
- ``url``: an ``https`` URL (or a ``data:`` URL) handed to the provider as it is; the runtime
  never fetches it.
- ``ref``: the id of bytes a ``ContentStore`` holds. A provider asks the store for the bytes
  when it builds the request of a model call, and only then.

A model says which kinds it takes (``input_kinds``); a part it cannot take fails the call with
``UnsupportedContentError`` before any request is sent, never a silent drop.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from .errors import ContentError, UnsupportedContentError

__all__ = [
    "DOCUMENT_MEDIA_TYPES",
    "IMAGE_MEDIA_TYPES",
    "ContentError",
    "ContentPart",
    "ContentStore",
    "DocumentPart",
    "ImagePart",
    "MediaPart",
    "MemoryContentStore",
    "Prompt",
    "StoredContent",
    "TextPart",
    "UnsupportedContentError",
    "check_media",
    "check_prompt",
    "content_text",
    "media_kinds",
    "part_from_dict",
    "part_to_dict",
    "parts_from_dicts",
    "sniff_media_type",
    "store_parts",
]

#: Media types an ``ImagePart`` may carry.
IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: Media types a ``DocumentPart`` may carry.
DOCUMENT_MEDIA_TYPES = frozenset({"application/pdf", "text/plain", "text/markdown", "text/csv"})


@dataclass(frozen=True, slots=True)
class TextPart:
    """A piece of text."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class _Media:
    media_type: str | None = None
    data: bytes | None = None
    url: str | None = None
    ref: str | None = None
    size: int | None = None
    sha256: str | None = None
    filename: str | None = None

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.data, self.url, self.ref))
        if given != 1:
            raise ContentError(f"a {self.kind} part needs exactly one of data, url and ref")
        if self.data is not None and not self.media_type:
            raise ContentError(f"a {self.kind} part given as bytes needs its media_type")
        if self.ref is not None and not self.media_type:
            raise ContentError(f"a {self.kind} part given by ref needs its media_type")

    @property
    def kind(self) -> str:
        """``"image"`` or ``"document"``."""
        raise NotImplementedError

    def describe(self) -> str:
        """A short human line: kind, media type, size and a short hash, where known."""
        bits = [self.kind, self.media_type or "unknown type"]
        size = self.size if self.size is not None else (len(self.data) if self.data else None)
        if size is not None:
            bits.append(f"{size} bytes")
        digest = self.sha256 or (hashlib.sha256(self.data).hexdigest() if self.data else None)
        if digest:
            bits.append(f"sha256 {digest[:12]}")
        if self.url is not None and self.url.startswith("https:"):
            bits.append(f"at {self.url[:80]}")
        return ", ".join(bits)


@dataclass(frozen=True, slots=True)
class ImagePart(_Media):
    """An image (PNG, JPEG, GIF or WebP), as bytes, a URL, or a stored reference."""

    type: Literal["image"] = "image"

    @property
    def kind(self) -> str:
        return "image"


@dataclass(frozen=True, slots=True)
class DocumentPart(_Media):
    """A document (PDF, or plain text), as bytes, a URL, or a stored reference."""

    type: Literal["document"] = "document"

    @property
    def kind(self) -> str:
        return "document"


MediaPart: TypeAlias = ImagePart | DocumentPart
ContentPart: TypeAlias = TextPart | ImagePart | DocumentPart
#: What a run is asked: a string, or content parts.
Prompt: TypeAlias = str | Sequence[ContentPart]


@dataclass(frozen=True, slots=True)
class StoredContent:
    """What a ContentStore keeps of one blob: its id, media type, size and sha256."""

    ref: str
    media_type: str
    size: int
    sha256: str


@runtime_checkable
class ContentStore(Protocol):
    """Where the bytes of images and documents live; messages hold only their ``ref``.

    ``put`` stores bytes (for the run of ``session_id``, when there is one) and answers their
    reference; ``get`` answers the bytes of a reference. The HTTP service stores them as files
    owned by the session's principal; the default is ``MemoryContentStore``.
    """

    async def put(
        self, data: bytes, media_type: str, *, session_id: str | None = None
    ) -> StoredContent:
        """Store ``data``; identical bytes may answer the same reference."""
        ...

    async def get(self, ref: str) -> bytes:
        """The bytes of ``ref``; raises ContentError when there are none."""
        ...


class MemoryContentStore:
    """A ContentStore in this process's memory, keyed by sha256 (identical bytes stored once)."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    async def put(
        self, data: bytes, media_type: str, *, session_id: str | None = None
    ) -> StoredContent:
        digest = hashlib.sha256(data).hexdigest()
        ref = f"sha256:{digest}"
        self._blobs.setdefault(ref, bytes(data))
        return StoredContent(ref, media_type, len(data), digest)

    async def get(self, ref: str) -> bytes:
        try:
            return self._blobs[ref]
        except KeyError:
            raise ContentError(f"no stored content {ref!r}") from None


def content_text(content: str | Sequence[ContentPart] | None) -> str:
    """The text of a message's content: the string, or its text parts joined by a blank line."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n\n".join(p.text for p in content if isinstance(p, TextPart))


def check_prompt(prompt: object) -> str | list[ContentPart]:
    """``prompt`` as a run takes it: a string, or a list of content parts (at least one).

    Raises ContentError for anything else, and for bytes that are not what their media type
    says (``check_media``).
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, bytes | bytearray) or not isinstance(prompt, Sequence):
        raise ContentError("a prompt is a string or a list of content parts")
    parts = list(prompt)
    if not parts:
        raise ContentError("a prompt needs at least one content part")
    for part in parts:
        if not isinstance(part, TextPart | ImagePart | DocumentPart):
            raise ContentError(f"not a content part: {type(part).__name__}")
        if not isinstance(part, TextPart) and part.data is not None:
            check_media(part, part.data)
    return parts


def check_media(part: MediaPart, data: bytes) -> None:
    """Raise ContentError unless ``data`` is what ``part``'s media type says, of its kind."""
    declared = (part.media_type or "").lower()
    allowed = IMAGE_MEDIA_TYPES if part.kind == "image" else DOCUMENT_MEDIA_TYPES
    if declared not in allowed:
        raise ContentError(f"{declared or 'no media type'} is not a media type of a {part.kind}")
    seen = sniff_media_type(data)
    if seen == declared or (seen == "text/plain" and declared.startswith("text/")):
        return
    raise ContentError(f"the {part.kind}'s bytes are {seen or 'of no known type'}, not {declared}")


async def store_parts(
    parts: Sequence[ContentPart], store: ContentStore, session_id: str | None
) -> list[ContentPart]:
    """``parts`` with every part given as bytes stored in ``store`` and replaced by its ref."""
    stored: list[ContentPart] = []
    for part in parts:
        if isinstance(part, TextPart) or part.data is None:
            stored.append(part)
            continue
        media_type = part.media_type or "application/octet-stream"
        kept = await store.put(part.data, media_type, session_id=session_id)
        stored.append(
            type(part)(
                media_type=kept.media_type,
                ref=kept.ref,
                size=kept.size,
                sha256=kept.sha256,
                filename=part.filename,
            )
        )
    return stored


def media_kinds(parts: Iterable[ContentPart]) -> set[str]:
    """The kinds (``image``, ``document``) among ``parts``."""
    return {p.kind for p in parts if not isinstance(p, TextPart)}


# media type sniffing ---------------------------------------------------------------------------

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)


def sniff_media_type(data: bytes) -> str | None:
    """The media type ``data``'s own bytes show (PNG, JPEG, GIF, WebP, PDF, UTF-8 text), or None.

    Reads at most the first 8 KiB; never trusts a name or a declared type.
    """
    head = data[:8192]
    for signature, media_type in _SIGNATURES:
        if head.startswith(signature):
            return media_type
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if not head or b"\x00" in head:
        return None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # a multi-byte character cut by the 8 KiB window is still text
        if exc.start < len(head) - 4:
            return None
    return "text/plain"


# the JSON form ---------------------------------------------------------------------------------


def part_to_dict(part: ContentPart) -> dict[str, Any]:
    """A part's JSON form. A media part given as bytes raises ContentError: store it first
    (``ContentStore.put``), so that no serialised message ever holds inline bytes."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if part.data is not None:
        raise ContentError(f"a {part.kind} part given as bytes must be stored before it is saved")
    data: dict[str, Any] = {"type": part.kind}
    if part.ref is not None:
        data["ref"] = part.ref
    if part.url is not None:
        data["url"] = part.url
    for key in ("media_type", "size", "sha256", "filename"):
        value = getattr(part, key)
        if value is not None:
            data[key] = value
    return data


def part_from_dict(data: dict[str, Any]) -> ContentPart:
    """Rebuild a part from ``part_to_dict``'s form; raises ContentError on a bad shape."""
    kind = data.get("type")
    if kind == "text":
        return TextPart(str(data.get("text") or ""))
    if kind not in ("image", "document"):
        raise ContentError(f"unknown content part type: {kind!r}")
    cls: type[ImagePart] | type[DocumentPart] = ImagePart if kind == "image" else DocumentPart
    size = data.get("size")
    return cls(
        media_type=_opt_str(data.get("media_type")),
        url=_opt_str(data.get("url")),
        ref=_opt_str(data.get("ref")),
        size=int(size) if isinstance(size, int) else None,
        sha256=_opt_str(data.get("sha256")),
        filename=_opt_str(data.get("filename")),
    )


def parts_from_dicts(items: Iterable[dict[str, Any]]) -> list[ContentPart]:
    """Rebuild a list of parts from their JSON form."""
    return [part_from_dict(item) for item in items]


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def data_url(media_type: str, data: bytes) -> str:
    """``data:<media_type>;base64,<data>`` (what OpenAI's wire takes for inline bytes)."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
