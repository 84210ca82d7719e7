"""Capability calls against the fake upstream, through the real openai SDK over loopback.

Every purpose's binding follows chat's rules: lazy provider, loop claim, client options,
preflight, rotation, failover. Media jobs have their own file (``test_media_jobs.py``).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agent_runtime import AgentCore, ModelBinding, ModelBindings, PreflightError
from agent_runtime.capabilities import (
    embed,
    generate_image,
    rerank,
    synthesize_speech,
    transcribe,
)
from agent_runtime.errors import (
    AgentClosedError,
    ConfigurationError,
    InvalidInputError,
    LoopAffinityError,
    ProviderStatusError,
    ProviderTimeoutError,
)
from agent_runtime.providers.openai_capabilities import OpenAICapabilities
from agent_runtime.testing import ScriptedModel
from tests.fakes.capability_wire import fake_vector, wav_with_text
from tests.fakes.upstream import FakeUpstream, Stall, freeze_imports, status

freeze_imports()

FACTORIES: dict[str, Callable[..., ModelBinding]] = {
    "image": ModelBinding.image,
    "video": ModelBinding.video,
    "tts": ModelBinding.tts,
    "asr": ModelBinding.asr,
    "embed": ModelBinding.embed,
    "rerank": ModelBinding.rerank,
}


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server


def _state(binding: ModelBinding) -> tuple[bool, asyncio.AbstractEventLoop | None]:
    return binding.built, binding.owner_loop


def _binding(purpose: str, upstream: FakeUpstream, **options: Any) -> ModelBinding:
    options.setdefault("api_key", "sk-test")
    return FACTORIES[purpose](model=f"{purpose}-model", base_url=upstream.openai_url, **options)


# each capability over the wire ------------------------------------------------------------------


async def test_embed_returns_one_vector_per_text_in_order(upstream: FakeUpstream) -> None:
    async with _binding("embed", upstream) as binding:
        result = await embed(["first", "second", "third"], binding=binding)
    assert result.vectors == [fake_vector(t) for t in ("first", "second", "third")]
    assert result.model == "embed-model"
    assert result.usage is not None and result.usage.input_tokens == 3
    (request,) = upstream.requests
    assert request.path == "/v1/embeddings"
    assert request.api_key == "sk-test"
    # the SDK asks for base64 (compact) and decodes it: the vectors above are floats
    assert request.json["encoding_format"] == "base64"


async def test_embed_takes_one_string_dimensions_and_float_encoding(
    upstream: FakeUpstream,
) -> None:
    async with _binding("embed", upstream) as binding:
        one = await embed("only", binding=binding, dimensions=4)
        floats = await embed("only", binding=binding, params={"encoding_format": "float"})
    assert one.vectors == [fake_vector("only", 4)]
    assert upstream.requests[0].json["dimensions"] == 4
    assert upstream.requests[1].json["encoding_format"] == "float"
    assert floats.vectors == [fake_vector("only")]


async def test_embed_rejects_bad_input_before_any_request(upstream: FakeUpstream) -> None:
    async with _binding("embed", upstream) as binding:
        with pytest.raises(InvalidInputError, match="at least one text"):
            await embed([], binding=binding)
        with pytest.raises(InvalidInputError, match=r"texts\[1\] is int"):
            await embed(["ok", 3], binding=binding)  # type: ignore[list-item]
        with pytest.raises(InvalidInputError, match="dimensions"):
            await embed("x", binding=binding, dimensions=0)
    assert upstream.requests == []


async def test_rerank_orders_documents_most_relevant_first(upstream: FakeUpstream) -> None:
    documents = ["a blue whale", "the red panda sleeps", "a red fox", "panda"]
    async with _binding("rerank", upstream) as binding:
        ranking = await rerank("red panda", documents, binding=binding)
        best = await rerank("red panda", documents, binding=binding, top_n=2)
    assert [item.index for item in ranking.results] == [1, 2, 3, 0]
    assert ranking.results[0].document == "the red panda sleeps"
    assert ranking.results[0].score == 1.0 and ranking.results[-1].score == 0.0
    assert [item.index for item in best.results] == [1, 2]
    request = upstream.requests[1]
    assert request.path == "/v1/rerank"
    assert request.json == {
        "model": "rerank-model",
        "query": "red panda",
        "documents": documents,
        "top_n": 2,
    }


async def test_rerank_reads_a_cohere_style_v2_endpoint(upstream: FakeUpstream) -> None:
    binding = ModelBinding.rerank(
        model="rerank-v3.5", api_key="k", base_url=f"{upstream.url}/v2", client_max_retries=0
    )
    async with binding:
        ranking = await rerank("panda", ["fox", "panda"], binding=binding)
    assert upstream.requests[0].path == "/v2/rerank"
    assert [item.index for item in ranking.results] == [1, 0]


async def test_a_malformed_rerank_answer_is_a_provider_error(upstream: FakeUpstream) -> None:
    provider = OpenAICapabilities("m", api_key="k", base_url=upstream.openai_url)
    try:
        with pytest.raises(Exception, match="valid index") as caught:
            provider._ranking({"results": [{"index": 7, "relevance_score": 1}]}, ["a"], None)
        assert type(caught.value).__name__ == "ProviderError"
    finally:
        await provider.aclose()


async def test_generate_image_decodes_the_images(upstream: FakeUpstream) -> None:
    async with _binding("image", upstream) as binding:
        result = await generate_image("a red panda", binding=binding, n=2, size="1024x1024")
    assert len(result.images) == 2
    assert all(image.data and image.data.startswith(b"\x89PNG") for image in result.images)
    assert result.images[0].data != result.images[1].data
    assert result.images[0].media_type == "image/png"
    assert result.usage is not None and result.usage.output_tokens == 544
    body = upstream.requests[0].json
    assert body["n"] == 2 and body["size"] == "1024x1024" and body["model"] == "image-model"


async def test_speech_round_trips_through_transcription(upstream: FakeUpstream) -> None:
    async with _binding("tts", upstream) as tts, _binding("asr", upstream) as asr:
        speech = await synthesize_speech(
            "the quick brown fox", binding=tts, voice="nova", response_format="wav"
        )
        text = await transcribe(speech.audio, binding=asr, filename="fox.wav", language="en")
        verbose = await transcribe(
            speech.audio, binding=asr, params={"response_format": "verbose_json"}
        )
    assert speech.media_type == "audio/wav"
    assert speech.audio.startswith(b"RIFF")
    assert text.text == "the quick brown fox"
    assert verbose.language == "english" and verbose.duration == pytest.approx(0.1)
    speak, hear, _ = upstream.requests
    assert speak.path == "/v1/audio/speech"
    assert speak.json == {
        "model": "tts-model",
        "input": "the quick brown fox",
        "voice": "nova",
        "response_format": "wav",
    }
    assert hear.path == "/v1/audio/transcriptions"
    assert hear.form["model"] == "asr-model" and hear.form["language"] == "en"


async def test_transcribe_reads_a_file_off_the_loop(upstream: FakeUpstream, tmp_path: Any) -> None:
    path = tmp_path / "note.wav"
    path.write_bytes(wav_with_text("from a file"))
    async with _binding("asr", upstream) as asr:
        assert (await transcribe(path, binding=asr)).text == "from a file"
        with pytest.raises(InvalidInputError, match="cannot read"):
            await transcribe(tmp_path / "missing.wav", binding=asr)
        with pytest.raises(InvalidInputError, match="extension"):
            await transcribe(b"RIFF", binding=asr, filename="noext")


# the binding rules every purpose shares ---------------------------------------------------------


@pytest.mark.parametrize("purpose", sorted(FACTORIES))
async def test_every_purpose_is_lazy_and_claims_its_first_loop(
    purpose: str, upstream: FakeUpstream
) -> None:
    binding = _binding(purpose, upstream)
    assert _state(binding) == (False, None)
    assert f"purpose={purpose!r}" in repr(binding) and "sk-test" not in repr(binding)
    await binding.preflight()
    loop = asyncio.get_running_loop()
    assert _state(binding) == (True, loop)
    assert upstream.requests == []  # preflight makes no network call

    def elsewhere() -> None:
        async def use() -> None:
            await binding.preflight()

        asyncio.run(use())

    with pytest.raises(LoopAffinityError) as caught:
        await asyncio.to_thread(elsewhere)
    assert caught.value.owner_loop is loop and caught.value.model == f"{purpose}-model"
    await binding.aclose()
    assert _state(binding) == (False, None)


@pytest.mark.parametrize("purpose", sorted(FACTORIES))
async def test_client_options_reach_the_sdk_client_and_survive_rotation(
    purpose: str, upstream: FakeUpstream
) -> None:
    keys = iter(["key-1", "key-2"])
    binding = _binding(
        purpose,
        upstream,
        api_key=None,
        credential_provider=lambda: next(keys),
        client_timeout=7.5,
        client_max_retries=0,
    )
    async with binding:
        first = await binding.build_provider()
        assert isinstance(first, OpenAICapabilities)
        assert first.client.timeout == 7.5 and first.client.max_retries == 0
        assert first.client.api_key == "key-1"
        await binding.arefresh()
        second = binding.provider
        assert second is not first and first.closed
        assert second.client.timeout == 7.5 and second.client.max_retries == 0
        assert second.client.api_key == "key-2"


async def test_client_timeout_bounds_a_capability_call(upstream: FakeUpstream) -> None:
    upstream.script(Stall())
    binding = _binding("embed", upstream, client_timeout=0.3, client_max_retries=0)
    async with binding:
        with pytest.raises(ProviderTimeoutError):
            await embed("hangs", binding=binding)
    assert len(upstream.requests) == 1


def test_client_options_are_refused_where_no_sdk_client_exists() -> None:
    provider = ScriptedModel(["unused"])
    with pytest.raises(ValueError, match="client_timeout cannot be combined with provider="):
        ModelBinding.llm(provider=provider, client_timeout=3)
    with pytest.raises(ValueError, match="client_max_retries cannot be used with protocol 'local'"):
        ModelBinding.embed(model="all-MiniLM-L6-v2", protocol="local", client_max_retries=0)
    with pytest.raises(ConfigurationError, match="unknown protocol 'anthropic'"):
        ModelBinding.embed(model="m", protocol="anthropic")
    with pytest.raises(ConfigurationError, match="has no embed"):
        ModelBinding.embed(provider=object())


async def test_preflight_builds_every_purpose_and_names_the_one_that_fails(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    complete = ModelBindings(
        llm=ModelBinding.llm(model="chat", api_key="k", base_url=upstream.openai_url),
        **{purpose: _binding(purpose, upstream) for purpose in FACTORIES},
    )
    async with complete:
        await complete.preflight()
        assert complete.purposes == ("llm", "image", "video", "tts", "asr", "embed", "rerank")
        assert all(binding.built for _purpose, _index, binding in complete)
        await complete.preflight()  # idempotent
        assert all(binding.providers_built == 1 for _purpose, _index, binding in complete)
    assert upstream.requests == []

    broken = ModelBindings(
        llm=ModelBinding.llm(model="chat", api_key="k", base_url=upstream.openai_url),
        embed=_binding("embed", upstream),
        rerank=[_binding("rerank", upstream), _binding("rerank", upstream, api_key=None)],
    )
    async with broken:
        with pytest.raises(PreflightError, match=r"rerank\[1\].*OPENAI_API_KEY") as caught:
            await broken.preflight()
    assert caught.value.purpose == "rerank" and caught.value.index == 1


async def test_failover_moves_to_the_next_binding_on_a_retryable_error(
    upstream: FakeUpstream,
) -> None:
    upstream.script(status(503), model="primary")
    chain = ModelBindings(
        embed=[
            ModelBinding.embed(
                model="primary", api_key="k", base_url=upstream.openai_url, client_max_retries=0
            ),
            ModelBinding.embed(model="fallback", api_key="k", base_url=upstream.openai_url),
        ]
    )
    async with chain:
        result = await embed("x", binding=chain)
        assert result.model == "fallback"
        upstream.script(status(400, "bad input"), model="primary")
        with pytest.raises(ProviderStatusError, match="HTTP 400") as caught:
            await embed("x", binding=chain)
    assert caught.value.status_code == 400 and not caught.value.retryable
    assert [r.model for r in upstream.requests] == ["primary", "fallback", "primary"]


async def test_a_key_never_reaches_an_error_message(upstream: FakeUpstream) -> None:
    upstream.script(status(401, "bad key sk-secret-value"))
    binding = _binding("image", upstream, api_key="sk-secret-value")
    async with binding:
        with pytest.raises(ProviderStatusError) as caught:
            await generate_image("x", binding=binding)
    assert "sk-secret-value" not in str(caught.value)


async def test_a_call_needs_a_binding_of_its_purpose(upstream: FakeUpstream) -> None:
    image = _binding("image", upstream)
    with pytest.raises(ConfigurationError, match="is a image binding"):
        await embed("x", binding=image)
    with pytest.raises(ConfigurationError, match="given as embed"):
        ModelBindings(embed=image)
    with pytest.raises(ConfigurationError, match="no rerank binding"):
        await rerank("q", ["d"], binding=ModelBindings(embed=_binding("embed", upstream)))


async def test_for_current_loop_gives_each_loop_its_own_provider(upstream: FakeUpstream) -> None:
    binding = _binding("embed", upstream)
    async with binding:
        here = await embed("a", binding=binding)

    def elsewhere() -> list[list[float]]:
        sibling = binding.for_current_loop()

        async def use() -> list[list[float]]:
            async with sibling:
                return (await embed("a", binding=sibling)).vectors

        return asyncio.run(use())

    assert await asyncio.to_thread(elsewhere) == here.vectors


async def test_the_agent_serves_capabilities_from_its_bindings(upstream: FakeUpstream) -> None:
    bindings = ModelBindings(
        llm=ScriptedModel(["hi"]),
        embed=_binding("embed", upstream),
        rerank=_binding("rerank", upstream),
        tts=_binding("tts", upstream),
        asr=_binding("asr", upstream),
        image=_binding("image", upstream),
    )
    async with AgentCore.open(bindings) as agent:
        assert (await agent.embed("x")).vectors == [fake_vector("x")]
        assert (await agent.rerank("a b", ["b", "a b"])).results[0].index == 1
        speech = await agent.synthesize_speech("said", response_format="wav")
        assert (await agent.transcribe(speech.audio)).text == "said"
        assert (await agent.generate_image("x")).images
        keys = [request.api_key for request in upstream.requests]
        assert keys == ["sk-test"] * 5
    with pytest.raises(AgentClosedError):
        await agent.embed("x")
    with pytest.raises(AgentClosedError):
        agent.submit_image("x")
    assert all(not binding.built for _purpose, _index, binding in agent.bindings)


async def test_arefresh_credentials_rotates_every_purpose(upstream: FakeUpstream) -> None:
    keys = iter(["old", "new"])

    def current() -> str:
        return next(keys)

    bindings = ModelBindings(
        llm=ScriptedModel([]),
        embed=_binding("embed", upstream, api_key=None, credential_provider=current),
    )
    async with AgentCore.open(bindings) as agent:
        await agent.embed("x")
        await agent.arefresh_credentials()
        await agent.embed("x")
    assert [request.api_key for request in upstream.requests] == ["old", "new"]


def test_fake_vectors_survive_base64() -> None:
    vector = fake_vector("text")
    packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector))
    assert list(struct.unpack(f"<{len(vector)}f", base64.b64decode(packed))) == vector
