"""A ``multipart/form-data`` upload read as it arrives, its file part written to a staged file.

The body is fed to python-multipart's push parser piece by piece, as the server receives it;
the file part's bytes go to a ``StagedUpload`` (a temporary file, hashed and checked on a worker
thread), so the event loop only frames the body and memory holds about one write's worth of the
file. Reading stops at the first byte past the file limit (``PayloadTooLarge``). Parts other
than the file are read and dropped (the body limit bounds them); a second file part, a body
without one, or a body that is not multipart are refused.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote_to_bytes

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

from app.errors import InvalidRequest, UnsupportedMediaType
from app.files import StagedUpload

__all__ = ["FILE_FIELD", "Upload", "read_upload"]

FILE_FIELD: Final = "file"
"""The name of the form field that carries the file."""

# ``filename*=charset'language'percent-encoded`` (RFC 5987, RFC 6266)
_EXTENDED_FILENAME: Final = re.compile(r"filename\*\s*=\s*([A-Za-z0-9_-]+)'[^']*'([^;\s]+)", re.I)
# a part's headers: a few lines of at most this much each
_MAX_HEADER_BYTES: Final = 8192


@dataclass(slots=True)
class _Part:
    headers: dict[str, str] = field(default_factory=dict)
    field_name: bytes = b""
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class Upload:
    """The file part of an upload: its staged bytes, its name and its declared type."""

    staged: StagedUpload
    filename: str | None
    declared: str | None


def _text(raw: bytes) -> str:
    """A header's text: UTF-8 as browsers send a file name, else Latin-1 (never fails)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data":
        raise UnsupportedMediaType(
            f"send the file as multipart/form-data, in a field named {FILE_FIELD!r}"
        )
    boundary = options.get(b"boundary")
    if not boundary:
        raise InvalidRequest("the multipart/form-data Content-Type has no boundary")
    return boundary


def _disposition(part: _Part) -> tuple[str | None, str | None]:
    """The part's form field name and file name (RFC 7578; ``filename*`` is RFC 5987's, which
    python-multipart's header parser leaves out)."""
    header = part.headers.get("content-disposition", "")
    _, options = parse_options_header(header.encode("utf-8"))
    name = options.get(b"name")
    extended = _EXTENDED_FILENAME.search(header)
    decoded: str | None = None
    if extended is not None:
        charset, encoded = extended.group(1), extended.group(2)
        raw = unquote_to_bytes(encoded)
        decoded = raw.decode("utf-8" if charset.lower() == "utf-8" else "latin-1", "replace")
    elif (plain := options.get(b"filename")) is not None:
        # browsers (the HTML standard's form encoding) and httpx send a quote as %22
        decoded = _text(plain).replace("%22", '"')
    return (None if name is None else _text(name)), decoded


class _Form:
    """The push parser's callbacks: the parts' headers, and the file part's bytes since the
    last write (``pieces``)."""

    def __init__(self) -> None:
        self.part = _Part()
        self.pieces: list[bytes] = []
        self.file: _Part | None = None
        self.in_file = False
        self.done = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.part.field_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.part.value += data[start:end]
        if len(self.part.value) > _MAX_HEADER_BYTES:
            raise InvalidRequest("a multipart header is too long")

    def on_header_end(self) -> None:
        part = self.part
        part.headers[part.field_name.decode("latin-1").strip().lower()] = _text(part.value).strip()
        part.field_name, part.value = b"", b""

    def on_headers_finished(self) -> None:
        name, _ = _disposition(self.part)
        self.in_file = name == FILE_FIELD
        if self.in_file:
            if self.file is not None:
                raise InvalidRequest(f"send one file per request (one {FILE_FIELD!r} field)")
            self.file = self.part

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.in_file:
            self.pieces.append(data[start:end])

    def on_part_end(self) -> None:
        self.in_file = False

    def on_end(self) -> None:
        self.done = True


async def read_upload(
    chunks: AsyncIterator[bytes], content_type: str | None, staged: StagedUpload
) -> Upload:
    """Read a multipart body from ``chunks`` into ``staged``; the file part's name and type.

    Raises ``UnsupportedMediaType`` for a body that is not multipart, ``InvalidRequest`` for
    a malformed one or one without exactly one ``file`` part, and ``PayloadTooLarge`` as soon
    as the file passes the limit. The caller discards ``staged`` on any error.
    """
    boundary = _boundary(content_type)
    form = _Form()
    try:
        parser = MultipartParser(boundary, form.callbacks())
    except FormParserError as exc:  # a boundary too long
        raise InvalidRequest(f"the multipart Content-Type is not usable: {exc}") from None
    async for chunk in chunks:
        if not chunk:
            continue
        try:
            parser.write(chunk)
        except FormParserError as exc:
            raise InvalidRequest(f"the multipart body is malformed: {exc}") from None
        for piece in form.pieces:
            await staged.write(piece)
        form.pieces.clear()
        if form.done:
            break
    with contextlib.suppress(FormParserError):
        parser.finalize()
    if not form.done:
        raise InvalidRequest("the multipart body ends before its closing boundary")
    if form.file is None:
        raise InvalidRequest(f"the form has no {FILE_FIELD!r} field")
    await staged.finish()
    _, filename = _disposition(form.file)
    return Upload(staged, filename, form.file.headers.get("content-type"))
