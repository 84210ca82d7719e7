"""Model bindings: a model definition, the provider built from it, and failover chains.

A ``ModelBinding`` is either a *definition* (``ModelBinding.llm(model=..., protocol=...,
api_key=...)``), whose provider it builds lazily, rotates and closes, or a wrapper around a
provider the caller supplies (``ModelBinding(provider=...)``), which it never closes. Every
binding has a *purpose* (``llm``, ``image``, ``video``, ``tts``, ``asr``, ``embed``, ``rerank``;
see ``purposes.py``), one factory each; all purposes share one lifecycle.

The lifecycle, loop claim and leases are ``binding.py``'s; the chains ``chains.py``'s; the
purposes and how each is built ``purposes.py``'s; setting strings ``specs.py``'s.

``ModelBindings(llm=[primary, fallback, ...], embed=..., image=...)`` holds one failover chain
per purpose, walked on a retryable ``ProviderError``; ``binding_from_spec`` and
``bindings_from_spec`` build chat bindings from setting strings such
as ``openai:gpt-4o-mini`` or ``deepseek``.
"""

from __future__ import annotations

from .binding import (
    DEFAULT_KEY_ENV,
    BindingOptions,
    CredentialProvider,
    ModelBinding,
    PreflightError,
)
from .chains import BindingLike, ModelBindings
from .specs import binding_from_spec, bindings_from_spec

__all__ = [
    "DEFAULT_KEY_ENV",
    "BindingLike",
    "BindingOptions",
    "CredentialProvider",
    "ModelBinding",
    "ModelBindings",
    "PreflightError",
    "binding_from_spec",
    "bindings_from_spec",
]
