"""A run's input as content parts (app.files.intake): taken, checked before anything is stored,
and kept by reference by everything that keeps or hands over a run; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import AgentCore
from agent_runtime.content import (
    DOCUMENT_MEDIA_TYPES,
    IMAGE_MEDIA_TYPES,
    DocumentPart,
    ImagePart,
    TextPart,
    part_to_dict,
)
from agent_runtime.messages import AssistantMessage, UserMessage
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse, Usage
from agent_runtime.testing import FunctionModel
from app.bus import LocalBus
from app.bus.queue import QueueEntry
from app.errors import ServiceError
from app.files import FileService
from app.files.intake import InputLimits, RunInput, discard_input, take_input
from app.http.api.parts import shown_message, shown_parts
from app.http.api.schemas import FILE_TYPES, IMAGE_TYPES
from app.runs import RunRequestOptions
from app.runs.checkpoints import first_checkpoint, resumed_options
from app.runs.turns import stopped_turn
from app.storage import RunRecord, Store
from tests.support.files import gif, pdf, png
from tests.support.managers import run_manager
from tests.support.storage import (
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    store_fixture,  # noqa: F401 - provides the fixture store
)

LIMIT = 1 << 20


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


@pytest.fixture
def files(store: Store) -> FileService:
    return FileService(store, max_bytes=LIMIT)


async def stored_files(store: Store, *file_ids: str) -> list[str]:
    return [f for f in file_ids if await store.get_file(f) is not None]


async def refused(
    files: FileService, value: Any, code: str, *, principal: str = "alice", **kw: Any
) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        await take_input(files, principal, value, **kw)
    assert caught.value.code == code, caught.value.detail
    return caught.value


# --- taking it ---------------------------------------------------------------------------------


async def test_a_string_is_text_and_no_parts(files: FileService) -> None:
    assert await take_input(files, "alice", "hello") == RunInput("hello")
    # and text parts alone need no file service
    taken = await take_input(
        None, "alice", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    )
    assert taken == RunInput("a\n\nb", (TextPart("a"), TextPart("b")))


async def test_parts_by_file_id_data_url_and_https_url(files: FileService, store: Store) -> None:
    image = await files.put("alice", png(300, seed=1), filename="cat.png")
    document = pdf()
    taken = await take_input(
        files,
        "alice",
        [
            {"type": "text", "text": "compare"},
            {"type": "image", "file_id": image.file_id},
            {"type": "file", "url": data_url("application/pdf", document), "filename": "a.pdf"},
            {"type": "image", "url": "https://example.com/dog.jpg", "media_type": "image/jpeg"},
            {"type": "file", "file_id": image.file_id, "filename": "again.png"},
        ],
    )
    assert taken.text == "compare"
    text, by_id, stored, by_url, as_file = taken.parts
    assert text == TextPart("compare")
    assert by_id == ImagePart(
        media_type="image/png",
        ref=image.file_id,
        size=image.bytes,
        sha256=image.sha256,
        filename="cat.png",
    )
    assert isinstance(stored, DocumentPart) and stored.ref is not None
    assert taken.stored == (stored.ref,)
    record = await files.get("alice", stored.ref)
    assert (record.media_type, record.bytes, record.filename) == (
        "application/pdf",
        len(document),
        "a.pdf",
    )
    assert record.sha256 == hashlib.sha256(document).hexdigest() == stored.sha256
    assert by_url == ImagePart(media_type="image/jpeg", url="https://example.com/dog.jpg")
    # a file part holding an image is the image it is
    assert isinstance(as_file, ImagePart) and as_file.filename == "again.png"
    # every part's stored form holds a reference or a URL, never bytes
    assert all("data" not in part_to_dict(p) for p in taken.parts)


async def test_the_same_data_url_twice_is_one_file(files: FileService) -> None:
    url = data_url("image/gif", gif())
    taken = await take_input(
        files, "alice", [{"type": "image", "url": url}, {"type": "image", "url": url}]
    )
    first, second = taken.parts
    assert isinstance(first, ImagePart) and isinstance(second, ImagePart)
    assert first.ref == second.ref and taken.stored == (first.ref,)


@pytest.mark.parametrize(
    ("part", "code"),
    [
        ({"type": "video", "url": "https://example.com/a.mp4"}, "validation_error"),
        ({"type": "image"}, "validation_error"),
        ({"type": "image", "file_id": "file_x", "url": "https://a.example/b"}, "validation_error"),
        ({"type": "text", "text": "x", "extra": 1}, "validation_error"),
        ({"type": "text", "text": "  \n"}, "empty_input"),
        ({"type": "image", "url": "http://example.com/a.png"}, "unsupported_url"),
        ({"type": "file", "url": "ftp://example.com/a.pdf"}, "unsupported_url"),
        ({"type": "image", "url": "https://example.com/a b.png"}, "unsupported_url"),
        ({"type": "image", "url": "data:image/png;base64,@@@@"}, "invalid_data_url"),
        ({"type": "image", "url": "data:image/png;base64,AAA"}, "invalid_data_url"),
        ({"type": "image", "url": "data:image/png;base64"}, "invalid_data_url"),
        ({"type": "image", "url": "data:image/png;base64,"}, "empty_file"),
        ({"type": "image", "url": data_url("image/jpeg", png())}, "unsupported_media_type"),
        ({"type": "image", "url": data_url("application/pdf", pdf())}, "unsupported_media_type"),
        ({"type": "image", "url": data_url("image/svg+xml", b"<svg/>")}, "unsupported_media_type"),
        (
            {"type": "file", "url": data_url("application/zip", b"PK\x03\x04")},
            "unsupported_media_type",
        ),
        (
            {"type": "image", "url": data_url("image/png", png()), "media_type": "image/gif"},
            "unsupported_media_type",
        ),
        ({"type": "image", "file_id": "file_" + "0" * 32}, "file_not_found"),
        ({"type": "file", "file_id": "../etc/passwd"}, "file_not_found"),
    ],
)
async def test_a_bad_part_is_refused_with_its_code_and_nothing_stored(
    files: FileService, store: Store, part: dict[str, Any], code: str
) -> None:
    good = data_url("image/png", png(10, seed=77))
    error = await refused(files, [{"type": "image", "url": good}, part], code)
    assert error.extra["part"] == 1
    assert await store.count_file_blobs() == 0  # the good part before it was not stored either


async def test_an_image_part_naming_a_document_is_refused(files: FileService) -> None:
    document = await files.put("alice", pdf())
    error = await refused(
        files, [{"type": "image", "file_id": document.file_id}], "unsupported_media_type"
    )
    assert document.file_id in error.detail and "application/pdf" in error.detail


async def test_another_principals_file_is_not_found(files: FileService) -> None:
    bobs = await files.put("bob", png(seed=3))
    unknown = await refused(
        files, [{"type": "image", "file_id": "file_" + "1" * 32}], "file_not_found"
    )
    foreign = await refused(files, [{"type": "image", "file_id": bobs.file_id}], "file_not_found")
    # the same answer: nothing tells a missing file from another principal's
    assert foreign.detail == unknown.detail
    assert await take_input(files, "bob", [{"type": "image", "file_id": bobs.file_id}])


async def test_too_many_parts(files: FileService) -> None:
    tiny = [{"type": "text", "text": "x"}] * 1000
    error = await refused(files, tiny, "too_many_parts")
    assert error.extra["max_parts"] == 64
    await refused(files, tiny[:3], "too_many_parts", limits=InputLimits(LIMIT, max_parts=2))
    await refused(files, [], "empty_input")
    await refused(files, {"type": "text"}, "validation_error")


async def test_too_many_media_bytes(files: FileService, store: Store) -> None:
    big = await files.put("alice", png(600_000, seed=5))
    parts = [{"type": "image", "file_id": big.file_id}] * 2
    error = await refused(files, parts, "input_too_large")
    assert error.extra == {"part": 1, "max_media_bytes": LIMIT}
    # data URLs count before they are decoded; files and data URLs together
    url = data_url("image/png", png(600_000, seed=6))
    await refused(files, [{"type": "image", "url": url}, parts[0]], "input_too_large")
    await refused(files, [{"type": "image", "url": url}] * 2, "input_too_large")
    assert await store.count_file_blobs() == 1  # the upload alone


async def test_a_refusal_from_the_file_service_deletes_what_the_input_stored(
    files: FileService, store: Store
) -> None:
    whole = data_url("image/png", png(100, seed=8))
    cut = data_url("image/png", png(100, seed=9)[:-12])  # no IEND: passes the sniff, not the check
    error = await refused(
        files,
        [{"type": "image", "url": whole}, {"type": "image", "url": cut}],
        "malformed_file",
    )
    assert error.extra["part"] == 1 and error.detail.startswith("input[1]: ")
    assert await store.count_file_blobs() == 0


async def test_discarding_an_input_deletes_its_stored_files_only(
    files: FileService, store: Store
) -> None:
    upload = await files.put("alice", png(seed=12))
    taken = await take_input(
        files,
        "alice",
        [
            {"type": "image", "file_id": upload.file_id},
            {"type": "image", "url": data_url("image/png", png(seed=13))},
        ],
    )
    await discard_input(files, "alice", taken)
    assert await stored_files(store, upload.file_id, *taken.stored) == [upload.file_id]


async def test_a_large_data_url_is_decoded_off_the_event_loop(
    files: FileService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # where each piece is decoded, and how long it is: the loop's thread must never decode a
    # large payload, and a worker thread decodes it in pieces short enough that the GIL
    # changes hands between them (a timing check here failed on a loaded machine)
    calls: list[tuple[int, int]] = []
    real = base64.b64decode

    def spied(piece: str | bytes, validate: bool = False) -> bytes:
        calls.append((threading.get_ident(), len(piece)))
        return real(piece, validate=validate)

    monkeypatch.setattr(base64, "b64decode", spied)
    files.max_bytes = 24 << 20
    image = png(20 << 20, seed=21)
    url = data_url("image/png", image)
    taken = await take_input(files, "alice", [{"type": "image", "url": url}])
    part = taken.parts[0]
    assert isinstance(part, ImagePart) and part.size == len(image)
    assert part.sha256 == hashlib.sha256(image).hexdigest()
    loop_thread = threading.get_ident()
    assert calls and all(thread != loop_thread for thread, _ in calls)
    assert sum(length for _, length in calls) == len(url) - len("data:image/png;base64,")
    assert max(length for _, length in calls) <= 256 * 1024
    # a small payload is decoded on the loop: a thread would cost more than the work
    calls.clear()
    small = await take_input(
        files, "alice", [{"type": "image", "url": data_url("image/png", png())}]
    )
    assert small.parts and [thread for thread, _ in calls] == [loop_thread]


# --- what keeps a run keeps its parts ---------------------------------------------------------


PARTS = (
    TextPart("look"),
    ImagePart(media_type="image/png", ref="file_" + "a" * 32, size=10, sha256="ab", filename="x"),
    DocumentPart(url="https://example.com/a.pdf", media_type="application/pdf"),
)


def test_the_options_ask_the_parts_or_the_text() -> None:
    with_parts = RunRequestOptions(input="look", parts=PARTS)
    assert with_parts.prompt == list(PARTS)
    assert with_parts.file_ids == ("file_" + "a" * 32,)
    assert RunRequestOptions(input="hi").prompt == "hi"


def test_a_stopped_turn_before_the_runtime_keeps_the_parts() -> None:
    turn = stopped_turn(list(PARTS), [], "shutdown")
    assert turn == [
        {"role": "user", "content": [part_to_dict(p) for p in PARTS], "stopped": "shutdown"}
    ]


def test_a_resumed_run_gets_its_parts_from_its_record() -> None:
    record = RunRecord(
        run_id="run_1",
        session_id="s1",
        principal="alice",
        agent="default",
        input="look",
        input_parts=tuple(part_to_dict(p) for p in PARTS),
    )
    resumed = resumed_options(record, {}, None)
    assert resumed.parts == PARTS and resumed.input == "look"


def test_a_queue_entry_keeps_the_parts() -> None:
    entry = QueueEntry(
        run_id="run_1",
        session_id="s1",
        principal="alice",
        agent="default",
        input="look",
        created_at=1.0,
        input_parts=[part_to_dict(p) for p in PARTS],
    )
    assert QueueEntry.from_json(entry.to_json()) == entry


def test_the_api_shows_media_by_file_id() -> None:
    stored = [part_to_dict(p) for p in PARTS]
    assert shown_parts(stored) == [
        {"type": "text", "text": "look"},
        {
            "type": "image",
            "file_id": "file_" + "a" * 32,
            "media_type": "image/png",
            "bytes": 10,
            "sha256": "ab",
            "filename": "x",
        },
        {"type": "document", "url": "https://example.com/a.pdf", "media_type": "application/pdf"},
    ]
    assert shown_parts(None) is None
    tool = {"role": "tool", "content": "done", "parts": [stored[1]]}
    assert shown_message(tool)["parts"][0]["file_id"] == "file_" + "a" * 32
    assert shown_message({"role": "user", "content": "hi"}) == {"role": "user", "content": "hi"}


class Seen:
    """A model that reads the bytes of every media part it is sent, and answers."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self.bytes: list[bytes] = []

    async def __call__(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        user = request.messages[-1]
        assert isinstance(user, UserMessage)
        for part in user.parts:
            if isinstance(part, ImagePart | DocumentPart) and part.url is None:
                self.bytes.append(await request.media_bytes(part))
        yield ModelEvent.text("seen")
        yield ModelEvent.completed(ModelResponse(AssistantMessage("seen"), Usage(1, 1)))


async def test_a_run_asks_its_agent_the_parts_and_stores_them_by_reference(
    files: FileService, store: Store
) -> None:
    bus = LocalBus()
    model = Seen()
    agent = AgentCore(FunctionModel(model), content_store=files.content_store())
    manager = run_manager(agent, store, bus, resume_runs=True)
    image = png(2000, seed=30)
    try:
        taken = await take_input(
            files,
            "alice",
            [
                {"type": "text", "text": "what is it"},
                {"type": "image", "url": data_url("image/png", image)},
            ],
        )
        handle = await manager.start(
            "alice", "s-parts", RunRequestOptions(input=taken.text, parts=taken.parts)
        )
        first = first_checkpoint(handle).to_dict()
        await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    finally:
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
    assert model.bytes == [image]  # read through the files when the model call needed them
    file_id = taken.stored[0]
    stored = [item.message for item in await store.list_messages("s-parts")]
    assert stored[0] == {"role": "user", "content": [part_to_dict(p) for p in taken.parts]}
    assert stored[0]["content"][1]["ref"] == file_id
    record = await store.get_run(handle.run_id)
    assert record is not None and record.input == "what is it"
    assert record.input_parts == tuple(part_to_dict(p) for p in taken.parts)
    assert first["added"] == [stored[0]] and first["prompt"] == "what is it"
    # the session's messages refer to the file now: it stays while they do
    assert await store.file_references(file_id) == ["s-parts"]
    assert len(json.dumps(stored)) < 1000  # by reference, never the bytes


def test_the_api_s_media_types_are_the_runtime_s() -> None:
    assert set(IMAGE_TYPES) == IMAGE_MEDIA_TYPES
    assert set(FILE_TYPES) == IMAGE_MEDIA_TYPES | DOCUMENT_MEDIA_TYPES
