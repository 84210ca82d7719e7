"""Media parts are references wherever a run is written down: its messages' JSON form, its
checkpoints, its events; and a checkpoint keeps an answer's reasoning state for the resume."""

from __future__ import annotations

import base64
import json
from typing import Any

from agent_runtime import AgentCore, AgentEventType, AgentRunConfig, RunCheckpoint, tool
from agent_runtime.content import ImagePart, MemoryContentStore, TextPart
from agent_runtime.messages import (
    AssistantMessage,
    ReasoningState,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_to_dict,
)
from agent_runtime.model import ModelResponse, Usage
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.support.content_samples import big_png

FIVE_MB = 5 * 1024 * 1024


class JsonSink:
    """Keeps every checkpoint as the JSON text a store would write."""

    def __init__(self) -> None:
        self.saved: list[str] = []

    async def save(self, checkpoint: RunCheckpoint) -> None:
        self.saved.append(json.dumps(checkpoint.to_dict()))


async def test_a_run_with_a_5_mb_image_writes_no_bytes_anywhere() -> None:
    image = big_png(FIVE_MB)
    encoded = base64.b64encode(image).decode("ascii")

    @tool
    def screenshot() -> list[Any]:
        """Take a screenshot."""
        return ["the screen", ImagePart(media_type="image/png", data=image)]

    store = MemoryContentStore()
    sink = JsonSink()
    model = ScriptedModel([tool_call_turn("screenshot", call_id="c1"), "Seen."])
    agent = AgentCore(model, tools=[screenshot], content_store=store, checkpoint_sink=sink)
    events = [
        e
        async for e in agent.stream(
            [TextPart("Look"), ImagePart(media_type="image/png", data=image)],
            config=AgentRunConfig(session_id="s1"),
        )
    ]

    completed = events[-1]
    assert completed.type is AgentEventType.RUN_COMPLETED and completed.messages is not None
    written = json.dumps([message_to_dict(m, private=True) for m in completed.messages])
    # four messages whose two images are a reference each: a few hundred bytes, not megabytes
    assert len(written) < 2_000, written
    prompt, _, result, _ = completed.messages
    assert isinstance(prompt, UserMessage) and isinstance(result, ToolMessage)
    ref = prompt.parts[1]
    assert isinstance(ref, ImagePart) and ref.data is None and ref.size == FIVE_MB
    assert [p.ref for p in result.parts] == [ref.ref]  # the same bytes, stored once
    assert await store.get(ref.ref or "") == image
    assert sink.saved and all(len(text) < 3_000 for text in sink.saved)
    tool_event = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    events_text = json.dumps([e.data() for e in events])
    assert len(events_text) < 5_000
    for text in (written, *sink.saved, events_text):
        assert encoded[:64] not in text and "base64" not in text
    assert tool_event.result == [
        "the screen",
        {
            "type": "image",
            "ref": ref.ref,
            "media_type": "image/png",
            "size": FIVE_MB,
            "sha256": ref.sha256,
        },
    ]
    # what the model was sent holds the reference too; the provider reads the bytes itself
    sent = model.requests[1].messages
    assert sent[0] == prompt and model.requests[1].content_store is store


async def test_a_checkpoint_keeps_the_reasoning_state_for_the_resumed_run() -> None:
    state = ReasoningState(
        "anthropic", ({"type": "thinking", "thinking": "first", "signature": "sig-1"},)
    )
    thinking = ModelResponse(
        AssistantMessage(
            None, [ToolCall("c1", "look", {})], reasoning="first", reasoning_state=state
        ),
        Usage(1, 1),
        "tool_calls",
    )

    @tool
    def look() -> str:
        """Look."""
        return "seen"

    sink = JsonSink()
    first = AgentCore(ScriptedModel([thinking, "done"]), tools=[look], checkpoint_sink=sink)
    await first.chat("go", config=AgentRunConfig(session_id="s1", run_id="run_1"))
    # the checkpoint taken after the model's answer, before the tool ran
    answered = next(
        RunCheckpoint.from_dict(json.loads(text))
        for text in sink.saved
        if '"reasoning_state"' in text and '"tool"' not in text
    )
    kept = answered.added[-1]
    assert isinstance(kept, AssistantMessage) and kept.reasoning_state == state
    assert kept.reasoning == "first"
    # what a client reads of the same message has no state
    assert "reasoning_state" not in message_to_dict(kept)

    model = ScriptedModel(["done again"])
    resumed = AgentCore(model, tools=[look])
    events = [e async for e in resumed.resume(answered)]
    assert events[-1].type is AgentEventType.RUN_COMPLETED
    sent = [m for m in model.requests[0].messages if isinstance(m, AssistantMessage)]
    assert sent[0].reasoning_state == state  # back to the provider that made it
