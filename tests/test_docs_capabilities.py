"""Every Python example of docs/capabilities.md runs, as written, against the fake upstream.

The examples name the real endpoint (``https://api.openai.com/v1``); the standard
``HTTPS_PROXY`` and ``SSL_CERT_FILE`` variables send their clients to a proxy on loopback that
answers for that host with the fake upstream (``tests/fakes/tls_proxy.py``). The example of the
service's own endpoint (``127.0.0.1:8000``) is left to the end-to-end tests.
"""

from __future__ import annotations

import ast
import contextlib
import io
from typing import Any

import pytest

from tests.fakes.tls_proxy import TLSInterceptor
from tests.fakes.upstream import FakeUpstream
from tests.support.docs import CAPABILITY_BLOCKS as BLOCKS
from tests.support.local_models import needs_local_models


def test_the_document_has_an_example_per_capability() -> None:
    text = "\n".join(BLOCKS)
    for call in (
        "embed(",
        "rerank(",
        "generate_image(",
        "submit_video(",
        "submit_image(",
        "synthesize_speech(",
        "transcribe(",
        "LocalEmbeddingProvider(",
        "LocalRerankProvider(",
    ):
        assert call in text, call


@pytest.mark.parametrize(
    "index",
    [
        pytest.param(index, marks=[needs_local_models] if "agent_runtime.local" in block else [])
        for index, block in enumerate(BLOCKS)
    ],
)
async def test_example_runs(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    async with (
        FakeUpstream() as upstream,
        TLSInterceptor(upstream, "api.openai.com") as proxy,
    ):
        for name in ("ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("SSL_CERT_FILE", str(proxy.ca_file))
        monkeypatch.setenv("OPENAI_API_KEY", "sk-docs")
        code = compile(
            BLOCKS[index], f"capabilities.md[{index}]", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        namespace: dict[str, Any] = {"__name__": "docs_example"}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            pending = eval(code, namespace)  # the document's own example
            if pending is not None:
                await pending
        assert out.getvalue().strip(), "an example should say what it did"
        assert all(request.api_key == "sk-docs" for request in upstream.requests)
