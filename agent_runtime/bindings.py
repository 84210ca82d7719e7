"""Model bindings: a model definition, its lazily built provider, and failover chains.

Minimal form; providers built from a definition (``ModelBinding.llm``), loop claims, credential
rotation and preflight land with the provider layer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from .model import Model

__all__ = ["ModelBinding", "ModelBindings"]


class ModelBinding:
    """One model: a caller-supplied provider (``provider=``)."""

    def __init__(self, *, provider: Model, model: str | None = None) -> None:
        self.provider = provider
        self.model = model or getattr(provider, "model_name", None) or type(provider).__name__

    @asynccontextmanager
    async def lease_provider(self) -> AsyncIterator[Model]:
        """The provider for one call; it stays open until the lease ends."""
        yield self.provider

    async def arefresh(self) -> None:
        """Rebuild the provider with a fresh credential (no-op for a supplied provider)."""

    async def aclose(self) -> None:
        """Close what this binding built (a supplied provider is the caller's to close)."""


class ModelBindings:
    """Bindings by purpose; ``llm`` is tried in order on retryable provider errors."""

    def __init__(self, *, llm: ModelBinding | Sequence[ModelBinding]) -> None:
        self.llm = [llm] if isinstance(llm, ModelBinding) else list(llm)
        if not self.llm:
            raise ValueError("ModelBindings needs at least one llm binding")

    async def aclose(self) -> None:
        """Close every binding."""
        for binding in self.llm:
            await binding.aclose()
