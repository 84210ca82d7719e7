"""A run's input as content parts over real HTTP (``POST /v1/sessions/{id}/runs``): files by
id, data URLs stored as files on arrival, https URLs passed on; refusals with their codes and
nothing stored; a 5 MB image that leaves no base64 in the history, the checkpoints or the
event log; parts kept by a queued run and by a run resumed after its worker died."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.auth import API_KEYS, auth
from tests.support.files import pdf, png
from tests.support.multitask import finished, messages, new_session
from tests.support.problems import assert_problem
from tests.support.server import Server, launch
from tests.support.waiting import wait_for

ALICE = auth("alice")
BOB = auth("bob")
ENV = {"AGENT_API_KEYS": API_KEYS, "AGENT_WARMUP": "0", "AGENT_DEMO_SLOW_SECONDS": "0.2"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = launch(tmp_path_factory.mktemp("input-parts"), ENV)
    yield running
    running.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with server.client(headers=ALICE) as http:
        yield http


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def query(server: Server, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of the server's SQLite database, read beside it (WAL: readers do not block it)."""
    with sqlite3.connect(server.directory / "var" / "agent.db") as db:
        return db.execute(sql, args).fetchall()


def counts(server: Server) -> tuple[int, int]:
    """Files and blobs stored."""
    return (
        query(server, "SELECT COUNT(*) FROM files")[0][0],
        query(server, "SELECT COUNT(*) FROM file_blobs")[0][0],
    )


async def upload(client: httpx.AsyncClient, data: bytes, name: str, **kw: Any) -> dict[str, Any]:
    answer = await client.post("/v1/files", files={"file": (name, data)}, **kw)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


async def run(client: httpx.AsyncClient, session: str, parts: Any, **kw: Any) -> dict[str, Any]:
    answer = await client.post(
        f"/v1/sessions/{session}/runs", json={"input": parts, "stream": False, **kw}
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    assert result["status"] == "completed", result
    return result


async def test_a_run_takes_an_uploaded_image_by_its_file_id(
    client: httpx.AsyncClient, server: Server
) -> None:
    image = png(3000, seed=1)
    created = await upload(client, image, "cat.png")
    session = new_session()
    result = await run(
        client,
        session,
        [
            {"type": "text", "text": "what is this"},
            {"type": "image", "file_id": created["file_id"]},
        ],
    )
    # the model was asked the image: the demo model's answer names what it received
    assert created["sha256"][:12] in result["output"]["content"]
    shown = {
        "type": "image",
        "file_id": created["file_id"],
        "media_type": "image/png",
        "bytes": len(image),
        "sha256": hashlib.sha256(image).hexdigest(),
        "filename": "cat.png",
    }
    view = (await client.get(f"/v1/runs/{result['run_id']}")).json()
    assert view["input"] == "what is this"
    assert view["input_parts"] == [{"type": "text", "text": "what is this"}, shown]
    user = (await messages(client, session))[0]
    assert user["role"] == "user" and user["content"][1] == shown
    # the stored conversation refers to the file: it cannot go while the session is there
    path = f"/v1/files/{created['file_id']}"
    assert_problem(await client.delete(path), 409, "file_in_use")
    assert (await client.delete(f"/v1/sessions/{session}")).status_code == 204
    assert (await client.delete(path)).status_code == 204


async def test_a_data_url_is_stored_as_a_file_of_the_caller(
    client: httpx.AsyncClient, server: Server
) -> None:
    document = pdf()
    result = await run(
        client,
        new_session(),
        [
            {"type": "text", "text": "summarise"},
            {"type": "file", "url": data_url("application/pdf", document), "filename": "r.pdf"},
        ],
    )
    part = (await client.get(f"/v1/runs/{result['run_id']}")).json()["input_parts"][1]
    assert part["type"] == "document" and "url" not in part
    meta = (await client.get(f"/v1/files/{part['file_id']}")).json()
    assert (meta["media_type"], meta["bytes"], meta["filename"]) == (
        "application/pdf",
        len(document),
        "r.pdf",
    )
    assert (await client.get(f"/v1/files/{part['file_id']}/content")).content == document
    assert_problem(await client.get(f"/v1/files/{part['file_id']}", headers=BOB), 404, "not_found")


async def test_an_https_url_is_passed_on_and_never_fetched(
    client: httpx.AsyncClient, server: Server
) -> None:
    before = counts(server)
    url = "https://images.example.invalid/cat.jpg"
    session = new_session()
    result = await run(
        client,
        session,
        [
            {"type": "text", "text": "look"},
            {"type": "image", "url": url, "media_type": "image/jpeg"},
        ],
    )
    assert url in result["output"]["content"]
    assert (await messages(client, session))[0]["content"][1] == {
        "type": "image",
        "url": url,
        "media_type": "image/jpeg",
    }
    assert counts(server) == before


async def test_bad_input_is_refused_with_its_code_and_nothing_is_stored(
    client: httpx.AsyncClient, server: Server
) -> None:
    bobs = await upload(client, png(seed=40), "bob.png", headers=BOB)
    document = await upload(client, pdf(), "doc.pdf")
    big = await upload(client, png(2_500_000, seed=41), "big.png")
    good = {"type": "image", "url": data_url("image/png", png(500, seed=42))}
    cases: list[tuple[list[dict[str, Any]], int, str]] = [
        # a data URL lying about its type; a truncated image (no IEND chunk)
        (
            [good, {"type": "image", "url": data_url("image/jpeg", png(seed=43))}],
            415,
            "unsupported_media_type",
        ),
        (
            [good, {"type": "image", "url": data_url("image/png", png(300, seed=44)[:-12])}],
            422,
            "malformed_file",
        ),
        # a file id nobody has, and another principal's: the same answer
        ([good, {"type": "image", "file_id": "file_" + "0" * 32}], 404, "file_not_found"),
        ([good, {"type": "image", "file_id": bobs["file_id"]}], 404, "file_not_found"),
        # an image part naming a PDF
        ([good, {"type": "image", "file_id": document["file_id"]}], 415, "unsupported_media_type"),
        ([{"type": "text", "text": "x"}] * 1000, 422, "too_many_parts"),
        ([good, *[{"type": "image", "file_id": big["file_id"]}] * 9], 413, "input_too_large"),
        ([good, {"type": "image", "url": "http://example.com/a.png"}], 422, "unsupported_url"),
        ([good, {"type": "image", "url": "data:image/png;base64,%%%"}], 422, "invalid_data_url"),
        ([good, {"type": "text", "text": " "}], 422, "empty_input"),
        ([good, {"type": "image"}], 422, "validation_error"),
    ]
    before = counts(server)
    for parts, status, code in cases:
        session = new_session()
        answer = await client.post(
            f"/v1/sessions/{session}/runs", json={"input": parts, "stream": False}
        )
        problem = assert_problem(answer, status, code)
        assert problem["detail"].startswith(("input", "body")), problem
        assert counts(server) == before, code
        assert (await client.get(f"/v1/sessions/{session}")).status_code == 404, code
    assert "Traceback" not in server.log()


async def test_a_5_mb_image_is_stored_once_and_leaves_no_base64_behind(
    client: httpx.AsyncClient, server: Server
) -> None:
    image = png(5_000_000, seed=50)
    encoded = base64.b64encode(image).decode()
    url = f"data:image/png;base64,{encoded}"
    piece = encoded[len(encoded) // 2 : len(encoded) // 2 + 64]  # any run of it would show
    sha256 = hashlib.sha256(image).hexdigest()
    session = new_session()
    started = await client.post(
        f"/v1/sessions/{session}/runs",
        json={
            "input": [{"type": "text", "text": "slow look at this"}, {"type": "image", "url": url}],
            "background": True,
        },
    )
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]

    async def checkpoint() -> str | None:
        rows = query(server, "SELECT data FROM run_checkpoints WHERE run_id = ?", run_id)
        return str(rows[0][0]) if rows else None

    # the run's first checkpoint (its prompt: what a resume starts from), while it runs
    stored_checkpoint = await wait_for(checkpoint)
    assert len(stored_checkpoint) < 4000 and piece not in stored_checkpoint
    added = json.loads(stored_checkpoint)["added"][0]["content"][1]
    assert (added["type"], added["size"], added["sha256"]) == ("image", len(image), sha256)

    await finished(client, run_id)
    history = json.dumps(await messages(client, session))
    assert len(history) < 4000 and piece not in history and sha256[:12] in history
    events = await client.get(f"/v1/runs/{run_id}/events", params={"after": 0})
    assert len(events.text) < 20_000 and piece not in events.text
    record = query(server, "SELECT input, input_parts FROM runs WHERE run_id = ?", run_id)[0]
    assert record[0] == "slow look at this" and len(record[1]) < 1000
    assert piece not in server.log()

    # the same image again, from another session: another file, the same stored bytes
    await run(client, new_session(), [{"type": "image", "url": url}])
    assert query(server, "SELECT COUNT(*) FROM files WHERE sha256 = ?", sha256) == [(2,)]
    assert query(
        server, "SELECT COUNT(*), MAX(bytes) FROM file_blobs WHERE sha256 = ?", sha256
    ) == [(1, len(image))]
    blobs = list((server.directory / "var" / "files").glob(f"??/{sha256}"))
    assert len(blobs) == 1 and blobs[0].stat().st_size == len(image)


async def test_a_large_body_is_refused_past_the_media_allowance_and_its_text_bounded(
    client: httpx.AsyncClient,
) -> None:
    # the body limit (1 MiB) holds for what is not media: text is not let in as an image
    text = {"type": "text", "text": "x" * (1 << 20)}
    answer = await client.post(f"/v1/sessions/{new_session()}/runs", json={"input": [text]})
    assert_problem(answer, 413, "payload_too_large")
    # media beyond AGENT_MAX_FILE_BYTES (20 MiB) of base64: refused before it is read whole
    huge = {"type": "image", "url": "data:image/png;base64," + "A" * (28 << 20)}
    answer = await client.post(f"/v1/sessions/{new_session()}/runs", json={"input": [huge]})
    assert_problem(answer, 413, "payload_too_large")


async def test_an_idempotent_repeat_of_a_run_with_media_stores_nothing_again(
    client: httpx.AsyncClient, server: Server
) -> None:
    image = png(1_500_000, seed=60)  # a body past 1 MiB: parsed off the loop, with its key
    parts = [
        {"type": "text", "text": "once"},
        {"type": "image", "url": data_url("image/png", image)},
    ]
    session = new_session()
    headers = {"Idempotency-Key": f"media-{session}"}
    body = {"input": parts, "stream": False}
    first = await client.post(f"/v1/sessions/{session}/runs", json=body, headers=headers)
    assert first.status_code == 200, first.text
    files_after = counts(server)
    again = await client.post(f"/v1/sessions/{session}/runs", json=body, headers=headers)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-run-id"] == first.headers["x-run-id"]
    assert counts(server) == files_after
    other = [parts[0], {"type": "image", "url": data_url("image/png", png(1_500_000, seed=61))}]
    reused = await client.post(
        f"/v1/sessions/{session}/runs", json={**body, "input": other}, headers=headers
    )
    assert_problem(reused, 422, "idempotency_key_reused")
    assert counts(server) == files_after


async def test_a_queued_run_keeps_its_parts(client: httpx.AsyncClient, server: Server) -> None:
    created = await upload(client, png(800, seed=70), "queued.png")
    session = new_session()
    ahead = await client.post(
        f"/v1/sessions/{session}/runs", json={"input": "slow one two three", "background": True}
    )
    assert ahead.status_code == 202, ahead.text
    parts = [
        {"type": "text", "text": "then this"},
        {"type": "image", "file_id": created["file_id"]},
    ]
    queued = await client.post(
        f"/v1/sessions/{session}/runs",
        json={"input": parts, "background": True, "multitask_strategy": "enqueue"},
    )
    assert queued.status_code == 202 and queued.json()["status"] == "queued", queued.text
    run_id = queued.json()["run_id"]
    view = (await client.get(f"/v1/runs/{run_id}")).json()
    assert view["status"] == "queued" and view["input_parts"][1]["file_id"] == created["file_id"]
    result = await finished(client, run_id)
    assert result["status"] == "completed"
    assert created["sha256"][:12] in result["output"]["content"]
    stored = [m for m in await messages(client, session) if m["run_id"] == run_id]
    assert stored[0]["content"][1]["file_id"] == created["file_id"]


@pytest.mark.slow  # two server starts and a crash
async def test_a_run_resumed_after_its_worker_died_keeps_its_parts(tmp_path: Path) -> None:
    env = {**ENV, "AGENT_DEMO_SLOW_SECONDS": "0.3"}
    server = launch(tmp_path / "server", env)
    image = png(4000, seed=80)
    sha256 = hashlib.sha256(image).hexdigest()
    session = new_session()
    try:
        async with server.client(headers=ALICE) as client:
            parts = [
                {"type": "text", "text": "slow a b c d e f"},
                {"type": "image", "url": data_url("image/png", image)},
            ]
            started = await client.post(
                f"/v1/sessions/{session}/runs", json={"input": parts, "background": True}
            )
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]

            async def checkpointed() -> bool:
                rows = query(server, "SELECT 1 FROM run_checkpoints WHERE run_id = ?", run_id)
                return bool(rows)

            await wait_for(checkpointed)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.wait(10)
        server = launch(tmp_path / "server", env)  # the only worker, back: it resumes the run
        async with server.client(headers=ALICE) as client:
            result = await finished(client, run_id)
            assert result["status"] == "completed", result
            # the resumed model call was asked the image too
            assert sha256[:12] in result["output"]["content"]
            assert result["input_parts"][1]["sha256"] == sha256
            events = (await client.get(f"/v1/runs/{run_id}/events", params={"after": 0})).text
            assert "run.resumed" in events
            user = (await messages(client, session))[0]
            assert user["content"][1]["sha256"] == sha256 and "file_id" in user["content"][1]
    finally:
        server.stop()


async def test_the_openapi_document_describes_the_parts(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    request = schemas["RunRequest"]["properties"]["input"]
    assert [option["type"] for option in request["anyOf"]] == ["string", "array"]
    assert {"TextInputPart", "ImageInputPart", "FileInputPart", "ShownPart"} <= set(schemas)
    assert schemas["ImageInputPart"]["oneOf"] == [{"required": ["file_id"]}, {"required": ["url"]}]
    assert "input_parts" in schemas["RunView"]["properties"]
    start = document["paths"]["/v1/sessions/{session_id}/runs"]["post"]["responses"]
    assert {"404", "413", "415", "422"} <= set(start)
