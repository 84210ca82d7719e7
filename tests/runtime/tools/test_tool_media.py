"""A tool that returns images or documents: stored, sent to the model as the tool message's
parts, described by reference in the run's events."""

from __future__ import annotations

from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentEventType, tool
from agent_runtime.content import (
    DocumentPart,
    ImagePart,
    MemoryContentStore,
    StoredContent,
    TextPart,
)
from agent_runtime.messages import ToolMessage
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.results import media_result
from tests.support.content_samples import PDF, PNG


async def call_tool(returned: Any, **agent_options: Any) -> tuple[ToolMessage, AgentEvent]:
    """Run one call of a tool returning ``returned``; the message the model was sent and the
    call's completed event."""

    @tool
    def produce() -> Any:
        """Produce the result."""
        return returned

    model = ScriptedModel([tool_call_turn("produce", call_id="c1"), "ok"])
    agent = AgentCore(model, tools=[produce], **agent_options)
    events = [e async for e in agent.stream("go")]
    assert events[-1].type is AgentEventType.RUN_COMPLETED
    sent = model.requests[1].messages[-1]
    assert isinstance(sent, ToolMessage)
    completed = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    return sent, completed


async def test_an_image_alone_is_a_part_with_a_line_naming_it() -> None:
    store = MemoryContentStore()
    sent, completed = await call_tool(
        ImagePart(media_type="image/png", data=PNG), content_store=store
    )
    assert sent.content == "[image: image/png]"
    [part] = sent.parts
    assert part.data is None and part.ref is not None and part.size == len(PNG)
    assert await store.get(part.ref) == PNG
    assert completed.result == {
        "type": "image",
        "ref": part.ref,
        "media_type": "image/png",
        "size": len(PNG),
        "sha256": part.sha256,
    }
    assert not completed.is_error


async def test_text_and_parts_in_order_and_other_values_as_json() -> None:
    sent, completed = await call_tool(
        [
            "page 1",
            DocumentPart(media_type="application/pdf", data=PDF, filename="p.pdf"),
            TextPart("page 2"),
            {"pages": 2},
            ImagePart(url="https://example.com/x.png"),
        ]
    )
    assert sent.content == 'page 1\npage 2\n{"pages": 2}'
    assert [(p.kind, p.filename, p.url) for p in sent.parts] == [
        ("document", "p.pdf", None),
        ("image", None, "https://example.com/x.png"),  # a URL is kept as it is, not fetched
    ]
    assert isinstance(completed.result, list)
    assert completed.result[0] == "page 1" and completed.result[1]["filename"] == "p.pdf"
    assert completed.result[3:] == [
        '{"pages": 2}',
        {"type": "image", "url": "https://example.com/x.png"},
    ]


@pytest.mark.parametrize(
    ("part", "why"),
    [
        (ImagePart(media_type="image/png", data=b"GIF89a not a png"), "bytes are image/gif"),
        (ImagePart(media_type="image/svg+xml", data=b"<svg/>"), "image/svg+xml is not"),
    ],
)
async def test_a_part_that_is_not_what_it_says_is_named_not_passed_on(
    part: ImagePart, why: str
) -> None:
    sent, _ = await call_tool(["caption", part])
    assert sent.parts == []
    assert sent.content.startswith("caption\n[image not passed on: ")
    assert why in sent.content


async def test_a_content_store_that_fails_makes_the_call_a_tool_error() -> None:
    class BrokenStore(MemoryContentStore):
        async def put(
            self, data: bytes, media_type: str, *, session_id: str | None = None
        ) -> StoredContent:
            raise OSError("disk full")

    sent, completed = await call_tool(
        ImagePart(media_type="image/png", data=PNG), content_store=BrokenStore()
    )
    assert sent.is_error and sent.parts == []
    assert "could not be stored (OSError: disk full)" in sent.content
    assert completed.is_error and completed.result is None


@pytest.mark.parametrize("value", ["text", {"a": 1}, ["a", "b"], None, 3])
async def test_a_result_without_parts_is_left_alone(value: Any) -> None:
    assert await media_result(value, MemoryContentStore(), None) is None
