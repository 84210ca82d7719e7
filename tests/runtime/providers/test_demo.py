"""The demo model says what it received; text prompts answer as the contract fixes them."""

from __future__ import annotations

import hashlib

from agent_runtime import AgentCore
from agent_runtime.content import DocumentPart, ImagePart, MemoryContentStore, TextPart
from agent_runtime.messages import UserMessage
from agent_runtime.model import ModelEventKind, ModelRequest
from agent_runtime.providers.demo import DemoModel
from agent_runtime.testing import ScriptedModel
from tests.support.content_samples import PDF, PNG


def short(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


async def test_a_text_prompt_is_echoed_as_before() -> None:
    agent = AgentCore(DemoModel(token_delay=0))
    response = await agent.chat("hello brave world")
    assert response.content == "You said: hello brave world"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 5)


async def test_it_says_what_each_part_was() -> None:
    agent = AgentCore(DemoModel(token_delay=0))
    response = await agent.chat(
        [
            TextPart("what is this?"),
            ImagePart(media_type="image/png", data=PNG),
            DocumentPart(media_type="application/pdf", data=PDF, filename="p.pdf"),
            ImagePart(url="https://example.com/cat.jpg", media_type="image/jpeg"),
        ]
    )
    assert response.content == (
        "You said: what is this? "
        f"I received an image (image/png, {len(PNG)} bytes, sha256 {short(PNG)}). "
        f"I received a document (application/pdf, {len(PDF)} bytes, sha256 {short(PDF)}). "
        "I received an image (image/jpeg, at https://example.com/cat.jpg)."
    )
    # the prompt's words only: the parts count for nothing, whatever their size
    assert response.usage.input_tokens == 3


async def test_a_reference_without_its_size_is_read_from_the_store() -> None:
    store = MemoryContentStore()
    kept = await store.put(PNG, "image/png")
    request = ModelRequest(
        messages=[UserMessage([ImagePart(media_type="image/png", ref=kept.ref)])],
        content_store=store,
    )
    events = [e async for e in DemoModel(token_delay=0).stream(request)]
    text = "".join(e.delta for e in events if e.kind is ModelEventKind.TEXT)
    described = f"an image (image/png, {len(PNG)} bytes, sha256 {short(PNG)})"
    assert text == f"You said: I received {described}."


async def test_the_test_models_count_the_words_of_a_prompt_with_parts() -> None:
    model = ScriptedModel(["seen"])
    response = await AgentCore(model).chat(
        [TextPart("two words"), ImagePart(media_type="image/png", data=PNG)]
    )
    assert response.usage.input_tokens == 2
