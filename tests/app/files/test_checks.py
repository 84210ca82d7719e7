"""What a file's bytes are: sniffed from the bytes, never from the name or the declared type,
and refused when they are of no type taken, not what was declared, empty, cut short or too
large."""

from __future__ import annotations

import hashlib

import pytest

from app.errors import InvalidRequest, PayloadTooLarge, ServiceError, UnsupportedMediaType
from app.files.checks import ContentCheck, check_content, normalise_media_type
from tests.support.files import gif, jpeg, pdf, png, webp, zip_archive

LIMIT = 1 << 20


def _type(data: bytes, declared: str | None = None, filename: str | None = None) -> str:
    return check_content(data, limit=LIMIT, declared=declared, filename=filename)[0]


def _refusal(data: bytes, declared: str | None = None, filename: str | None = None) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        check_content(data, limit=LIMIT, declared=declared, filename=filename)
    return caught.value


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (png(), "image/png"),
        (jpeg(), "image/jpeg"),
        (gif(), "image/gif"),
        (webp(), "image/webp"),
        (pdf(), "application/pdf"),
        ("naïve text\n".encode(), "text/plain"),
    ],
)
def test_the_type_is_found_in_the_bytes(data: bytes, expected: str) -> None:
    assert _type(data) == expected
    assert _type(data, declared=expected) == expected
    # a name that says otherwise changes nothing
    assert _type(data, filename="report.exe") == expected


def test_the_sha256_is_of_the_bytes() -> None:
    data = png(100)
    assert check_content(data, limit=LIMIT)[1] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("data", "declared"),
    [
        (png(), "image/jpeg"),
        (jpeg(), "image/png"),
        (pdf(), "image/png"),
        (png(), "application/pdf"),
        (png(), "text/plain"),
        (b"plain words", "image/png"),
        (b"plain words", "application/pdf"),
    ],
)
def test_a_lying_declared_type_is_refused(data: bytes, declared: str) -> None:
    refusal = _refusal(data, declared=declared)
    assert isinstance(refusal, UnsupportedMediaType)
    assert refusal.code == "unsupported_media_type"
    assert declared in refusal.detail


def test_a_zip_named_pdf_and_declared_pdf_is_refused() -> None:
    refusal = _refusal(zip_archive(), declared="application/pdf", filename="invoice.pdf")
    assert isinstance(refusal, UnsupportedMediaType)
    assert "no type the service takes" in refusal.detail


@pytest.mark.parametrize(
    "data",
    [
        b"MZ\x90\x00\x03\x00\x00\x00",  # a Windows executable
        b"\x00\x01\x02\x03 binary",  # a NUL: not text
        b"\xff\xfe\x00t\x00e\x00x\x00t",  # UTF-16 is not taken as text
        b"text " * 2000 + b"\xc3\x28",  # invalid UTF-8 past the sniffed 8 KiB head
    ],
)
def test_bytes_of_no_type_taken_are_refused(data: bytes) -> None:
    assert isinstance(_refusal(data), UnsupportedMediaType)


def test_an_empty_file_is_refused() -> None:
    refusal = _refusal(b"")
    assert isinstance(refusal, InvalidRequest)
    assert refusal.code == "empty_file"


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (png()[:-12], "a PNG without its IEND chunk"),
        (png(4000)[:2000], "a PNG cut in its middle"),
        (png()[:8] + b"\x00\x00\x00\x00JUNK" + png()[16:], "a PNG whose first chunk is no IHDR"),
        (jpeg()[:-2], "a JPEG without its end marker"),
        (jpeg(3000)[:1500], "a JPEG cut in its middle"),
        (gif()[:-1], "a GIF without its trailer"),
        (webp()[:-4], "a WebP shorter than its RIFF header says"),
        (pdf().replace(b"%%EOF", b"%%END"), "a PDF without %%EOF"),
        (pdf()[:60], "a PDF cut short"),
    ],
)
def test_a_file_cut_short_is_refused(data: bytes, what: str) -> None:
    refusal = _refusal(data)
    assert isinstance(refusal, InvalidRequest), what
    assert refusal.code == "malformed_file", what


def test_text_cut_in_a_character_is_not_text() -> None:
    assert isinstance(_refusal("café".encode()[:-1]), UnsupportedMediaType)


def test_text_takes_its_declared_text_type_or_its_extension() -> None:
    assert _type(b"# Title\n", declared="text/markdown") == "text/markdown"
    assert _type(b"a,b\n1,2\n", declared="text/csv; charset=utf-8") == "text/csv"
    assert _type(b"a,b\n1,2\n", filename="table.CSV") == "text/csv"
    assert _type(b"# Title\n", filename="notes.md") == "text/markdown"
    assert _type(b"# Title\n", filename="notes.txt") == "text/plain"
    # an extension only picks among text types
    assert _type(png(), filename="notes.md") == "image/png"


def test_octet_stream_and_aliases_count_as_their_type() -> None:
    assert normalise_media_type("application/octet-stream") is None
    assert normalise_media_type(" Image/JPG ; q=1") == "image/jpeg"
    assert normalise_media_type(None) is None
    assert _type(png(), declared="application/octet-stream") == "image/png"
    assert _type(jpeg(), declared="image/jpg") == "image/jpeg"


def test_feeding_past_the_limit_stops_at_once() -> None:
    check = ContentCheck(limit=10)
    check.feed(b"12345")
    with pytest.raises(PayloadTooLarge) as caught:
        check.feed(b"678901")
    assert caught.value.code == "payload_too_large"
    assert check.size == 5  # the piece that passed the limit was not taken


def test_pieces_give_the_verdict_of_the_whole() -> None:
    data = png(50_000, seed=3)
    whole = check_content(data, limit=LIMIT)
    check = ContentCheck(LIMIT)
    for start in range(0, len(data), 777):
        check.feed(data[start : start + 777])
    assert (check.media_type(), check.sha256) == whole
    # a text whose multi-byte characters are cut between pieces is still text
    text = ("ü" * 5000).encode()
    pieces = ContentCheck(LIMIT)
    for start in range(0, len(text), 333):
        pieces.feed(text[start : start + 333])
    assert pieces.media_type() == "text/plain"
