"""What an uploaded file's bytes are, found from the bytes alone, and whether they are whole.

``ContentCheck`` is fed a file piece by piece (as an upload arrives, or all at once): it counts,
hashes, keeps the head and the tail, and follows whether the bytes are UTF-8 text. Its
``media_type`` gives the verdict, and refuses, with a stable code:

- ``empty_file`` (422): no bytes at all;
- ``unsupported_media_type`` (415): bytes of no type the service takes (PNG, JPEG, GIF, WebP,
  PDF, UTF-8 text), or of another type than the declared one (a ZIP declared ``application/pdf``
  and named ``x.pdf`` is refused: neither the name nor the declared type is trusted);
- ``malformed_file`` (422): bytes of a type taken, but cut short or broken (a PNG without its
  IEND chunk, a JPEG without its end marker, a GIF without its trailer, a WebP shorter than its
  RIFF header says, a PDF without ``%%EOF``);
- ``payload_too_large`` (413): more bytes than the limit, raised by ``feed`` as soon as they
  pass it.

A declared ``application/octet-stream`` (what clients send when they do not know) counts as
not declared. UTF-8 text is stored as the declared ``text/plain``, ``text/markdown`` or
``text/csv``; undeclared, as the file name's extension suggests among those (the name only
picks among text types, never makes bytes text).
"""

from __future__ import annotations

import codecs
import hashlib
from typing import Final

from agent_runtime.content import DOCUMENT_MEDIA_TYPES, IMAGE_MEDIA_TYPES, sniff_media_type
from app.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

__all__ = ["ACCEPTED_MEDIA_TYPES", "ContentCheck", "check_content", "normalise_media_type"]

#: Every media type a file may have.
ACCEPTED_MEDIA_TYPES: Final = IMAGE_MEDIA_TYPES | DOCUMENT_MEDIA_TYPES

_HEAD: Final = 8192
_TAIL: Final = 1024
_ALIASES: Final = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "text/x-markdown": "text/markdown",
}
_UNDECLARED: Final = frozenset({"", "application/octet-stream", "binary/octet-stream"})
_TEXT_BY_EXTENSION: Final = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
}
_PNG_IHDR: Final = b"\x00\x00\x00\rIHDR"
_PNG_IEND: Final = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_WEBP_CHUNKS: Final = (b"VP8 ", b"VP8L", b"VP8X")


def normalise_media_type(value: str | None) -> str | None:
    """A declared media type without parameters, lower case, aliases resolved; None for none
    or ``application/octet-stream``."""
    if value is None:
        return None
    bare = value.split(";", 1)[0].strip().lower()
    if bare in _UNDECLARED:
        return None
    return _ALIASES.get(bare, bare)


class ContentCheck:
    """Size, sha256 and type of bytes fed to it piece by piece (see the module docstring).

    ``feed`` hashes and decodes: call it off the event loop for large pieces.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._hash = hashlib.sha256()
        self._head = bytearray()
        self._tail = b""
        self._text: codecs.IncrementalDecoder | None = codecs.getincrementaldecoder("utf-8")()

    @property
    def sha256(self) -> str:
        """The hex sha256 of the bytes fed so far."""
        return self._hash.hexdigest()

    def feed(self, piece: bytes) -> None:
        """Take the next bytes; ``PayloadTooLarge`` once there are more than ``limit``."""
        if self.size + len(piece) > self.limit:
            raise PayloadTooLarge(f"the file is larger than {self.limit} bytes")
        self.size += len(piece)
        self._hash.update(piece)
        if len(self._head) < _HEAD:
            self._head += piece[: _HEAD - len(self._head)]
        self._tail = (self._tail + piece[-_TAIL:])[-_TAIL:]
        if self._text is not None:
            try:
                self._text.decode(piece)
            except UnicodeDecodeError:
                self._text = None
            else:
                if b"\x00" in piece:
                    self._text = None

    def media_type(self, *, declared: str | None = None, filename: str | None = None) -> str:
        """The media type the bytes are; raises as the module docstring says."""
        if self.size == 0:
            raise InvalidRequest("the file is empty", code="empty_file")
        seen = sniff_media_type(bytes(self._head))
        if seen == "text/plain" and not self._whole_text():
            seen = None
        wanted = normalise_media_type(declared)
        if seen is None:
            raise UnsupportedMediaType(
                "the file's bytes are of no type the service takes: "
                + ", ".join(sorted(ACCEPTED_MEDIA_TYPES))
            )
        if seen == "text/plain":
            media_type = self._text_type(wanted, filename)
        elif wanted is not None and wanted != seen:
            raise UnsupportedMediaType(f"the file was declared {wanted}, but its bytes are {seen}")
        else:
            media_type = seen
        self._check_whole(media_type)
        return media_type

    def _whole_text(self) -> bool:
        if self._text is None:
            return False
        try:
            self._text.decode(b"", final=True)  # a character cut at the end is not text
        except UnicodeDecodeError:
            self._text = None
            return False
        return True

    def _text_type(self, wanted: str | None, filename: str | None) -> str:
        if wanted is None:
            name = (filename or "").lower()
            return next(
                (kind for ext, kind in _TEXT_BY_EXTENSION.items() if name.endswith(ext)),
                "text/plain",
            )
        if wanted.startswith("text/") and wanted in DOCUMENT_MEDIA_TYPES:
            return wanted
        raise UnsupportedMediaType(f"the file was declared {wanted}, but its bytes are text")

    def _check_whole(self, media_type: str) -> None:
        head, tail = bytes(self._head), self._tail
        if media_type == "image/png":
            whole = head[8:16] == _PNG_IHDR and tail.endswith(_PNG_IEND)
        elif media_type == "image/jpeg":
            # FF D9 is the end of image; entropy-coded data never holds it, so finding it in
            # the last KiB tells a whole file (some writers pad after it) from a cut one
            whole = b"\xff\xd9" in tail
        elif media_type == "image/gif":
            whole = tail.rstrip(b"\x00").endswith(b";")
        elif media_type == "image/webp":
            declared_size = int.from_bytes(head[4:8], "little") + 8
            whole = head[12:16] in _WEBP_CHUNKS and declared_size <= self.size
        elif media_type == "application/pdf":
            whole = b"%%EOF" in tail
        else:
            whole = True  # text: decoded whole already
        if not whole:
            raise InvalidRequest(
                f"the file is {media_type} but not whole: cut short or broken",
                code="malformed_file",
            )


def check_content(
    data: bytes, *, limit: int, declared: str | None = None, filename: str | None = None
) -> tuple[str, str]:
    """``data``'s media type and sha256, or the refusal ``ContentCheck`` raises (blocking:
    run it off the event loop for large data)."""
    check = ContentCheck(limit)
    check.feed(data)
    return check.media_type(declared=declared, filename=filename), check.sha256
