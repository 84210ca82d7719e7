"""The capability models of ``AGENT_CONFIG``: ``[embeddings.NAME]`` and its siblings.

Each top-level section defines named models of one purpose; an agent takes one (or a failover
chain) of each purpose under a key of its own, by section name or inline::

    section            agent key   purpose
    [embeddings.NAME]  embed       embed
    [rerankers.NAME]   rerank      rerank
    [images.NAME]      image       image
    [videos.NAME]      video       video
    [speech.NAME]      tts         tts
    [transcription.NAME] asr       asr

    [embeddings.minilm]            # in-process, the packaged MiniLM weights
    protocol = "local"
    model = "sentence-transformers/all-MiniLM-L6-v2"

    [embeddings.small]             # any OpenAI-compatible /embeddings
    model = "text-embedding-3-small"
    base_url = "${EMBEDDINGS_URL:-https://api.openai.com/v1}"
    api_key_env = "OPENAI_API_KEY"

    [agents.research]
    embed = ["small", "minilm"]    # primary, then the fallback
    image = { model = "gpt-image-1" }

Keys of a model: ``model`` (required), ``protocol`` (``openai``, the default, or ``local`` for
embed and rerank), ``base_url``, ``api_key`` (prefer ``${VAR}``), ``api_key_env``,
``client_timeout``, ``client_max_retries``, ``params`` (a table sent with every request); for
``local`` also ``backend`` (``numpy`` or ``sentence-transformers``), ``batch_size`` and
``max_length``. Everything is checked when the file is read (a local model must be on the
machine); nothing is built or contacted until the agents are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.bindings import ModelBinding
from agent_runtime.bindings.purposes import LOCAL_PROTOCOL, PURPOSES
from agent_runtime.errors import ConfigurationError
from app.agents.toml import Table, expand

__all__ = [
    "AGENT_KEYS",
    "SECTIONS",
    "CapabilitySpec",
    "agent_capabilities",
    "capability_binding",
    "capability_sections",
]

#: The top-level section of each purpose.
SECTIONS: Mapping[str, str] = {
    "embed": "embeddings",
    "rerank": "rerankers",
    "image": "images",
    "video": "videos",
    "tts": "speech",
    "asr": "transcription",
}
#: The agent keys: one per purpose, named as the purpose.
AGENT_KEYS: tuple[str, ...] = tuple(SECTIONS)

_KEYS = (
    "model",
    "protocol",
    "base_url",
    "api_key",
    "api_key_env",
    "client_timeout",
    "client_max_retries",
    "params",
    "backend",
    "batch_size",
    "max_length",
)
_LOCAL_KEYS = ("backend", "batch_size", "max_length")


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """One capability model as the file defines it."""

    purpose: str
    name: str
    model: str
    protocol: str = "openai"
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    client_timeout: float | None = None
    client_max_retries: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


def _spec(purpose: str, name: str, table: Table) -> CapabilitySpec:
    def text(key: str) -> str | None:
        value = table.string(key)
        return expand(table.file, (*table.where, key), value) if value is not None else None

    model = text("model")
    if model is None:
        raise table.error("model", 'a capability model needs model = "..."')
    protocol = text("protocol") or "openai"
    if protocol not in PURPOSES[purpose].protocols:
        allowed = " or ".join(repr(p) for p in PURPOSES[purpose].protocols)
        raise table.error("protocol", f"a {PURPOSES[purpose].title} takes {allowed}")
    retries = table.data.get("client_max_retries")
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)):
        raise table.error("client_max_retries", "expected an integer >= 0")
    params_table = table.child("params", None)
    params: dict[str, Any] = dict(params_table.data) if params_table is not None else {}
    if protocol == LOCAL_PROTOCOL:
        for key in (
            "params",
            "base_url",
            "api_key",
            "api_key_env",
            "client_timeout",
            "client_max_retries",
        ):
            if key in table.data:
                raise table.error(key, "an in-process (protocol 'local') model takes no " + key)
        backend = text("backend")
        if backend is not None:
            params["backend"] = backend
        for key in ("batch_size", "max_length"):
            number = table.integer(key)
            if number is not None:
                params[key] = number
    else:
        for key in _LOCAL_KEYS:
            if key in table.data:
                raise table.error(key, f"{key} is an option of protocol 'local' only")
    spec = CapabilitySpec(
        purpose=purpose,
        name=name,
        model=model,
        protocol=protocol,
        base_url=text("base_url"),
        api_key=text("api_key"),
        api_key_env=text("api_key_env"),
        client_timeout=table.seconds("client_timeout"),
        client_max_retries=retries,
        params=params,
    )
    try:
        # a definition only (nothing built); a local model's files must be on the machine
        capability_binding(spec, client_timeout=None, client_max_retries=None)
        if protocol == LOCAL_PROTOCOL:
            from agent_runtime.local import resolve_model

            resolve_model(model)
    except ConfigurationError as exc:
        raise table.error(None, str(exc)) from None
    return spec


def capability_binding(
    spec: CapabilitySpec, *, client_timeout: float | None, client_max_retries: int | None
) -> ModelBinding:
    """The binding of ``spec`` (a definition: built on first use). ``client_timeout`` and
    ``client_max_retries`` are the service's defaults for what the spec leaves unset."""
    remote = spec.protocol != LOCAL_PROTOCOL
    return ModelBinding(
        purpose=spec.purpose,
        model=spec.model,
        protocol=spec.protocol,
        base_url=spec.base_url,
        api_key=spec.api_key,
        api_key_env=spec.api_key_env,
        client_timeout=(spec.client_timeout or client_timeout) if remote else None,
        client_max_retries=(
            (spec.client_max_retries if spec.client_max_retries is not None else client_max_retries)
            if remote
            else None
        ),
        params=spec.params,
    )


def capability_sections(root: Table) -> dict[str, dict[str, CapabilitySpec]]:
    """Every top-level capability section of the file: purpose -> name -> spec."""
    found: dict[str, dict[str, CapabilitySpec]] = {}
    for purpose, section in SECTIONS.items():
        tables = root.child(section, None)
        if tables is None:
            continue
        for name in tables.data:
            table = tables.child(name, _KEYS)
            assert table is not None
            found.setdefault(purpose, {})[name] = _spec(purpose, name, table)
    return found


def agent_capabilities(
    table: Table, sections: Mapping[str, Mapping[str, CapabilitySpec]]
) -> dict[str, tuple[CapabilitySpec, ...]]:
    """An agent's capability chains: purpose -> specs (primary first)."""
    chains: dict[str, tuple[CapabilitySpec, ...]] = {}
    for purpose in AGENT_KEYS:
        if purpose not in table.data:
            continue
        value = table.data[purpose]
        items = value if isinstance(value, list) else [value]
        if not items:
            raise table.error(purpose, "expected a section name, an inline table or a list")
        chain: list[CapabilitySpec] = []
        for index, item in enumerate(items):
            at = index if isinstance(value, list) else None
            if isinstance(item, str):
                spec = sections.get(purpose, {}).get(item)
                if spec is None:
                    known = ", ".join(sections.get(purpose, {})) or "none"
                    raise table.error(
                        purpose,
                        f"no [{SECTIONS[purpose]}.{item}] section (defined: {known})",
                        at,
                    )
                chain.append(spec)
            elif isinstance(item, dict):
                where = (*table.where, purpose, *((index,) if at is not None else ()))
                inline = Table(table.file, where, item, _KEYS)
                chain.append(_spec(purpose, f"{table.where[-1]}.{purpose}", inline))
            else:
                raise table.error(purpose, "expected a section name or an inline table", at)
        chains[purpose] = tuple(chain)
    return chains
