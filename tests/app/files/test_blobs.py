"""Where the bytes live: files beside the SQLite database (written atomically, what an
interrupted upload left swept), pieces in PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from app.files import FileService
from app.storage import PostgresStore, SQLiteStore, open_store
from app.storage.files import BLOB_CHUNK_BYTES
from tests.support.files import png
from tests.support.storage import postgres_schema


async def test_sqlite_keeps_each_content_once_beside_the_database(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'var' / 'agent.db'}")
    try:
        assert isinstance(store, SQLiteStore)
        files = FileService(store, max_bytes=1 << 20)
        data = png(3000)
        first = await files.put("alice", data)
        await files.put("bob", data)
        digest = hashlib.sha256(data).hexdigest()
        blob = tmp_path / "var" / "files" / digest[:2] / digest
        assert blob.read_bytes() == data
        assert list((tmp_path / "var" / "files").glob("??/*")) == [blob]
        # nothing is left in the staging directory once an upload is in place
        assert list((tmp_path / "var" / "files" / ".staging").iterdir()) == []
        await files.delete("alice", first.file_id)
        assert blob.exists()
    finally:
        await store.close()


async def test_the_sweep_removes_what_an_interrupted_upload_left(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'agent.db'}")
    try:
        assert isinstance(store, SQLiteStore)
        files = FileService(store, max_bytes=1 << 20)
        kept = await files.put("alice", png(10))
        root = tmp_path / "files"
        # a blob moved into place whose transaction never committed, an old staged upload,
        # and an upload staged right now
        orphan = root / "ab" / ("ab" + "0" * 62)
        orphan.parent.mkdir()
        orphan.write_bytes(b"left behind")
        old = root / ".staging" / "old.upload"
        old.write_bytes(b"half an upload")
        an_hour_ago = time.time() - 7200
        os.utime(old, (an_hour_ago, an_hour_ago))
        current = root / ".staging" / "current.upload"
        current.write_bytes(b"in progress")

        swept = await store.sweep_files(datetime(2000, 1, 1, tzinfo=UTC), 100)
        assert (swept.files, swept.blobs) == (0, 1)
        assert not orphan.exists() and not old.exists()
        assert current.exists()
        assert await files.read("alice", kept.file_id) == png(10)
    finally:
        await store.close()


async def test_an_in_memory_database_keeps_its_blobs_in_a_directory_of_its_own() -> None:
    store = await open_store("sqlite:///:memory:")
    try:
        assert isinstance(store, SQLiteStore)
        files = FileService(store, max_bytes=1 << 20)
        record = await files.put("alice", png(5))
        assert await files.read("alice", record.file_id) == png(5)
        assert store.blob_root.is_dir() and "agent-files-" in store.blob_root.name
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_keeps_a_content_in_pieces() -> None:
    async with postgres_schema() as (url, _):
        store = await open_store(url)
        try:
            assert isinstance(store, PostgresStore)
            files = FileService(store, max_bytes=8 << 20)
            data = png(2 * BLOB_CHUNK_BYTES + 100, seed=4)
            record = await files.put("alice", data)
            other = await files.put("bob", data)
            connection = await asyncpg.connect(url)
            try:
                pieces = await connection.fetch(
                    "SELECT seq, length(data) AS size FROM file_chunks WHERE sha256 = $1"
                    " ORDER BY seq",
                    record.sha256,
                )
                assert [p["size"] for p in pieces] == [
                    BLOB_CHUNK_BYTES,
                    BLOB_CHUNK_BYTES,
                    len(data) - 2 * BLOB_CHUNK_BYTES,
                ]
                assert await files.read("alice", record.file_id) == data
                await files.delete("alice", record.file_id)
                assert await connection.fetchval("SELECT count(*) FROM file_chunks") == 3
                await files.delete("bob", other.file_id)
                assert await connection.fetchval("SELECT count(*) FROM file_chunks") == 0
            finally:
                await connection.close()
        finally:
            await store.close()
