"""The multipart reader of ``POST /v1/files``: the file part written as it arrives, in pieces of
any size, and reading stopped at the first piece past the file limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from app.files import StagedUpload
from app.http.api.files import content_disposition
from app.http.api.multipart import read_upload
from tests.support.files import png

BOUNDARY = "----form7MA4YWxkTrZu0gW"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def _form(data: bytes, disposition: str = 'name="file"; filename="a.png"') -> bytes:
    return (
        (
            f"--{BOUNDARY}\r\n"
            'Content-Disposition: form-data; name="note"\r\n\r\n'
            "a field before the file\r\n"
            f"--{BOUNDARY}\r\n"
            f"Content-Disposition: form-data; {disposition}\r\n"
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )


def _entries(directory: Path) -> list[Path]:
    return list(directory.iterdir())


class Chunks:
    """A body in pieces of ``size`` bytes, counting the pieces taken."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body = body
        self.size = size
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.body), self.size):
            self.taken += 1
            yield self.body[start : start + self.size]


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
async def test_the_file_part_arrives_whole_in_pieces_of_any_size(tmp_path: Path, size: int) -> None:
    data = png(3000 if size == 1 else 300_000, seed=size % 200)
    staged = StagedUpload(tmp_path, limit=1 << 20)
    try:
        upload = await read_upload(aiter(Chunks(_form(data), size)), CONTENT_TYPE, staged)
        assert (upload.filename, upload.declared) == ("a.png", "image/png")
        assert staged.take().read_bytes() == data
        assert staged.check.size == len(data)
        assert staged.check.media_type() == "image/png"
    finally:
        await staged.discard()


async def test_reading_stops_at_the_limit(tmp_path: Path) -> None:
    limit = 256 * 1024
    body = Chunks(_form(png(4 * limit)), 16 * 1024)
    staged = StagedUpload(tmp_path, limit=limit)
    with pytest.raises(PayloadTooLarge):
        await read_upload(aiter(body), CONTENT_TYPE, staged)
    await staged.discard()
    # one piece past the limit, and not one more
    assert body.taken <= limit // body.size + 2
    assert _entries(tmp_path) == []


async def test_names_in_rfc_5987_form_and_in_utf_8(tmp_path: Path) -> None:
    for disposition, expected in (
        ("name=\"file\"; filename*=UTF-8''r%C3%A9sum%C3%A9.png", "résumé.png"),
        ('name="file"; filename="résumé.png"', "résumé.png"),
        ('name="file"; filename="say %22hi%22.png"', 'say "hi".png'),
        ('name="file"', None),
    ):
        staged = StagedUpload(tmp_path, limit=1 << 20)
        try:
            upload = await read_upload(
                aiter(Chunks(_form(png(), disposition), 100)), CONTENT_TYPE, staged
            )
            assert upload.filename == expected
        finally:
            await staged.discard()


async def test_what_is_not_one_file_in_a_form_is_refused(tmp_path: Path) -> None:
    cases: list[tuple[str | None, bytes, type[Exception]]] = [
        ("application/json", b'{"file": "x"}', UnsupportedMediaType),
        (None, _form(png()), UnsupportedMediaType),
        ("multipart/form-data", _form(png()), InvalidRequest),  # no boundary
        (f"multipart/form-data; boundary={'b' * 300}", _form(png()), InvalidRequest),
        (CONTENT_TYPE, _form(png(), 'name="other"; filename="a.png"'), InvalidRequest),
        (CONTENT_TYPE, _form(png())[:-30], InvalidRequest),  # cut before its end
        (CONTENT_TYPE, _form(png()).replace(b"--\r\n", b"\r\n") + _form(png())[2:], InvalidRequest),
    ]
    for content_type, body, error in cases:
        staged = StagedUpload(tmp_path, limit=1 << 20)
        with pytest.raises(error):
            await read_upload(aiter(Chunks(body, 64)), content_type, staged)
        await staged.discard()
    assert _entries(tmp_path) == []


def test_the_content_disposition_is_safe_and_exact() -> None:
    assert content_disposition("cat.png") == 'attachment; filename="cat.png"'
    tricky = content_disposition('a"b\\c\r\n;d ü.pdf')
    assert tricky.startswith("attachment; filename=\"a_b_c___d _.pdf\"; filename*=UTF-8''")
    assert "%22" in tricky and "%0D%0A" in tricky and "%C3%BC" in tricky
    assert "\r" not in tricky and "\n" not in tricky
