"""Embeddings, rerank and media jobs through a real ``agent-server`` process.

The server's capability models come from its ``AGENT_CONFIG``: an in-process MiniLM model and
models behind the fake upstream (running in a thread of this process, on loopback). The
OpenAI endpoint is driven with the official ``openai`` SDK; the others with plain HTTP.
Authentication is on (two principals), admission is small (2 slots, 1 queue place) so that
its limits can be reached.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.capability_wire import fake_vector
from tests.fakes.upstream import FakeUpstream, Gate, Hold, status
from tests.support.local_models import needs_local_models
from tests.support.server import Server, launch
from tests.support.waiting import wait_for

# every server here serves an in-process MiniLM model beside the upstream's
pytestmark = needs_local_models

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


def agents_toml(upstream: FakeUpstream) -> str:
    url = upstream.openai_url
    return f"""
[embeddings.minilm]
protocol = "local"
model = "sentence-transformers/all-MiniLM-L6-v2"

[embeddings.remote]
model = "text-embedding-3-small"
base_url = "{url}"
api_key = "sk-upstream"
client_max_retries = 0

[rerankers.remote]
model = "rerank-english"
base_url = "{url}"
api_key = "sk-upstream"
client_max_retries = 0

[images.painter]
model = "gpt-image-1"
base_url = "{url}"
api_key = "sk-upstream"
client_max_retries = 0

[videos.film]
model = "sora-2"
base_url = "{url}"
api_key = "sk-upstream"

[agents.research]
model = "demo"
embed = "remote"
rerank = {{ protocol = "local", model = "all-MiniLM-L6-v2" }}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread() as server:
        yield server


def _environment(directory: Path, upstream: FakeUpstream) -> dict[str, str]:
    config = directory / "agents.toml"
    directory.mkdir(parents=True, exist_ok=True)
    config.write_text(agents_toml(upstream), encoding="utf-8")
    return {
        "AGENT_CONFIG": str(config),
        "AGENT_API_KEYS": "key-alice=alice,key-bob=bob",
        "AGENT_MAX_CONCURRENT_RUNS": "2",
        "AGENT_MAX_QUEUED_RUNS": "1",
        "AGENT_QUEUE_TIMEOUT": "30",
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("capabilities")
    running = launch(directory / "server", _environment(directory, upstream))
    yield running
    running.stop()
    log = running.log()
    assert "Application shutdown complete" in log, log[-5000:]
    assert "Traceback" not in log, log[-5000:]


def _openai(server: Server, key: str = "key-alice") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=key, base_url=f"{server.base_url}/openai/v1", max_retries=0)


async def test_the_openai_sdk_embeds_with_a_local_model(server: Server) -> None:
    async with _openai(server) as client:
        # the SDK asks for base64 by default and decodes it
        answer = await client.embeddings.create(
            model="minilm", input=["A cat sits on the mat.", "A kitten is lying on a rug."]
        )
        floats = await client.embeddings.create(
            model="minilm", input="A cat sits on the mat.", encoding_format="float"
        )
    cat, kitten = (row.embedding for row in answer.data)
    assert len(cat) == 384 and answer.model == "minilm"
    assert sum(a * b for a, b in zip(cat, kitten, strict=True)) > 0.5
    assert max(abs(a - b) for a, b in zip(cat, floats.data[0].embedding, strict=True)) < 1e-5
    assert answer.usage.prompt_tokens > 0


async def test_embeddings_reach_the_upstream_of_a_section_or_an_agent(
    server: Server, upstream: FakeUpstream
) -> None:
    async with _openai(server) as client:
        by_section = await client.embeddings.create(model="remote", input=["one", "two"])
        by_agent = await client.embeddings.create(model="research", input="one")
    assert [row.embedding for row in by_section.data] == [fake_vector("one"), fake_vector("two")]
    assert by_agent.data[0].embedding == fake_vector("one")
    sent = [r for r in upstream.requests if r.path == "/v1/embeddings"]
    assert {r.api_key for r in sent} == {"sk-upstream"}  # the caller's key stays here


async def test_embedding_errors_come_in_the_openai_shape(
    server: Server, upstream: FakeUpstream
) -> None:
    async with _openai(server) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.embeddings.create(model="nope", input="x")
        upstream.script(status(500, "upstream broke"), model="text-embedding-3-small")
        with pytest.raises(openai.APIStatusError) as broken:
            await client.embeddings.create(model="remote", input="x")
    async with _openai(server, key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.embeddings.create(model="minilm", input="x")
    assert missing.value.status_code == 404
    assert isinstance(missing.value.body, dict) and missing.value.body["code"] == "not_found"
    assert "minilm" in missing.value.message and "remote" in missing.value.message
    assert broken.value.status_code == 502
    assert isinstance(broken.value.body, dict) and broken.value.body["code"] == "provider_error"


async def test_rerank_with_an_upstream_and_with_a_local_model(server: Server) -> None:
    documents = ["Stock markets fell today.", "Pandas eat bamboo.", {"text": "It rained."}]
    async with server.client(headers=ALICE) as client:
        remote = await client.post(
            "/v1/rerank",
            json={"model": "remote", "query": "pandas eat", "documents": documents, "top_n": 2},
        )
        local = await client.post(
            "/v1/rerank",
            json={
                "model": "research",
                "query": "What do red pandas eat?",
                "documents": documents,
                "return_documents": False,
            },
        )
        empty = await client.post(
            "/v1/rerank", json={"model": "remote", "query": "q", "documents": []}
        )
        unknown = await client.post(
            "/v1/rerank", json={"model": "nope", "query": "q", "documents": ["d"]}
        )
    assert remote.status_code == 200, remote.text
    body = remote.json()
    assert [row["index"] for row in body["results"]] == [1, 0]
    assert body["results"][0] == {
        "index": 1,
        "relevance_score": 1.0,
        "document": {"text": "Pandas eat bamboo."},
    }
    assert local.status_code == 200, local.text
    assert local.json()["results"][0]["index"] == 1
    assert "document" not in local.json()["results"][0]
    assert empty.status_code == 422
    assert empty.headers["content-type"].startswith("application/problem+json")
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


def _until(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


async def _job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/media/{job_id}")
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


async def test_an_image_job_runs_in_the_background(server: Server) -> None:
    async with server.client(headers=ALICE) as client:
        accepted = await client.post(
            "/v1/media/images", json={"model": "painter", "prompt": "a red panda", "n": 2}
        )
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        assert accepted.headers["location"] == f"/v1/media/{job_id}"

        async def completed() -> dict[str, Any] | None:
            view = await _job(client, job_id)
            return view if view["status"] == "completed" else None

        view = await wait_for(completed)
        images = view["result"]["images"]
        assert len(images) == 2 and view["error"] is None
        assert base64.b64decode(images[0]["b64_json"]).startswith(b"\x89PNG")
        content = await client.get(images[1]["content_url"])
        assert content.headers["content-type"] == "image/png"
        assert content.content == base64.b64decode(images[1]["b64_json"])
        again = await client.post(f"/v1/media/{job_id}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "completed"
    async with server.client(headers=BOB) as other:
        assert (await other.get(f"/v1/media/{job_id}")).status_code == 404
        assert (await other.post(f"/v1/media/{job_id}/cancel")).status_code == 404


async def test_a_video_job_reports_progress_and_serves_its_bytes(server: Server) -> None:
    async with server.client(headers=ALICE) as client:
        accepted = await client.post(
            "/v1/media/videos", json={"model": "film", "prompt": "a dog surfing", "seconds": 4}
        )
        job_id = accepted.json()["job_id"]

        async def completed() -> dict[str, Any] | None:
            view = await _job(client, job_id)
            return view if view["status"] == "completed" else None

        view = await wait_for(completed)
        assert view["progress"] == 100 and view["result"]["media_type"] == "video/mp4"
        content = await client.get(view["result"]["content_url"])
        assert content.headers["content-type"] == "video/mp4"
        assert content.content.endswith(b"a dog surfing")


async def test_jobs_share_the_admission_of_runs(server: Server, upstream: FakeUpstream) -> None:
    gate = Gate()
    upstream.script(Hold(gate), Hold(gate), Hold(gate), model="gpt-image-1")
    try:
        async with server.client(headers=ALICE) as client:
            ids = []
            for index in range(3):
                accepted = await client.post(
                    "/v1/media/images", json={"model": "painter", "prompt": f"held {index}"}
                )
                assert accepted.status_code == 202, accepted.text
                ids.append(accepted.json()["job_id"])
            await wait_for(_until(lambda: gate.waiting == 2))
            assert [(await _job(client, i))["status"] for i in ids] == [
                "running",
                "running",
                "queued",
            ]
            # slots and queue are full: a job, an embedding call and a run are all refused
            refused = await client.post(
                "/v1/media/images", json={"model": "painter", "prompt": "one too many"}
            )
            embedding = await client.post(
                "/openai/v1/embeddings", json={"model": "minilm", "input": "x"}
            )
            run = await client.post(
                "/v1/sessions/cap-admission/runs", json={"input": "hi", "stream": False}
            )
            assert refused.status_code == 429 and refused.json()["code"] == "overloaded"
            assert "retry-after" in refused.headers
            assert embedding.status_code == 429
            assert embedding.json()["error"]["code"] == "overloaded"
            assert run.status_code == 429
            # the queued job can be cancelled before it starts
            cancelled = await client.post(f"/v1/media/{ids[2]}/cancel")
            assert cancelled.status_code == 202  # accepted: the job's task ends it

            async def queued_cancelled() -> bool:
                return bool((await _job(client, ids[2]))["status"] == "cancelled")

            await wait_for(queued_cancelled)
            # a running one too: its upstream request ends
            disconnects = upstream.disconnects
            assert (await client.post(f"/v1/media/{ids[1]}/cancel")).status_code == 202
            await wait_for(_until(lambda: upstream.disconnects > disconnects))
            assert (await _job(client, ids[1]))["status"] == "cancelled"
            gate.open()

            async def first_done() -> bool | None:
                return (await _job(client, ids[0]))["status"] == "completed" or None

            await wait_for(first_done)
    finally:
        gate.open()


async def test_shutdown_cancels_media_jobs_before_the_providers_close(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.video_gate = Gate()
    try:
        running = launch(tmp_path / "server", _environment(tmp_path, upstream))
        try:
            async with running.client(headers=ALICE) as client:
                accepted = await client.post(
                    "/v1/media/videos", json={"model": "film", "prompt": "a very long film"}
                )
                job_id = accepted.json()["job_id"]

                async def polling() -> bool | None:
                    view = await _job(client, job_id)
                    return (view["status"] == "running" and view["progress"] is not None) or None

                await wait_for(polling)
            running.signal(signal.SIGTERM)
            assert running.wait(60) in (0, -signal.SIGTERM)
        finally:
            running.stop()
        log = running.log()
        assert "Application shutdown complete" in log and "Traceback" not in log, log[-5000:]
        # the job, cancelled while its provider was still open, deleted its upstream job
        deleted = [v for v in upstream.videos.values() if v.prompt == "a very long film"]
        assert len(deleted) == 1 and deleted[0].deleted
    finally:
        upstream.video_gate.open()
        upstream.video_gate = None
