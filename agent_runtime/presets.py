"""Ready-made bindings for common hosts.

Each function returns a ``ModelBinding.llm(...)`` definition: nothing is built or contacted until
the binding's first use (or ``preflight()``). The API key comes from ``api_key=``, else from
the host's environment variable (read when the provider is built); every other keyword
(``client_timeout``, ``client_max_retries``, ``params``, ``retry``, ``credential_provider``,
``default_headers``) goes to ``ModelBinding.llm``::

    from agent_runtime import AgentCore, ModelBindings, presets

    agent = AgentCore(ModelBindings(llm=[presets.deepseek(), presets.groq(client_max_retries=0)]))

The local servers (Ollama, vLLM) need no key; a placeholder is sent unless you pass one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .bindings.binding import ModelBinding
from .errors import ConfigurationError

__all__ = [
    "ANTHROPIC_URL",
    "DEEPSEEK_URL",
    "GROQ_URL",
    "OLLAMA_URL",
    "OPENAI_URL",
    "OPENROUTER_URL",
    "TOGETHER_URL",
    "VLLM_URL",
    "anthropic",
    "deepseek",
    "get",
    "groq",
    "key_env",
    "names",
    "ollama",
    "openai",
    "openrouter",
    "together",
    "vllm",
]

OPENAI_URL = "https://api.openai.com/v1"
ANTHROPIC_URL = "https://api.anthropic.com"
DEEPSEEK_URL = "https://api.deepseek.com/v1"
GROQ_URL = "https://api.groq.com/openai/v1"
TOGETHER_URL = "https://api.together.xyz/v1"
OPENROUTER_URL = "https://openrouter.ai/api/v1"
OLLAMA_URL = "http://127.0.0.1:11434/v1"
VLLM_URL = "http://127.0.0.1:8000/v1"


def _hosted(
    *,
    name: str,
    protocol: str,
    model: str,
    base_url: str | None,
    api_key: str | None,
    key_env: str,
    options: dict[str, Any],
) -> ModelBinding:
    return ModelBinding.llm(
        model=model,
        protocol=protocol,
        api_key=api_key,
        base_url=base_url,
        provider_name=name,
        api_key_env=key_env,
        **options,
    )


def openai(
    model: str = "gpt-4o-mini",
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    **options: Any,
) -> ModelBinding:
    """OpenAI (key: ``OPENAI_API_KEY``; ``base_url`` defaults to ``OPENAI_BASE_URL`` or
    api.openai.com)."""
    return _hosted(
        name="openai",
        protocol="openai",
        model=model,
        base_url=base_url,
        api_key=api_key,
        key_env="OPENAI_API_KEY",
        options=options,
    )


def anthropic(
    model: str = "claude-sonnet-4-5",
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    **options: Any,
) -> ModelBinding:
    """Anthropic's Messages API (key: ``ANTHROPIC_API_KEY``)."""
    return _hosted(
        name="anthropic",
        protocol="anthropic",
        model=model,
        base_url=base_url,
        api_key=api_key,
        key_env="ANTHROPIC_API_KEY",
        options=options,
    )


def deepseek(
    model: str = "deepseek-chat",
    *,
    api_key: str | None = None,
    base_url: str = DEEPSEEK_URL,
    **options: Any,
) -> ModelBinding:
    """DeepSeek (key: ``DEEPSEEK_API_KEY``). Its API takes text only: a call with an image or
    a document fails before it is sent (``input_kinds``), unless you widen it."""
    options.setdefault("input_kinds", {"text"})
    return _hosted(
        name="deepseek",
        protocol="openai",
        model=model,
        base_url=base_url,
        api_key=api_key,
        key_env="DEEPSEEK_API_KEY",
        options=options,
    )


def groq(
    model: str = "llama-3.3-70b-versatile",
    *,
    api_key: str | None = None,
    base_url: str = GROQ_URL,
    **options: Any,
) -> ModelBinding:
    """Groq (key: ``GROQ_API_KEY``)."""
    return _hosted(
        name="groq",
        protocol="openai",
        model=model,
        base_url=base_url,
        api_key=api_key,
        key_env="GROQ_API_KEY",
        options=options,
    )


def together(
    model: str = "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    *,
    api_key: str | None = None,
    base_url: str = TOGETHER_URL,
    **options: Any,
) -> ModelBinding:
    """Together AI (key: ``TOGETHER_API_KEY``)."""
    return _hosted(
        name="together",
        protocol="openai",
        model=model,
        base_url=base_url,
        api_key=api_key,
        key_env="TOGETHER_API_KEY",
        options=options,
    )


def openrouter(
    model: str = "openai/gpt-4o-mini",
    *,
    api_key: str | None = None,
    base_url: str = OPENROUTER_URL,
    **options: Any,
) -> ModelBinding:
    """OpenRouter (key: ``OPENROUTER_API_KEY``)."""
    return _hosted(
        name="openrouter",
        protocol="openai",
        model=model,
        base_url=base_url,
        api_key=api_key,
        key_env="OPENROUTER_API_KEY",
        options=options,
    )


def ollama(
    model: str = "llama3.2",
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    **options: Any,
) -> ModelBinding:
    """A local Ollama server (``base_url`` defaults to ``OLLAMA_BASE_URL`` or
    127.0.0.1:11434/v1; no key needed)."""
    return ModelBinding.llm(
        model=model,
        protocol="openai",
        api_key=api_key or os.environ.get("OLLAMA_API_KEY") or "ollama",
        base_url=base_url or os.environ.get("OLLAMA_BASE_URL") or OLLAMA_URL,
        provider_name="ollama",
        **options,
    )


def vllm(
    model: str | None = None,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    **options: Any,
) -> ModelBinding:
    """A local vLLM server (``base_url`` defaults to ``VLLM_BASE_URL`` or 127.0.0.1:8000/v1;
    the key, if the server was started with ``--api-key``, from ``VLLM_API_KEY``)."""
    if not model:
        raise ConfigurationError("the vllm preset needs the served model's name: vllm(model=...)")
    return ModelBinding.llm(
        model=model,
        protocol="openai",
        api_key=api_key or os.environ.get("VLLM_API_KEY") or "EMPTY",
        base_url=base_url or os.environ.get("VLLM_BASE_URL") or VLLM_URL,
        provider_name="vllm",
        **options,
    )


_PRESETS: dict[str, tuple[Callable[..., ModelBinding], str | None]] = {
    "openai": (openai, "OPENAI_API_KEY"),
    "anthropic": (anthropic, "ANTHROPIC_API_KEY"),
    "deepseek": (deepseek, "DEEPSEEK_API_KEY"),
    "groq": (groq, "GROQ_API_KEY"),
    "together": (together, "TOGETHER_API_KEY"),
    "openrouter": (openrouter, "OPENROUTER_API_KEY"),
    "ollama": (ollama, None),
    "vllm": (vllm, None),
}
_ALIASES = {"ollama-local": "ollama", "vllm-local": "vllm"}


def names() -> list[str]:
    """The preset names ``get`` accepts (aliases included)."""
    return sorted([*_PRESETS, *_ALIASES])


def get(name: str) -> Callable[..., ModelBinding] | None:
    """The preset function called ``name`` (case-insensitive), or None."""
    key = name.strip().lower()
    entry = _PRESETS.get(_ALIASES.get(key, key))
    return entry[0] if entry is not None else None


def key_env(name: str) -> str | None:
    """The environment variable holding the preset's API key, or None for local servers."""
    key = name.strip().lower()
    entry = _PRESETS.get(_ALIASES.get(key, key))
    return entry[1] if entry is not None else None
