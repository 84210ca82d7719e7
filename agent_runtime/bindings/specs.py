"""Model settings strings: ``openai:gpt-4o-mini``, ``openai-responses:MODEL``,
``anthropic:MODEL``, a preset, ``demo``.

``binding_from_spec`` turns one such string into a chat ``ModelBinding``;
``bindings_from_spec`` a primary and its fallbacks into ``ModelBindings``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .. import presets
from ..errors import ConfigurationError
from .binding import ModelBinding
from .chains import ModelBindings

__all__ = ["binding_from_spec", "bindings_from_spec"]

# a wire's prefix, and the host whose key and base URL variables it reads (OPENAI_API_KEY...)
_WIRES = {"openai": "openai", "openai-responses": "openai", "anthropic": "anthropic"}


def binding_from_spec(spec: str, **env: Any) -> ModelBinding:
    """A binding from a setting string.

    Forms: ``demo`` (the offline demo model), ``openai:MODEL`` (Chat Completions),
    ``openai-responses:MODEL`` (the Responses API, with the same key and base URL),
    ``anthropic:MODEL``, a preset name (``deepseek``, ``groq``, ``together``, ``openrouter``,
    ``ollama``, ``vllm``, ...) or ``PRESET:MODEL``. Upper-case keywords override the
    environment (``OPENAI_API_KEY``,
    ``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, a preset's key variable
    such as ``DEEPSEEK_API_KEY``); what is not given is read from ``os.environ``. Lower-case
    keywords are binding options: ``client_timeout``, ``client_max_retries``, ``params``,
    ``retry``, ``credential_provider``.
    """
    overrides = {key: value for key, value in env.items() if key.isupper()}
    options = {key: value for key, value in env.items() if not key.isupper()}

    def lookup(name: str) -> str | None:
        value = overrides[name] if name in overrides else os.environ.get(name)
        if value is None:
            return None
        text = str(value).strip()
        return text or None

    text = spec.strip()
    if not text:
        raise ConfigurationError("empty model setting")
    prefix, _, model = text.partition(":")
    prefix = prefix.strip().lower()
    model = model.strip()
    if prefix == "demo" and not model:
        if options:
            raise ConfigurationError(
                f"the demo model takes no binding options ({', '.join(sorted(options))})"
            )
        from ..providers.demo import DemoModel

        demo_options: dict[str, float] = {}
        delay = lookup("AGENT_DEMO_TOKEN_DELAY")
        if delay is not None:
            demo_options["token_delay"] = float(delay)
        slow = lookup("AGENT_DEMO_SLOW_SECONDS")
        if slow is not None:
            demo_options["slow_seconds"] = float(slow)
        return ModelBinding(provider=DemoModel(**demo_options))
    if prefix in _WIRES and model:
        host = _WIRES[prefix]
        upper = host.upper()
        return ModelBinding.llm(
            model=model,
            protocol=prefix,
            api_key=lookup(f"{upper}_API_KEY"),
            base_url=lookup(f"{upper}_BASE_URL"),
            **{"provider_name": host, **options},
        )
    preset = presets.get(prefix)
    if preset is None:
        raise ConfigurationError(
            f"unknown model setting {spec!r}: use 'demo', 'openai:MODEL', "
            f"'openai-responses:MODEL', 'anthropic:MODEL', or a preset "
            f"({', '.join(presets.names())}), optionally as 'PRESET:MODEL'"
        )
    key_env = presets.key_env(prefix)
    preset_options: dict[str, Any] = dict(options)
    if model:
        preset_options["model"] = model
    if key_env is not None and "api_key" not in preset_options:
        api_key = lookup(key_env)
        if api_key is not None:
            preset_options["api_key"] = api_key
    return preset(**preset_options)


def bindings_from_spec(
    model: str, fallbacks: str | Sequence[str] = (), **env: Any
) -> ModelBindings:
    """``ModelBindings`` for a primary setting and its fallbacks (a comma-separated string or a
    list), each parsed by ``binding_from_spec`` with the same ``env``."""
    if isinstance(fallbacks, str):
        fallbacks = fallbacks.split(",")
    specs = [model, *(item for item in fallbacks if item.strip())]
    return ModelBindings(llm=[binding_from_spec(item, **env) for item in specs])
