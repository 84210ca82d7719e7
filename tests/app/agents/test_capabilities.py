"""Capability models in ``AGENT_CONFIG``: ``[embeddings.NAME]`` and its siblings, agent keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_runtime.local import LocalEmbeddingProvider
from agent_runtime.providers.openai_capabilities import OpenAICapabilities
from app.agents.build import build_agents
from app.agents.config import ConfigError, load_config
from app.errors import NotFound
from tests.support.local_models import needs_local_models
from tests.support.served import MakeSettings

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "agents.toml"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "agents.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@needs_local_models
def test_the_examples_capability_models_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_MCP_TOKEN", "token-1")
    monkeypatch.delenv("EMBEDDINGS_URL", raising=False)
    config = load_config(str(EXAMPLE))
    minilm = config.capabilities["embed"]["minilm"]
    assert minilm.protocol == "local"
    assert minilm.params == {"backend": "numpy", "batch_size": 32}
    small = config.capabilities["embed"]["small"]
    assert small.base_url == "https://api.openai.com/v1"  # ${EMBEDDINGS_URL:-...}
    assert small.client_timeout == 20 and small.client_max_retries == 0
    assert small.params == {"dimensions": 384}
    research = config.agents["research"].capabilities
    assert [spec.name for spec in research["embed"]] == ["small", "minilm"]
    assert research["rerank"][0] is config.capabilities["rerank"]["minilm"]
    assert research["image"][0].model == "dall-e-3" and research["image"][0].client_timeout == 120
    assert config.agents["default"].capabilities == {}


@needs_local_models
async def test_capability_models_build_preflight_and_resolve(
    tmp_path: Path, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    path = write(
        tmp_path,
        """
[embeddings.minilm]
protocol = "local"
model = "all-MiniLM-L6-v2"

[embeddings.remote]
model = "text-embedding-3-small"
base_url = "http://127.0.0.1:9/v1"

[agents.helper]
model = "demo"
embed = ["remote", "minilm"]
""",
    )
    agents = await build_agents(make_settings(client_timeout=9.0), load_config(path))
    try:
        await agents.preflight()
        remote = agents.capabilities["embed"]["remote"]
        assert isinstance(remote.provider, OpenAICapabilities)
        assert remote.provider.client.timeout == 9.0  # the service's default client timeout
        assert isinstance(agents.capabilities["embed"]["minilm"].provider, LocalEmbeddingProvider)
        helper = agents.cores["helper"].bindings
        assert [b.model for b in helper.embed] == ["text-embedding-3-small", "all-MiniLM-L6-v2"]
        assert all(b.built for b in helper.embed)
        assert agents.capability("embed", "minilm") is agents.capabilities["embed"]["minilm"]
        assert agents.capability("embed", "helper") is helper
        with pytest.raises(NotFound, match=r"no embed model 'default'.*helper, minilm, remote"):
            agents.capability("embed", "default")
        with pytest.raises(NotFound, match="no rerank model"):
            agents.capability("rerank", "minilm")
    finally:
        await agents.aclose()
    assert not agents.capabilities["embed"]["remote"].built


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[embeddings.x]\nprotocol = 'local'\n", r"embeddings\.x\.model: a capability model needs"),
        (
            "[embeddings.x]\nmodel = 'm'\nprotocol = 'anthropic'\n",
            r"embeddings\.x\.protocol: a embedding model takes 'openai' or 'local'",
        ),
        (
            "[images.x]\nmodel = 'm'\nprotocol = 'local'\n",
            r"images\.x\.protocol: a image model takes 'openai'",
        ),
        (
            "[embeddings.x]\nmodel = 'all-MiniLM-L6-v2'\nprotocol = 'local'\nbase_url = 'http://h'\n",
            r"embeddings\.x\.base_url: an in-process .* takes no base_url",
        ),
        (
            "[embeddings.x]\nmodel = 'm'\nbackend = 'numpy'\n",
            r"embeddings\.x\.backend: backend is an option of protocol 'local' only",
        ),
        (
            "[embeddings.x]\nmodel = 'BAAI/bge-m3'\nprotocol = 'local'\n",
            r"embeddings\.x: local model 'BAAI/bge-m3' is not on this machine",
        ),
        ("[embeddings.x]\nmodel = 'm'\nsize = 3\n", r"embeddings\.x\.size: unknown key"),
        (
            "[embeddings.x]\nmodel = 'm'\nbase_url = 'ftp://h'\n",
            r"embeddings\.x: base_url of model 'm' must be an http\(s\) URL",
        ),
        (
            "[agents.a]\nmodel = 'demo'\nembed = 'missing'\n",
            r"agents\.a\.embed: no \[embeddings\.missing\] section \(defined: none\)",
        ),
        (
            "[agents.a]\nmodel = 'demo'\nrerank = [3]\n",
            r"agents\.a\.rerank\[0\]: expected a section name or an inline table",
        ),
        (
            "[agents.a]\nmodel = 'demo'\nimage = { prompt = 'x' }\n",
            r"agents\.a\.image\.prompt: unknown key",
        ),
    ],
)
def test_bad_capability_models_name_the_key(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(write(tmp_path, text))
