"""The files service on SQLite and PostgreSQL alike: owned files, stored once per content,
kept while a conversation refers to them, swept once unreferenced past the retention."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from agent_runtime.content import ContentError
from app.errors import Conflict, NotFound, PayloadTooLarge, UnsupportedMediaType
from app.files import FileRetention, FileService
from app.storage import Store
from tests.support.files import jpeg, pdf, png
from tests.support.storage import (
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    store_fixture,  # noqa: F401 - provides the fixture store
)

LIMIT = 4 << 20


def _service(store: Store, clock: datetime | None = None) -> FileService:
    if clock is None:
        return FileService(store, max_bytes=LIMIT)
    return FileService(store, max_bytes=LIMIT, clock=lambda: clock)


async def test_a_file_is_its_owners(store: Store) -> None:
    files = _service(store)
    data = png(2000)
    record = await files.put("alice", data, filename="/home/a/cat.png", declared="image/png")
    assert record.file_id.startswith("file_") and len(record.file_id) == 37
    assert (record.filename, record.media_type, record.bytes) == ("cat.png", "image/png", len(data))
    assert record.sha256 == hashlib.sha256(data).hexdigest()
    assert await files.get("alice", record.file_id) == record
    assert await files.read("alice", record.file_id) == data
    view = record.to_json()
    assert set(view) == {"file_id", "filename", "media_type", "bytes", "sha256", "created_at"}
    assert view["created_at"].endswith("Z")

    for call in (files.get, files.read, files.delete):
        with pytest.raises(NotFound):
            await call("bob", record.file_id)
    await store.get_or_create_session("bobs", "bob")
    with pytest.raises(NotFound):
        await files.reference([record.file_id], "bobs", "bob")
    assert await store.file_references(record.file_id) == []
    # ids of another shape never reach the store
    with pytest.raises(NotFound):
        await files.get("alice", "../../etc/passwd")
    assert await files.read("alice", record.file_id) == data  # bob's attempts changed nothing


async def test_identical_content_is_stored_once(store: Store) -> None:
    files = _service(store)
    data = pdf()
    first = await files.put("alice", data, filename="a.pdf")
    second = await files.put("bob", data, filename="b.pdf")
    # at once, from many uploads: still one blob
    many = await asyncio.gather(*(files.put("carol", jpeg(100)) for _ in range(8)))
    assert len({r.file_id for r in (first, second, *many)}) == 10
    assert first.sha256 == second.sha256
    assert await store.count_file_blobs() == 2

    await files.delete("alice", first.file_id)
    assert await store.count_file_blobs() == 2  # bob's row still names the PDF
    assert await files.read("bob", second.file_id) == data
    await files.delete("bob", second.file_id)
    assert await store.count_file_blobs() == 1
    for record in many:
        await files.delete("carol", record.file_id)
    assert await store.count_file_blobs() == 0
    with pytest.raises(NotFound):
        await files.get("bob", second.file_id)


async def test_deletes_and_uploads_of_the_same_content_race_safely(store: Store) -> None:
    files = _service(store)
    data = png(300, seed=7)
    kept = await files.put("alice", data)
    for _ in range(5):
        doomed = await files.put("alice", data)
        fresh, _ = await asyncio.gather(
            files.put("bob", data), files.delete("alice", doomed.file_id)
        )
        assert await files.read("bob", fresh.file_id) == data
        await files.delete("bob", fresh.file_id)
    assert await files.read("alice", kept.file_id) == data
    assert await store.count_file_blobs() == 1


async def test_a_referenced_file_is_kept_until_its_session_goes(store: Store) -> None:
    files = _service(store)
    record = await files.put("alice", png())
    await store.get_or_create_session("s1", "alice")
    await store.get_or_create_session("s2", "alice")
    await files.reference([record.file_id, record.file_id], "s1", "alice")
    await files.reference([record.file_id], "s2", "alice")
    assert await store.file_references(record.file_id) == ["s1", "s2"]

    with pytest.raises(Conflict) as caught:
        await files.delete("alice", record.file_id)
    assert caught.value.code == "file_in_use"
    await store.delete_session("s1")
    with pytest.raises(Conflict):
        await files.delete("alice", record.file_id)
    await store.delete_session("s2")
    assert await store.file_references(record.file_id) == []
    await files.delete("alice", record.file_id)
    assert await store.count_file_blobs() == 0


async def test_a_reference_names_existing_files_and_sessions(store: Store) -> None:
    files = _service(store)
    record = await files.put("alice", png())
    with pytest.raises(NotFound):
        await files.reference([record.file_id], "no-such-session", "alice")
    await store.get_or_create_session("s1", "alice")
    missing = "file_" + "0" * 32
    with pytest.raises(NotFound):
        await files.reference([record.file_id, missing], "s1", "alice")
    assert await store.file_references(record.file_id) == []  # nothing recorded


async def test_refused_content_stores_nothing(store: Store) -> None:
    files = FileService(store, max_bytes=1000)
    with pytest.raises(PayloadTooLarge):
        await files.put("alice", png(2000))
    with pytest.raises(UnsupportedMediaType):
        await files.put("alice", png(), declared="image/jpeg")
    assert await store.count_file_blobs() == 0


async def test_the_retention_sweeps_unreferenced_old_files(store: Store) -> None:
    now = datetime.now(UTC)
    old = _service(store, clock=now - timedelta(days=8))
    young = _service(store, clock=now)
    stale = await old.put("alice", png(10, seed=1))
    used = await old.put("alice", png(10, seed=2))
    shared_old = await old.put("alice", png(10, seed=3))
    recent = await young.put("alice", png(10, seed=4))
    shared_young = await young.put("bob", png(10, seed=3))
    await store.get_or_create_session("s1", "alice")
    await old.reference([used.file_id], "s1", "alice")

    retention = FileRetention(store, retention=7 * 86400, clock=lambda: now)
    swept = await retention.sweep()
    assert (swept.files, swept.blobs) == (2, 1)  # shared_old's bytes stay with bob's row
    for gone in (stale, shared_old):
        with pytest.raises(NotFound):
            await old.get("alice", gone.file_id)
    assert await old.read("alice", used.file_id) == png(10, seed=2)
    assert await young.read("alice", recent.file_id) == png(10, seed=4)
    assert await young.read("bob", shared_young.file_id) == png(10, seed=3)
    assert await store.count_file_blobs() == 3

    # the session deleted: its files are no longer referred to, and go next time
    await store.delete_session("s1")
    assert (await retention.sweep()).files == 1
    assert (await retention.sweep()).files == 0


async def test_the_content_store_keeps_a_sessions_bytes_as_its_owners_files(store: Store) -> None:
    files = _service(store)
    content = files.content_store()
    await store.get_or_create_session("s1", "alice")
    kept = await content.put(png(), "image/png", session_id="s1")
    assert kept.media_type == "image/png" and kept.size == len(png())
    record = await files.get("alice", kept.ref)  # alice's file
    assert record.sha256 == kept.sha256
    assert await store.file_references(kept.ref) == ["s1"]
    assert await content.get(kept.ref) == png()

    with pytest.raises(ContentError):
        await content.put(png(), "image/jpeg", session_id="s1")  # not what it says
    with pytest.raises(ContentError):
        await content.put(png(), "image/png", session_id="nobody")
    with pytest.raises(ContentError):
        await content.put(png(), "image/png")
    with pytest.raises(ContentError):
        await content.get("file_" + "f" * 32)
