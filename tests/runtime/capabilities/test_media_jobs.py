"""Media jobs: background image and video generation bound to the loop that started them.

Against the fake upstream through the real openai SDK; the only test double is a provider whose
body ignores cancellation (no real upstream can be made to do that).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from agent_runtime import AgentCore, ModelBinding, ModelBindings
from agent_runtime.capabilities import GeneratedImage, Images, submit_image, submit_video
from agent_runtime.errors import LoopAffinityError, ProviderError
from agent_runtime.testing import ScriptedModel
from tests.fakes.upstream import FakeUpstream, Gate, Hold, freeze_imports, status

freeze_imports()


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server


def _image(upstream: FakeUpstream, **options: Any) -> ModelBinding:
    options.setdefault("api_key", "sk-test")
    return ModelBinding.image(model="gpt-image-1", base_url=upstream.openai_url, **options)


def _video(upstream: FakeUpstream) -> ModelBinding:
    return ModelBinding.video(model="sora-2", base_url=upstream.openai_url, api_key="sk-test")


async def test_an_image_job_runs_in_the_background_and_reports_its_status(
    upstream: FakeUpstream,
) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    async with _image(upstream) as binding:
        job = submit_image("a red panda", binding=binding)
        assert job.status in ("queued", "running") and not job.done()
        assert job.kind == "image" and job.id.startswith("job_")
        assert binding.job_count == 1
        await upstream.wait_until(lambda: gate.waiting == 1)
        assert job.status == "running"
        gate.open()
        result = await job
        assert job.done() and job.result() is result
        assert str(job.status) == "completed"
        assert result.images[0].data is not None and result.images[0].data.startswith(b"\x89PNG")
        assert job.finished_at is not None and job.finished_at >= job.created_at
        assert binding.job_count == 0


async def test_a_waiter_that_gives_up_leaves_the_job_running(upstream: FakeUpstream) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    async with _image(upstream) as binding:
        job = submit_image("a red panda", binding=binding)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await job
        assert job.status == "running"
        gate.open()
        assert (await job).images


async def test_a_failed_job_keeps_its_error(upstream: FakeUpstream) -> None:
    upstream.script(status(400, "prompt refused"))
    async with _image(upstream) as binding:
        job = submit_image("a red panda", binding=binding)
        with pytest.raises(ProviderError, match="HTTP 400"):
            await job
        assert job.status == "failed"
        assert isinstance(job.exception(), ProviderError)


async def test_a_job_belongs_to_its_loop(upstream: FakeUpstream) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    async with _image(upstream) as binding:
        job = submit_image("a red panda", binding=binding)
        errors: list[BaseException] = []

        def from_another_loop() -> None:
            async def drive() -> None:
                try:
                    await job
                except LoopAffinityError as exc:
                    errors.append(exc)
                try:
                    job.cancel()
                except LoopAffinityError as exc:
                    errors.append(exc)

            asyncio.run(drive())

        def from_a_plain_thread() -> None:
            try:
                job.cancel()
            except LoopAffinityError as exc:
                errors.append(exc)

        await asyncio.to_thread(from_another_loop)
        await asyncio.to_thread(from_a_plain_thread)
        assert len(errors) == 3
        assert all(isinstance(e, LoopAffinityError) for e in errors)
        assert all(e.owner_loop is asyncio.get_running_loop() for e in errors)  # type: ignore[attr-defined]
        assert errors[2].current_loop is None  # type: ignore[attr-defined]
        # status is readable from anywhere, and the job was not disturbed
        assert await asyncio.to_thread(lambda: job.status) == "running"
        gate.open()
        assert (await job).images


async def test_submitting_needs_a_running_loop_and_the_bindings_loop(
    upstream: FakeUpstream,
) -> None:
    binding = _image(upstream)
    with pytest.raises(RuntimeError, match="running event loop"):
        await asyncio.to_thread(submit_image, "x", binding=binding)
    async with binding:
        await binding.preflight()

        def elsewhere() -> None:
            async def start() -> None:
                submit_image("x", binding=binding)

            asyncio.run(start())

        with pytest.raises(LoopAffinityError):
            await asyncio.to_thread(elsewhere)
    assert upstream.requests == []


async def test_cancelling_a_job_ends_its_request(upstream: FakeUpstream) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    async with _image(upstream) as binding:
        job = submit_image("a red panda", binding=binding)
        await upstream.wait_until(lambda: gate.waiting == 1)
        assert job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert job.status == "cancelled"
        assert not job.cancel()  # already over
        await upstream.wait_until(lambda: upstream.disconnects == 1)


async def test_a_video_job_is_created_polled_and_downloaded(upstream: FakeUpstream) -> None:
    upstream.video_polls = 3
    async with _video(upstream) as binding:
        job = submit_video("a dog surfing", binding=binding, seconds=8, size="1280x720")
        video = await job
    assert job.status == "completed" and job.progress == 100
    assert video.remote_id == job.remote_id and video.media_type == "video/mp4"
    assert video.data.endswith(b"a dog surfing")
    create, *polls, download = upstream.requests
    assert create.method == "POST" and create.path == "/v1/videos"
    assert create.form == {
        "model": "sora-2",
        "prompt": "a dog surfing",
        "seconds": "8",
        "size": "1280x720",
    }
    assert [p.path for p in polls] == [f"/v1/videos/{job.remote_id}"] * 3
    assert download.path == f"/v1/videos/{job.remote_id}/content"


async def test_a_failed_video_job_is_a_provider_error(upstream: FakeUpstream) -> None:
    async with _video(upstream) as binding:
        job = submit_video("this will fail", binding=binding)
        with pytest.raises(ProviderError, match="failed: the fake could not render"):
            await job
    assert job.status == "failed"


async def test_cancelling_a_video_job_deletes_the_upstream_job(upstream: FakeUpstream) -> None:
    upstream.video_gate = Gate()
    async with _video(upstream) as binding:
        job = submit_video("a long film", binding=binding)
        await upstream.wait_until(lambda: len(upstream.requests) >= 2)  # created, polled
        assert job.remote_id is not None and job.status == "running"
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert upstream.videos[job.remote_id].deleted
        assert upstream.requests[-1].method == "DELETE"


async def test_aclose_cancels_and_drains_jobs_before_closing_providers(
    upstream: FakeUpstream,
) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    upstream.video_gate = Gate()
    bindings = ModelBindings(llm=ScriptedModel([]), image=_image(upstream), video=_video(upstream))
    agent = AgentCore(bindings)
    try:
        # one after the other: the image's request is the one the scripted hold answers
        # (generous limits: a safety net for a loaded machine, not a synchronisation delay)
        image_job = agent.submit_image("a red panda")
        await upstream.wait_until(lambda: gate.waiting == 1, limit=60)
        video_job = agent.submit_video("a long film")
        assert set(agent.media_jobs) == {image_job, video_job}
        await upstream.wait_until(lambda: len(upstream.videos) == 1, limit=60)
        await upstream.wait_until(
            lambda: any(r.method == "GET" for r in upstream.requests), limit=60
        )
        image_provider = bindings.image[0].provider
        video_provider = bindings.video[0].provider
        # what each provider looked like when its job ended
        open_at_end: dict[str, bool] = {}
        image_job.task.add_done_callback(
            lambda _t: open_at_end.update(image=not image_provider.closed)
        )
        video_job.task.add_done_callback(
            lambda _t: open_at_end.update(video=not video_provider.closed)
        )
    except BaseException:
        gate.open()
        await agent.aclose()
        raise

    await agent.aclose()

    assert image_job.status == "cancelled" and video_job.status == "cancelled"
    assert open_at_end == {"image": True, "video": True}
    assert image_provider.closed and video_provider.closed
    # the video job used its still-open provider to delete the upstream job
    (video,) = upstream.videos.values()
    assert video.deleted
    assert agent.media_jobs == ()
    with pytest.raises(RuntimeError):
        agent.submit_video("again")


class _Stubborn:
    """An image provider whose work ignores one cancellation and goes on until released."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.closed = False

    async def generate_image(
        self,
        prompt: str,
        *,
        n: int = 1,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Images:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            await self.release.wait()  # ignores the cancellation: finishes its work
        return Images([GeneratedImage(data=b"late")], model="stubborn")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_job_that_ignores_cancellation_delays_close() -> None:
    provider = _Stubborn()
    agent = AgentCore(ModelBindings(llm=ScriptedModel([]), image=provider))
    job = agent.submit_image("slow")
    await provider.started.wait()
    closing = asyncio.ensure_future(agent.aclose())
    await provider.cancelled.wait()
    for _ in range(5):  # close stays pending while the job body runs on
        await asyncio.sleep(0)
    assert not closing.done() and not job.done()
    provider.release.set()
    await closing
    # the body swallowed the cancellation and returned: the job completed after all
    assert job.status == "completed"
    assert not provider.closed  # a supplied provider is never closed by the agent


async def test_rotation_under_a_running_job_keeps_its_provider_open(
    upstream: FakeUpstream,
) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    keys = iter(["key-old", "key-new", "key-newer"])
    binding = _image(upstream, api_key=None, credential_provider=lambda: next(keys))
    async with binding:
        job = submit_image("a slow painting", binding=binding)
        await upstream.wait_until(lambda: gate.waiting == 1)
        old = binding.provider
        await binding.arefresh()
        assert binding.provider is not old and not old.closed
        assert binding.retired_count == 1 and binding.lease_count == 1
        # new calls use the new credential while the job still holds the old provider
        other = submit_image("a quick sketch", binding=binding)
        assert (await other).images
        gate.open()
        assert (await job).images
        assert not old.closed  # idle now, closed by the next rotation
        await binding.arefresh()
        assert old.closed and binding.retired_count == 0
    held, quick = upstream.requests
    assert held.api_key == "key-old" and quick.api_key == "key-new"


async def test_jobs_of_a_standalone_binding_end_with_its_context(upstream: FakeUpstream) -> None:
    gate = Gate()
    upstream.script(Hold(gate))
    async with _image(upstream) as binding:
        job = submit_image("left running", binding=binding)
        await upstream.wait_until(lambda: gate.waiting == 1)
    assert job.status == "cancelled"
    assert not binding.built


def test_a_thread_started_job_is_alone_on_its_loop() -> None:
    # one loop per thread: each thread's job runs on the loop of its own asyncio.run
    loops: list[asyncio.AbstractEventLoop] = []

    def worker() -> None:
        async def main() -> None:
            async with FakeUpstream() as server, _image(server) as binding:
                job = submit_image("x", binding=binding)
                loops.append(job.loop)
                await job

        asyncio.run(main())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loops) == 2 and loops[0] is not loops[1]
