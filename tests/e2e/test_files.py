"""``/v1/files`` over real HTTP: upload, metadata, bytes, delete; the limits, the refusals with
their codes, ownership with authentication on, and identical uploads stored once."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.files import jpeg, pdf, png, zip_archive
from tests.support.problems import assert_problem
from tests.support.server import Server, launch

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
MAX_FILE = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with authentication on and a 3 MiB file limit (a 1 MiB body limit)."""
    running = launch(
        tmp_path_factory.mktemp("files-server"),
        {
            "AGENT_API_KEYS": "key-alice=alice,key-bob=bob",
            "AGENT_MAX_FILE_BYTES": str(MAX_FILE),
            "AGENT_WARMUP": "0",
        },
    )
    yield running
    running.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with server.client() as http:
        yield http


async def _upload(
    client: httpx.AsyncClient,
    data: bytes,
    filename: str = "sample.bin",
    media_type: str | None = None,
    headers: dict[str, str] = ALICE,
) -> httpx.Response:
    part: tuple[Any, ...] = (filename, data) if media_type is None else (filename, data, media_type)
    return await client.post("/v1/files", files={"file": part}, headers=headers)


def _blob_count(server: Server) -> int:
    with sqlite3.connect(server.directory / "var" / "agent.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM file_blobs").fetchone()[0])


def _blob_files(server: Server) -> list[Path]:
    root = server.directory / "var" / "files"
    return [p for p in root.glob("??/*") if p.is_file()]


async def test_upload_read_and_delete(client: httpx.AsyncClient) -> None:
    data = png(5000, seed=11)
    answer = await _upload(client, data, 'Ünïcode cat "1".png', "image/png")
    assert answer.status_code == 201, answer.text
    created = answer.json()
    file_id = created["file_id"]
    assert answer.headers["location"] == f"/v1/files/{file_id}"
    assert set(created) == {"file_id", "filename", "media_type", "bytes", "sha256", "created_at"}
    assert created["filename"] == 'Ünïcode cat "1".png'
    assert (created["media_type"], created["bytes"]) == ("image/png", len(data))
    assert created["sha256"] == hashlib.sha256(data).hexdigest()

    meta = await client.get(f"/v1/files/{file_id}", headers=ALICE)
    assert meta.status_code == 200 and meta.json() == created

    content = await client.get(f"/v1/files/{file_id}/content", headers=ALICE)
    assert content.status_code == 200
    assert content.content == data
    assert content.headers["content-type"] == "image/png"
    assert content.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in content.headers["content-security-policy"]
    disposition = content.headers["content-disposition"]
    assert disposition.startswith('attachment; filename="')
    assert "filename*=UTF-8''%C3%9Cn%C3%AFcode%20cat%20%221%22.png" in disposition
    again = await client.get(
        f"/v1/files/{file_id}/content",
        headers={**ALICE, "If-None-Match": content.headers["etag"]},
    )
    assert again.status_code == 304 and again.content == b""

    gone = await client.delete(f"/v1/files/{file_id}", headers=ALICE)
    assert gone.status_code == 204
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        assert_problem(await client.get(path, headers=ALICE), 404, "not_found")
    assert_problem(await client.delete(f"/v1/files/{file_id}", headers=ALICE), 404, "not_found")


async def test_text_is_served_as_utf8_text(client: httpx.AsyncClient) -> None:
    answer = await _upload(client, "# Notes\n\nçà\n".encode(), "notes.md")
    assert answer.status_code == 201, answer.text
    assert answer.json()["media_type"] == "text/markdown"
    content = await client.get(f"/v1/files/{answer.json()['file_id']}/content", headers=ALICE)
    assert content.headers["content-type"] == "text/markdown; charset=utf-8"
    assert content.text == "# Notes\n\nçà\n"


async def test_another_principals_file_is_not_found_on_every_route(
    client: httpx.AsyncClient,
) -> None:
    created = (await _upload(client, pdf(), "private.pdf")).json()
    path = f"/v1/files/{created['file_id']}"
    for answer in (
        await client.get(path, headers=BOB),
        await client.get(f"{path}/content", headers=BOB),
        await client.delete(path, headers=BOB),
    ):
        assert_problem(answer, 404, "not_found")
    assert (await client.get(f"{path}/content", headers=ALICE)).content == pdf()


async def test_without_a_key_every_route_is_401(client: httpx.AsyncClient) -> None:
    created = (await _upload(client, jpeg(10))).json()
    path = f"/v1/files/{created['file_id']}"
    for answer in (
        await _upload(client, png(), headers={}),
        await client.get(path),
        await client.get(f"{path}/content"),
        await client.delete(path),
    ):
        assert_problem(answer, 401, "unauthorized")


@pytest.mark.parametrize(
    ("data", "filename", "declared", "status", "code"),
    [
        (zip_archive(), "invoice.pdf", "application/pdf", 415, "unsupported_media_type"),
        (png(), "photo.jpg", "image/jpeg", 415, "unsupported_media_type"),
        (png()[:-12], "cut.png", "image/png", 422, "malformed_file"),
        (jpeg(2000)[:1000], "cut.jpg", None, 422, "malformed_file"),
        (b"", "empty.txt", "text/plain", 422, "empty_file"),
    ],
)
async def test_refused_uploads_say_why_and_store_nothing(
    client: httpx.AsyncClient,
    server: Server,
    data: bytes,
    filename: str,
    declared: str | None,
    status: int,
    code: str,
) -> None:
    blobs = _blob_count(server)
    assert_problem(await _upload(client, data, filename, declared), status, code)
    assert _blob_count(server) == blobs


async def test_a_malformed_form_is_refused(client: httpx.AsyncClient) -> None:
    as_json = await client.post("/v1/files", json={"file": "x"}, headers=ALICE)
    assert_problem(as_json, 415, "unsupported_media_type")
    no_file = await client.post("/v1/files", files={"other": ("a.png", png())}, headers=ALICE)
    assert_problem(no_file, 422, "validation_error")
    two = await client.post(
        "/v1/files",
        files=[("file", ("a.png", png())), ("file", ("b.png", png(1)))],
        headers=ALICE,
    )
    assert_problem(two, 422, "validation_error")
    cut = await client.post(
        "/v1/files",
        content=b'--xx\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nabc',
        headers={**ALICE, "Content-Type": "multipart/form-data; boundary=xx"},
    )
    assert_problem(cut, 422, "validation_error")


async def test_a_file_up_to_the_limit_is_taken_and_one_byte_more_is_not(
    client: httpx.AsyncClient, server: Server
) -> None:
    overhead = len(png(1)) - 1
    whole = png(MAX_FILE - overhead, seed=5)
    assert len(whole) == MAX_FILE  # three times the body limit of other routes
    answer = await _upload(client, whole, "big.png")
    assert answer.status_code == 201, answer.text
    assert answer.json()["bytes"] == MAX_FILE
    content = await client.get(f"/v1/files/{answer.json()['file_id']}/content", headers=ALICE)
    assert hashlib.sha256(content.content).hexdigest() == answer.json()["sha256"]

    blobs = _blob_count(server)
    over = png(MAX_FILE - overhead + 1, seed=6)
    assert_problem(await _upload(client, over, "over.png"), 413, "payload_too_large")

    # a chunked body (no Content-Length) is cut at the limit as well
    async def chunks() -> AsyncIterator[bytes]:
        body = (
            b'--bb\r\nContent-Disposition: form-data; name="file"; filename="x.png"\r\n\r\n'
            + over
            + b"\r\n--bb--\r\n"
        )
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    chunked = await client.post(
        "/v1/files",
        content=chunks(),
        headers={**ALICE, "Content-Type": "multipart/form-data; boundary=bb"},
    )
    assert_problem(chunked, 413, "payload_too_large")
    assert _blob_count(server) == blobs


async def test_identical_uploads_are_stored_once(client: httpx.AsyncClient, server: Server) -> None:
    data = png(20_000, seed=42)
    digest = hashlib.sha256(data).hexdigest()
    answers = await asyncio.gather(
        *(_upload(client, data, f"copy-{i}.png", headers=ALICE if i % 2 else BOB) for i in range(6))
    )
    assert all(a.status_code == 201 for a in answers), [a.text for a in answers]
    assert len({a.json()["file_id"] for a in answers}) == 6
    assert [p.name for p in _blob_files(server)].count(digest) == 1
    blob = server.directory / "var" / "files" / digest[:2] / digest
    assert blob.read_bytes() == data
    for answer, i in zip(answers, range(6), strict=True):
        await client.delete(
            f"/v1/files/{answer.json()['file_id']}", headers=ALICE if i % 2 else BOB
        )
    assert not blob.exists()  # the last row took the blob with it
