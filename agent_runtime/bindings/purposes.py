"""What a model binding is for: its *purpose*, and how a definition of that purpose is built.

Every purpose shares one mechanism (``ModelBinding``: lazy provider, loop claim, leases,
preflight, rotation); a purpose only adds data: the wire protocols a definition may use, the
method a supplied provider must have, and the function that constructs a definition's provider::

    purpose     supplied provider needs     definition protocols
    ---------   ------------------------    ------------------------------------------------
    llm         stream(request)             openai (Chat Completions), openai-responses
                                            (the Responses API), anthropic (Messages)
    system_one  stream(request)             the same: a small, fast chat model for the
                                            runtime's own quick decisions (skill dispatch)
    image       generate_image(...)         openai (images/generations)
    video       create_video(...)           openai (videos: create, poll, download)
    tts         synthesize_speech(...)      openai (audio/speech)
    asr         transcribe(...)             openai (audio/transcriptions)
    embed       embed(...)                  openai (embeddings), local (in-process)
    rerank      rerank(...)                 openai (the /rerank shape of vLLM, Jina, Cohere),
                                            local (in-process)

A definition here holds no credential: the binding keeps the key and passes it to ``build``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..model import RetryOptions

__all__ = [
    "LOCAL_PROTOCOL",
    "PURPOSES",
    "Definition",
    "Purpose",
    "purpose_of",
    "safe_url",
    "validated_definition",
]

#: The protocol of in-process providers (``agent_runtime.local``): no SDK, no HTTP client.
LOCAL_PROTOCOL = "local"


@dataclass(frozen=True, slots=True)
class Definition:
    """What a definition-built binding needs to (re)build its provider. Holds no key."""

    model: str
    protocol: str
    base_url: str | None
    client_timeout: float | None
    client_max_retries: int | None
    params: Mapping[str, Any]
    retry: RetryOptions | None
    provider_name: str
    api_key_env: str | None
    default_headers: Mapping[str, str] | None = field(repr=False)
    purpose: str = "llm"

    @property
    def needs_key(self) -> bool:
        """False for in-process providers, which have no upstream to authenticate to."""
        return self.protocol != LOCAL_PROTOCOL

    @property
    def loop_agnostic(self) -> bool:
        """True when the provider built from this owns nothing bound to an event loop."""
        return self.protocol == LOCAL_PROTOCOL


@dataclass(frozen=True, slots=True)
class Purpose:
    """One purpose: its name, what it accepts, and how its definitions are built."""

    name: str
    title: str
    method: str
    protocols: tuple[str, ...]
    build: Callable[[Definition, str | None], Any]

    def has_method(self, provider: object) -> bool:
        """True if ``provider`` can serve this purpose."""
        return callable(getattr(provider, self.method, None))


def _build_chat(definition: Definition, api_key: str | None) -> Any:
    common: dict[str, Any] = {
        "api_key": api_key,
        "base_url": definition.base_url,
        "timeout": definition.client_timeout,
        "max_retries": definition.client_max_retries,
        "params": definition.params,
        "retry": definition.retry,
        "provider_name": definition.provider_name,
        "default_headers": definition.default_headers,
    }
    provider: Any
    if definition.protocol == "anthropic":
        from ..providers.anthropic import AnthropicModel

        provider = AnthropicModel(definition.model, **common)
    elif definition.protocol == "openai-responses":
        from ..providers.openai_responses import OpenAIResponsesModel

        provider = OpenAIResponsesModel(definition.model, **common)
    else:
        from ..providers.openai import OpenAIModel

        provider = OpenAIModel(definition.model, **common)
    provider.prepare()
    return provider


def _build_capability(definition: Definition, api_key: str | None) -> Any:
    if definition.protocol == LOCAL_PROTOCOL:
        from ..local import LocalEmbeddingProvider, LocalRerankProvider

        options = dict(definition.params)
        if definition.purpose == "rerank":
            return LocalRerankProvider(model=definition.model, **options)
        return LocalEmbeddingProvider(model=definition.model, **options)
    from ..providers.openai_capabilities import OpenAICapabilities

    provider = OpenAICapabilities(
        definition.model,
        api_key=api_key,
        base_url=definition.base_url,
        timeout=definition.client_timeout,
        max_retries=definition.client_max_retries,
        params=definition.params,
        provider_name=definition.provider_name,
        default_headers=definition.default_headers,
    )
    provider.prepare()
    return provider


_CHAT_PROTOCOLS = ("openai", "openai-responses", "anthropic")

#: Every purpose, by name. A new purpose is one more entry (and a factory on ModelBinding).
PURPOSES: Mapping[str, Purpose] = {
    purpose.name: purpose
    for purpose in (
        Purpose("llm", "chat model", "stream", _CHAT_PROTOCOLS, _build_chat),
        Purpose("system_one", "System One model", "stream", _CHAT_PROTOCOLS, _build_chat),
        Purpose("image", "image model", "generate_image", ("openai",), _build_capability),
        Purpose("video", "video model", "create_video", ("openai",), _build_capability),
        Purpose("tts", "speech model", "synthesize_speech", ("openai",), _build_capability),
        Purpose("asr", "transcription model", "transcribe", ("openai",), _build_capability),
        Purpose("embed", "embedding model", "embed", ("openai", LOCAL_PROTOCOL), _build_capability),
        Purpose("rerank", "rerank model", "rerank", ("openai", LOCAL_PROTOCOL), _build_capability),
    )
}


def purpose_of(name: str) -> Purpose:
    """The purpose called ``name``; ConfigurationError naming the known ones otherwise."""
    found = PURPOSES.get(name)
    if found is None:
        raise ConfigurationError(
            f"unknown binding purpose {name!r}; expected one of {', '.join(PURPOSES)}"
        )
    return found


# validation -----------------------------------------------------------------------------------


def validated_definition(
    *,
    purpose: str = "llm",
    model: str | None,
    protocol: str | None,
    base_url: str | None,
    client_timeout: float | None,
    client_max_retries: int | None,
    params: Mapping[str, Any] | None,
    retry: RetryOptions | None,
    provider_name: str | None,
    api_key_env: str | None,
    default_headers: Mapping[str, str] | None,
) -> Definition:
    """A checked ``Definition``; ConfigurationError (a ValueError) says what is wrong."""
    spec = purpose_of(purpose)
    if not isinstance(model, str) or not model.strip():
        raise ConfigurationError("a model binding needs model= (or provider=)")
    protocol = protocol or "openai"
    if protocol not in spec.protocols:
        if purpose == "llm":
            hint = (
                "use 'openai' (any Chat Completions endpoint), 'openai-responses' (the "
                "Responses API) or 'anthropic'"
            )
        else:
            hint = f"a {spec.title} binding takes {' or '.join(map(repr, spec.protocols))}"
        raise ConfigurationError(f"unknown protocol {protocol!r}: {hint}")
    if base_url is not None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(
                f"base_url of model {model!r} must be an http(s) URL, got {safe_url(base_url)!r}"
            )
    if client_timeout is not None and (isinstance(client_timeout, bool) or not client_timeout > 0):
        raise ConfigurationError("client_timeout must be a positive number of seconds or None")
    if client_max_retries is not None and (
        isinstance(client_max_retries, bool)
        or not isinstance(client_max_retries, int)
        or client_max_retries < 0
    ):
        raise ConfigurationError("client_max_retries must be an integer >= 0 or None")
    if retry is not None and not isinstance(retry, RetryOptions):
        raise ConfigurationError("retry must be a RetryOptions")
    if protocol == LOCAL_PROTOCOL:
        given = {
            "base_url": base_url,
            "client_timeout": client_timeout,
            "client_max_retries": client_max_retries,
            "api_key_env": api_key_env,
            "default_headers": default_headers,
        }
        rejected = sorted(name for name, value in given.items() if value is not None)
        if rejected:
            raise ConfigurationError(
                f"{', '.join(rejected)} cannot be used with protocol 'local': an in-process "
                "provider has no SDK client or HTTP transport to configure"
            )
    return Definition(
        model=model,
        protocol=protocol,
        base_url=base_url,
        client_timeout=float(client_timeout) if client_timeout is not None else None,
        client_max_retries=client_max_retries,
        params=dict(params or {}),
        retry=retry,
        provider_name=provider_name or protocol,
        api_key_env=api_key_env,
        default_headers=dict(default_headers) if default_headers else None,
        purpose=purpose,
    )


def safe_url(url: str) -> str:
    """``url`` without user information (``user:password@``) or query string."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=netloc, query="", fragment="").geturl()
