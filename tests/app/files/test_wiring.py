"""A worker's files: its agents keep their content there, and its retention sweep runs."""

from __future__ import annotations

from app.files import FileContentStore
from tests.support.files import png
from tests.support.served import Serve
from tests.support.waiting import wait_until


async def test_the_agents_content_store_is_the_workers_files(serve: Serve) -> None:
    async with serve() as served:
        files = served.services.files
        assert files is not None
        for core in served.services.agents.cores.values():
            assert isinstance(core.content_store, FileContentStore)
        await served.services.store.get_or_create_session("s1", "anonymous")
        kept = await served.services.agent.content_store.put(png(), "image/png", session_id="s1")
        answer = await served.client.get(f"/v1/files/{kept.ref}")
        assert answer.status_code == 200 and answer.json()["sha256"] == kept.sha256


async def test_unreferenced_files_go_once_past_the_retention(serve: Serve) -> None:
    async with serve(file_retention=0.5) as served:
        answer = await served.client.post("/v1/files", files={"file": ("a.png", png())})
        assert answer.status_code == 201, answer.text
        path = f"/v1/files/{answer.json()['file_id']}"

        async def gone() -> bool:
            return (await served.client.get(path)).status_code == 404

        await wait_until(gone)
        assert await served.services.store.count_file_blobs() == 0
