"""Images and documents on the Chat Completions wire: the exact blocks the real SDK sends to the
fake upstream, and the parts that fail before any request."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentEventType, ModelBinding, tool
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
from agent_runtime.providers.openai import OpenAIModel
from tests.fakes.upstream import FakeToolCall, FakeUpstream, Text, ToolCalls, freeze_imports
from tests.support.content_samples import PDF, PNG, big_png

freeze_imports()  # keep full collections short: see its docstring

KEY = "sk-test-openai-0123456789abcdef"
CAT_URL = "https://example.com/cat.png"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


@pytest.fixture
async def model(upstream: FakeUpstream) -> AsyncIterator[OpenAIModel]:
    built = OpenAIModel("gpt-test", api_key=KEY, base_url=upstream.openai_url, max_retries=0)
    yield built
    await built.aclose()


async def stored(parts: Sequence[ContentPart]) -> tuple[list[ContentPart], MemoryContentStore]:
    """``parts`` as a run holds them: bytes stored, references in their place."""
    store = MemoryContentStore()
    return await store_parts(parts, store, "s1"), store


async def send(model: OpenAIModel, messages: list[Message], store: MemoryContentStore) -> None:
    request = ModelRequest(messages=messages, content_store=store)
    async for _ in model.stream(request):
        pass


async def test_a_user_message_with_parts_is_a_content_array(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    parts, store = await stored(
        [
            TextPart("What are these?"),
            ImagePart(media_type="image/png", data=PNG),
            ImagePart(url=CAT_URL),
            DocumentPart(media_type="application/pdf", data=PDF, filename="report.pdf"),
            DocumentPart(media_type="text/markdown", data=b"# Notes\n\nhello", filename="n.md"),
        ]
    )
    assert all(p.data is None for p in parts if not isinstance(p, TextPart))
    upstream.script(Text("ok"))

    await send(model, [UserMessage(parts)], store)

    (sent,) = upstream.requests
    assert sent.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What are these?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
                {"type": "image_url", "image_url": {"url": CAT_URL}},
                {
                    "type": "file",
                    "file": {
                        "filename": "report.pdf",
                        "file_data": f"data:application/pdf;base64,{b64(PDF)}",
                    },
                },
                {"type": "text", "text": "Document n.md (text/markdown):\n\n# Notes\n\nhello"},
            ],
        }
    ]


async def test_a_string_prompt_is_still_a_string(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(Text("ok"))
    await send(model, [UserMessage("Hi")], MemoryContentStore())
    assert upstream.requests[0].messages == [{"role": "user", "content": "Hi"}]


async def test_a_data_url_goes_as_given_and_a_large_image_is_encoded_whole(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    big = big_png(3 * 1024 * 1024)  # past the size encoded off the loop
    data_url = f"data:image/png;base64,{b64(PNG)}"
    parts, store = await stored(
        [ImagePart(url=data_url), ImagePart(media_type="image/png", data=big)]
    )
    upstream.script(Text("ok"))

    await send(model, [UserMessage(parts)], store)

    # the body was encoded off the loop, as the SDK would have encoded it
    assert upstream.requests[0].headers["content-type"] == "application/json"
    content = upstream.requests[0].messages[0]["content"]
    assert content[0] == {"type": "image_url", "image_url": {"url": data_url}}
    assert content[1]["image_url"]["url"] == f"data:image/png;base64,{b64(big)}"


async def test_tool_images_follow_the_turns_tool_results_as_one_user_message(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    image, store = await stored([ImagePart(media_type="image/png", data=PNG)])
    assert isinstance(image[0], ImagePart)
    messages: list[Message] = [
        UserMessage("Take two screenshots"),
        AssistantMessage(None, [ToolCall("c1", "shot", {}), ToolCall("c2", "note", {})]),
        ToolMessage("c1", "shot", "a screenshot", parts=[image[0]]),
        ToolMessage("c2", "note", "noted"),
        UserMessage("and now?"),
    ]
    upstream.script(Text("ok"))

    await send(model, messages, store)

    wire = upstream.requests[0].messages
    # every tool result right after its assistant message; the image after the last of them
    assert [m["role"] for m in wire] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert wire[2] == {"role": "tool", "tool_call_id": "c1", "content": "a screenshot"}
    assert wire[3] == {"role": "tool", "tool_call_id": "c2", "content": "noted"}
    assert wire[4] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "The result of tool call c1 (shot) came with this content:"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
        ],
    }
    assert wire[5] == {"role": "user", "content": "and now?"}


async def test_a_document_by_url_fails_before_any_request(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    document = DocumentPart(media_type="application/pdf", url="https://example.com/a.pdf")

    with pytest.raises(UnsupportedContentError, match="not by URL") as caught:
        await send(model, [UserMessage([TextPart("Read"), document])], MemoryContentStore())

    assert (caught.value.kind, caught.value.media_type) == ("document", "application/pdf")
    assert caught.value.code == "unsupported_content" and not caught.value.retryable
    assert upstream.requests == []


async def test_a_text_only_model_refuses_an_image_naming_it_before_any_request(
    upstream: FakeUpstream,
) -> None:
    model = OpenAIModel(
        "text-model", api_key=KEY, base_url=upstream.openai_url, input_kinds={"text"}
    )
    parts, store = await stored([TextPart("Look"), ImagePart(media_type="image/png", data=PNG)])
    try:
        with pytest.raises(UnsupportedContentError) as caught:
            await send(model, [UserMessage(parts)], store)
    finally:
        await model.aclose()
    message = str(caught.value)
    assert "'text-model'" in message and "an image (image/png)" in message
    assert upstream.requests == []


async def test_an_image_prompt_reaches_the_upstream_through_the_agent(
    upstream: FakeUpstream,
) -> None:
    binding = ModelBinding.llm(model="gpt-test", base_url=upstream.openai_url, api_key=KEY)
    upstream.script(Text("A black pixel."))
    async with AgentCore.open(binding) as agent:
        response = await agent.chat(
            [TextPart("What is it?"), ImagePart(media_type="image/png", data=PNG)]
        )
    assert response.content == "A black pixel."
    (sent,) = upstream.requests
    assert sent.messages[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"},
    }


async def test_a_binding_narrowed_to_text_fails_the_run_and_sends_nothing(
    upstream: FakeUpstream,
) -> None:
    binding = ModelBinding.llm(
        model="gpt-test", base_url=upstream.openai_url, api_key=KEY, input_kinds=["text"]
    )
    events: list[AgentEvent] = []
    async with AgentCore.open(binding) as agent:
        with pytest.raises(UnsupportedContentError):
            async for event in agent.stream(
                [TextPart("Read"), DocumentPart(media_type="application/pdf", data=PDF)]
            ):
                events.append(event)
    failed = events[-1]
    assert failed.type is AgentEventType.RUN_FAILED
    assert failed.data()["error"]["code"] == "unsupported_content"
    assert "cannot take a document (application/pdf)" in failed.data()["error"]["message"]
    assert upstream.requests == []


async def test_a_tools_image_reaches_the_model_after_the_tool_result(
    upstream: FakeUpstream,
) -> None:
    @tool
    def screenshot() -> list[object]:
        """Take a screenshot."""
        return ["the screen", ImagePart(media_type="image/png", data=PNG)]

    binding = ModelBinding.llm(model="gpt-test", base_url=upstream.openai_url, api_key=KEY)
    upstream.script(ToolCalls([FakeToolCall("screenshot", {}, id="c1")]), Text("A black screen."))
    async with AgentCore.open(binding, tools=[screenshot]) as agent:
        response = await agent.chat("What is on the screen?")
    assert response.content == "A black screen."
    wire = upstream.requests[1].messages
    assert wire[-2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "the screen"},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "The result of tool call c1 (screenshot) came with this content:",
                },
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            ],
        },
    ]
