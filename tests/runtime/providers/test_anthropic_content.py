"""Images and documents on the Anthropic Messages wire: the exact blocks the real SDK sends to
the fake upstream, and the parts that fail before any request."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence

import pytest

from agent_runtime import AgentCore, ModelBinding, tool
from agent_runtime.content import (
    ContentPart,
    DocumentPart,
    ImagePart,
    MemoryContentStore,
    TextPart,
    store_parts,
)
from agent_runtime.errors import UnsupportedContentError
from agent_runtime.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from agent_runtime.model import ModelRequest
from agent_runtime.providers.anthropic import AnthropicModel
from tests.fakes.upstream import FakeToolCall, FakeUpstream, Text, ToolCalls, freeze_imports
from tests.support.content_samples import PDF, PNG

freeze_imports()  # keep full collections short: see its docstring

KEY = "sk-ant-test-0123456789abcdef"
CAT_URL = "https://example.com/cat.png"
PDF_URL = "https://example.com/paper.pdf"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


@pytest.fixture
async def model(upstream: FakeUpstream) -> AsyncIterator[AnthropicModel]:
    # without prompt caching, whose cache_control marks are tested on their own
    built = AnthropicModel(
        "claude-test",
        api_key=KEY,
        base_url=upstream.anthropic_url,
        max_retries=0,
        params={"prompt_caching": False},
    )
    yield built
    await built.aclose()


async def stored(parts: Sequence[ContentPart]) -> tuple[list[ContentPart], MemoryContentStore]:
    """``parts`` as a run holds them: bytes stored, references in their place."""
    store = MemoryContentStore()
    return await store_parts(parts, store, "s1"), store


async def send(model: AnthropicModel, messages: list[Message], store: MemoryContentStore) -> None:
    request = ModelRequest(messages=messages, content_store=store)
    async for _ in model.stream(request):
        pass


async def test_a_user_message_with_parts_is_a_list_of_blocks(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    parts, store = await stored(
        [
            TextPart("What are these?"),
            ImagePart(media_type="image/png", data=PNG),
            ImagePart(url=CAT_URL),
            DocumentPart(media_type="application/pdf", data=PDF, filename="report.pdf"),
            DocumentPart(url=PDF_URL),
            DocumentPart(media_type="text/csv", data=b"a,b\n1,2\n", filename="t.csv"),
            DocumentPart(media_type="text/plain", data=b"plain words"),
        ]
    )
    upstream.script(Text("ok"))

    await send(model, [UserMessage(parts)], store)

    (sent,) = upstream.requests
    assert sent.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What are these?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                },
                {"type": "image", "source": {"type": "url", "url": CAT_URL}},
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": b64(PDF),
                    },
                    "title": "report.pdf",
                },
                {"type": "document", "source": {"type": "url", "url": PDF_URL}},
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "a,b\n1,2\n"},
                    "title": "t.csv",
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
                },
            ],
        }
    ]


async def test_a_data_url_image_goes_as_its_base64_source(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(Text("ok"))
    part = ImagePart(url=f"data:image/png;base64,{b64(PNG)}")
    await send(model, [UserMessage([part])], MemoryContentStore())
    assert upstream.requests[0].messages[0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    ]


async def test_a_tool_result_with_an_image_holds_text_and_image_blocks(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    image, store = await stored([ImagePart(media_type="image/png", data=PNG)])
    assert isinstance(image[0], ImagePart)
    messages: list[Message] = [
        UserMessage("Take a screenshot"),
        AssistantMessage(None, [ToolCall("c1", "shot", {}), ToolCall("c2", "note", {})]),
        ToolMessage("c1", "shot", "a screenshot", parts=[image[0]]),
        ToolMessage("c2", "note", "noted"),
    ]
    upstream.script(Text("ok"))

    await send(model, messages, store)

    results = upstream.requests[0].messages[-1]
    assert results == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "c1",
                "content": [
                    {"type": "text", "text": "a screenshot"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                    },
                ],
            },
            {"type": "tool_result", "tool_use_id": "c2", "content": "noted"},
        ],
    }


async def test_a_text_document_by_url_fails_before_any_request(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    document = DocumentPart(media_type="text/plain", url="https://example.com/a.txt")
    with pytest.raises(UnsupportedContentError, match="only as a PDF") as caught:
        await send(model, [UserMessage([document])], MemoryContentStore())
    assert (caught.value.kind, caught.value.media_type) == ("document", "text/plain")
    assert upstream.requests == []


async def test_an_image_of_a_type_the_api_does_not_take_fails_before_any_request(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    store = MemoryContentStore()
    kept = await store.put(b"<svg/>", "image/svg+xml")
    part = ImagePart(media_type="image/svg+xml", ref=kept.ref)
    with pytest.raises(UnsupportedContentError, match="PNG, JPEG, GIF and WebP"):
        await send(model, [UserMessage([part])], store)
    assert upstream.requests == []


async def test_a_reference_the_store_lacks_fails_before_any_request(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    part = ImagePart(media_type="image/png", ref="sha256:gone")
    with pytest.raises(UnsupportedContentError, match="could not be read"):
        await send(model, [UserMessage([part])], MemoryContentStore())
    assert upstream.requests == []


async def test_a_tools_image_reaches_claude_inside_its_tool_result(
    upstream: FakeUpstream,
) -> None:
    @tool
    def screenshot() -> ImagePart:
        """Take a screenshot."""
        return ImagePart(media_type="image/png", data=PNG)

    binding = ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        base_url=upstream.anthropic_url,
        api_key=KEY,
        params={"prompt_caching": False},
    )
    upstream.script(ToolCalls([FakeToolCall("screenshot", {}, id="c1")]), Text("Black."))
    async with AgentCore.open(binding, tools=[screenshot]) as agent:
        response = await agent.chat("What is on the screen?")
    assert response.content == "Black."
    result = upstream.requests[1].messages[-1]["content"][0]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "c1",
        "content": [
            {"type": "text", "text": "[image: image/png]"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
            },
        ],
    }
