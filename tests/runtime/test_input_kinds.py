"""What a model takes: declared, narrowed by its binding, checked before every model call, and
failed over to a binding that takes the part."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    ModelBinding,
    ModelBindings,
    presets,
    tool,
)
from agent_runtime.content import ContentPart, DocumentPart, ImagePart, TextPart
from agent_runtime.errors import ConfigurationError, UnsupportedContentError
from agent_runtime.input_kinds import (
    ALL_INPUT_KINDS,
    TEXT_ONLY,
    as_input_kinds,
    declared_input_kinds,
    fit_messages,
)
from agent_runtime.messages import AssistantMessage, Message, ToolMessage, UserMessage
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.support.content_samples import PDF, PNG

IMAGE = ImagePart(media_type="image/png", data=PNG)
PROMPT: list[ContentPart] = [TextPart("What is it?"), IMAGE]
SEEING = frozenset({"text", "image"})


async def run(agent: AgentCore, prompt: Any) -> list[AgentEvent]:
    events: list[AgentEvent] = []
    with pytest.raises(UnsupportedContentError):
        async for event in agent.stream(prompt):
            events.append(event)
    return events


def test_input_kinds_are_checked() -> None:
    assert as_input_kinds(["text", "image"]) == {"text", "image"}
    with pytest.raises(ConfigurationError, match="not the string"):
        as_input_kinds("image")
    with pytest.raises(ConfigurationError, match="unknown input kind"):
        as_input_kinds({"text", "video"})
    with pytest.raises(ConfigurationError, match="must include 'text'"):
        as_input_kinds({"image"})
    with pytest.raises(ConfigurationError, match="chat bindings"):
        ModelBinding.embed(model="e", api_key="k", input_kinds={"text"})


def test_a_bindings_narrowing_survives_a_new_loop_and_presets_narrow_text_only_hosts() -> None:
    narrowed = ModelBinding.llm(model="m", api_key="k", input_kinds=["text"])
    assert narrowed.for_current_loop().input_kinds == TEXT_ONLY
    assert ModelBinding.llm(model="m", api_key="k").input_kinds is None
    supplied = ModelBinding.llm(provider=ScriptedModel([]), input_kinds={"text", "image"})
    assert supplied.input_kinds == SEEING
    assert presets.deepseek(api_key="k").input_kinds == TEXT_ONLY
    assert presets.deepseek(api_key="k", input_kinds=ALL_INPUT_KINDS).input_kinds == ALL_INPUT_KINDS


def test_a_model_that_declares_nothing_takes_text_only() -> None:
    class Plain:
        pass

    class Seeing:
        input_kinds = frozenset({"image"})

    assert declared_input_kinds(Plain()) == TEXT_ONLY
    assert declared_input_kinds(Seeing()) == {"text", "image"}
    assert declared_input_kinds(ScriptedModel([])) == ALL_INPUT_KINDS


def test_fitting_keeps_what_the_model_takes_and_never_drops_a_users_part() -> None:
    image = ImagePart(media_type="image/png", ref="sha256:x")
    messages = [UserMessage([TextPart("hi"), image])]
    assert fit_messages(messages, ALL_INPUT_KINDS, model="m", provider="p") is messages
    with pytest.raises(UnsupportedContentError, match="model 'm' cannot take an image"):
        fit_messages(messages, TEXT_ONLY, model="m", provider="p")
    document = DocumentPart(media_type="application/pdf", ref="sha256:y")
    with pytest.raises(UnsupportedContentError, match=r"a document \(application/pdf\)"):
        fit_messages(
            [UserMessage([document])], frozenset({"text", "image"}), model="m", provider="p"
        )


def test_a_tools_part_the_model_cannot_take_becomes_a_note() -> None:
    image = ImagePart(media_type="image/png", ref="sha256:x")
    result = ToolMessage("c1", "shot", "the screen", parts=[image])
    messages: list[Message] = [UserMessage("look"), result]

    fitted = fit_messages(messages, TEXT_ONLY, model="m", provider="p")

    assert fitted is not messages and messages[1] is result  # the conversation is untouched
    note = fitted[1]
    assert isinstance(note, ToolMessage) and note.parts == []
    assert note.content == (
        "the screen\n[the tool returned an image (image/png) that model 'm' cannot be shown]"
    )


async def test_a_custom_model_without_input_kinds_fails_a_call_with_an_image() -> None:
    class TextModel:
        calls = 0

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            self.calls += 1
            yield ModelEvent.completed(ModelResponse(AssistantMessage("text")))

    model = TextModel()
    agent = AgentCore(model)
    events = await run(agent, PROMPT)
    failed = events[-1]
    assert failed.type is AgentEventType.RUN_FAILED
    assert failed.data()["error"]["code"] == "unsupported_content"
    assert "cannot take an image (image/png)" in failed.data()["error"]["message"]
    assert model.calls == 0
    # a text prompt is as it always was
    assert (await agent.chat("hello")).content == "text"


async def test_a_binding_narrowed_to_text_refuses_before_the_model_is_called() -> None:
    model = ScriptedModel([])
    agent = AgentCore(ModelBinding.llm(provider=model, input_kinds={"text"}))
    events = await run(agent, PROMPT)
    assert events[-1].type is AgentEventType.RUN_FAILED
    assert model.requests == []


async def test_a_fallback_that_takes_the_image_answers_for_a_text_only_primary() -> None:
    primary = ScriptedModel([], model_name="text-only", input_kinds={"text"})
    fallback = ScriptedModel(["A pixel."], model_name="vision")
    agent = AgentCore(
        ModelBindings(llm=[ModelBinding.llm(provider=primary), ModelBinding.llm(provider=fallback)])
    )
    events = [e async for e in agent.stream(PROMPT)]
    assert events[-1].type is AgentEventType.RUN_COMPLETED
    assert events[-1].message is not None and events[-1].message.content == "A pixel."
    usage = [e for e in events if e.type is AgentEventType.USAGE]
    assert [e.model for e in usage] == ["vision"]
    assert primary.requests == []
    fallback.assert_consumed()


async def test_when_no_binding_takes_the_part_the_primarys_refusal_fails_the_run() -> None:
    primary = ScriptedModel([], model_name="first", input_kinds={"text"})
    fallback = ScriptedModel([], model_name="second", input_kinds={"text", "image"})
    agent = AgentCore(
        ModelBindings(llm=[ModelBinding.llm(provider=primary), ModelBinding.llm(provider=fallback)])
    )
    events = await run(
        agent, [TextPart("Read"), DocumentPart(media_type="application/pdf", data=PDF)]
    )
    assert "model 'first' cannot take a document" in events[-1].data()["error"]["message"]
    assert primary.requests == [] and fallback.requests == []


async def test_a_tools_image_reaches_a_text_model_as_a_note_and_the_run_goes_on() -> None:
    @tool
    def screenshot() -> ImagePart:
        """Take a screenshot."""
        return ImagePart(media_type="image/png", data=PNG)

    model = ScriptedModel(
        [tool_call_turn("screenshot", call_id="c1"), "I cannot see it."], input_kinds={"text"}
    )
    agent = AgentCore(model, tools=[screenshot])
    response = await agent.chat("What is on the screen?")
    assert response.content == "I cannot see it."
    seen = model.requests[1].messages[-1]
    assert isinstance(seen, ToolMessage) and seen.parts == []
    assert "cannot be shown" in seen.content
    # the conversation keeps the image: another model may see it later
    kept = response.messages[2]
    assert isinstance(kept, ToolMessage) and [p.kind for p in kept.parts] == ["image"]
