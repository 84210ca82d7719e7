"""Structured output: chat_structured and response_format, with scripted models and with the
real OpenAI and Anthropic SDKs against the fake upstream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest

from agent_runtime import (
    AgentCore,
    AgentEventType,
    ModelBinding,
    RunTimeoutError,
    StructuredOutputError,
    tool,
)
from agent_runtime.errors import ConfigurationError
from agent_runtime.messages import AssistantMessage, UserMessage
from agent_runtime.model import ModelRequest
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn
from tests.fakes.upstream import FakeToolCall, FakeUpstream, Text, ToolCalls, freeze_imports

freeze_imports()


class Invoice(pydantic.BaseModel):
    number: str
    total: float
    paid: bool = False


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


async def test_chat_structured_validates_into_the_output_type() -> None:
    model = ScriptedModel(['{"number": "A-1", "total": 12.5}'])
    agent = AgentCore(model, system_prompt="You read invoices.")

    result = await agent.chat_structured("read it", output_type=Invoice)

    assert result.output == Invoice(number="A-1", total=12.5)
    assert result.run_id == result.response.run_id
    assert result.response.structured is not None
    assert result.response.structured.json == {"number": "A-1", "total": 12.5, "paid": False}
    [request] = model.requests
    assert request.output_schema is not None
    assert request.output_schema.name == "Invoice"
    assert request.output_schema.schema["required"] == ["number", "total"]
    # models with no native form read the schema in the instructions
    assert request.system is not None
    assert request.system.startswith("You read invoices.")
    assert '"required": ["number", "total"]' in request.system
    await agent.aclose()


async def test_any_type_adapter_type_and_a_fenced_answer() -> None:
    model = ScriptedModel(["```json\n[1, 2, 3]\n```"])
    agent = AgentCore(model)
    result = await agent.chat_structured("numbers", output_type=list[int])
    assert result.output == [1, 2, 3]
    await agent.aclose()


async def test_an_invalid_answer_is_given_back_and_retried() -> None:
    model = ScriptedModel(['{"number": "A-1"}', "not json at all", '{"number": "A-1", "total": 3}'])
    agent = AgentCore(model)

    result = await agent.chat_structured("read it", output_type=Invoice)

    assert result.output.total == 3
    first_retry = model.requests[1].messages[-1]
    assert isinstance(first_retry, UserMessage)
    assert "total: Field required" in first_retry.content
    second_retry = model.requests[2].messages[-1]
    assert isinstance(second_retry, UserMessage)
    assert "not valid JSON" in second_retry.content
    # the stored turn is the prompt and the answer that validated, not the rejected tries
    assert [type(m) for m in result.response.messages] == [UserMessage, AssistantMessage]
    model.assert_consumed()
    await agent.aclose()


async def test_retries_are_bounded_then_a_typed_error() -> None:
    model = ScriptedModel(["{}", "{}"])
    agent = AgentCore(model)
    with pytest.raises(StructuredOutputError) as caught:
        await agent.chat_structured("read it", output_type=Invoice, output_retries=1)
    error = caught.value
    assert error.code == "invalid_output"
    assert error.attempts == 2
    assert error.output == "{}"
    assert "number: missing" in error.problems
    assert error.run_id
    model.assert_consumed()
    await agent.aclose()


async def test_structured_runs_still_call_tools_first() -> None:
    @tool
    def lookup(number: str) -> dict[str, Any]:
        """Look an invoice up."""
        return {"number": number, "total": 99}

    model = ScriptedModel(
        [
            tool_call_turn("lookup", {"number": "B-2"}),
            '{"number": "B-2", "total": 99, "paid": true}',
        ]
    )
    agent = AgentCore(model, tools=[lookup])
    result = await agent.chat_structured("find B-2", output_type=Invoice)
    assert result.output == Invoice(number="B-2", total=99, paid=True)
    assert [t.name for t in model.requests[0].tools] == ["lookup"]
    await agent.aclose()


async def test_one_clock_for_every_attempt() -> None:
    never = asyncio.Event()
    calls = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return "{}"
        await never.wait()
        return "never"

    agent = AgentCore(FunctionModel(answer), run_timeout=60)
    with pytest.raises(RunTimeoutError) as caught:
        await agent.chat_structured("x", output_type=Invoice, run_timeout=0.5)
    assert caught.value.timeout == 0.5
    assert calls == 2
    await agent.aclose()


async def test_response_format_puts_the_value_in_run_completed() -> None:
    model = ScriptedModel(
        ['{"city": "Oslo", "celsius": "cold"}', '{"city": "Oslo", "celsius": -3}']
    )
    agent = AgentCore(model)
    response_format = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}

    events = [e async for e in agent.stream("weather?", response_format=response_format)]

    completed = events[-1]
    assert completed.type is AgentEventType.RUN_COMPLETED
    assert completed.data()["output"] == {
        "content": '{"city": "Oslo", "celsius": -3}',
        "structured": {"city": "Oslo", "celsius": -3},
    }
    retry = model.requests[1].messages[-1]
    assert isinstance(retry, UserMessage)
    assert "celsius: 'cold' is not of type 'integer'" in retry.content
    await agent.aclose()


async def test_a_run_without_structured_output_has_no_structured_key() -> None:
    agent = AgentCore(ScriptedModel(["plain"]))
    events = [e async for e in agent.stream("x")]
    assert events[-1].data()["output"] == {"content": "plain"}
    await agent.aclose()


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"schema": schema}}


async def test_local_references_resolve_in_the_schema() -> None:
    schema = {
        "$defs": {"item": {"type": "integer"}},
        "type": "array",
        "items": {"$ref": "#/$defs/item"},
    }
    model = ScriptedModel(['["x"]', "[1, 2]"])
    agent = AgentCore(model)
    response = await agent.chat("numbers", response_format=_format(schema))
    assert response.structured is not None
    assert response.structured.value == [1, 2]
    await agent.aclose()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"response_format": {"type": "text"}}, '{"type": "json_schema"'),
        ({"response_format": {"type": "json_schema"}}, "needs a schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
            "not a valid JSON schema",
        ),
        ({"output_type": Invoice, "response_format": {"type": "json_schema"}}, "not both"),
        ({"output_type": Invoice, "output_retries": -1}, "output_retries"),
        (
            {"response_format": _format({"$ref": "https://example.invalid/s.json"})},
            "only references into the schema itself",
        ),
        ({"response_format": _format({"$ref": "#/$defs/missing"})}, "points at nothing"),
        ({"response_format": _format({"$schema": "http://nope/x"})}, "unknown \\$schema"),
        ({"output_type": object()}, "cannot be an output type"),
    ],
)
async def test_bad_structured_options_are_configuration_errors(
    options: dict[str, Any], problem: str
) -> None:
    model = ScriptedModel([])
    agent = AgentCore(model)
    with pytest.raises(ConfigurationError, match=problem):
        await agent.chat("x", **options)
    assert model.requests == []
    await agent.aclose()


# the real SDKs against the fake upstream ---------------------------------------------------


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


async def test_openai_gets_response_format_json_schema(upstream: FakeUpstream) -> None:
    upstream.script(Text('{"number": "A-1"'), Text('{"number": "A-1", "total": 4}'))
    binding = ModelBinding.llm(
        model="gpt-test", api_key="sk-test", base_url=upstream.openai_url, client_max_retries=0
    )
    async with AgentCore.open(binding) as agent:
        result = await agent.chat_structured("read it", output_type=Invoice)

    assert result.output == Invoice(number="A-1", total=4)
    first, second = upstream.requests
    body = first.json
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "Invoice"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["number", "total"]
    assert body["response_format"]["json_schema"]["strict"] is False
    assert "not valid JSON" in second.json["messages"][-1]["content"]


async def test_anthropic_gets_a_forced_output_tool(upstream: FakeUpstream) -> None:
    upstream.script(ToolCalls([FakeToolCall("Invoice", {"number": "C-3", "total": 7})]))
    binding = ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        api_key="sk-ant-test",
        base_url=upstream.anthropic_url,
        client_max_retries=0,
    )
    async with AgentCore.open(binding) as agent:
        result = await agent.chat_structured("read it", output_type=Invoice)

    assert result.output == Invoice(number="C-3", total=7)
    assert result.response.message.tool_calls == []
    body = upstream.requests[0].json
    assert body["tool_choice"] == {"type": "tool", "name": "Invoice"}
    [output_tool] = body["tools"]
    assert output_tool["name"] == "Invoice"
    assert output_tool["input_schema"]["required"] == ["number", "total"]


async def test_anthropic_with_tools_and_a_wrapped_schema_retries(upstream: FakeUpstream) -> None:
    @tool
    def count() -> int:
        """Count things."""
        return 3

    upstream.script(
        ToolCalls([FakeToolCall("count", {})]),
        ToolCalls([FakeToolCall("list", {"value": ["x"]})]),
        ToolCalls([FakeToolCall("list", {"value": [1, 2, 3]})]),
    )
    binding = ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        api_key="sk-ant-test",
        base_url=upstream.anthropic_url,
        client_max_retries=0,
    )
    async with AgentCore.open(binding, tools=[count]) as agent:
        result = await agent.chat_structured("count", output_type=list[int])

    assert result.output == [1, 2, 3]
    first, second, third = (r.json for r in upstream.requests)
    assert first["tool_choice"] == {"type": "any"}
    assert [t["name"] for t in first["tools"]] == ["count", "list"]
    wrapped = first["tools"][1]["input_schema"]
    assert wrapped["properties"]["value"] == {"items": {"type": "integer"}, "type": "array"}
    # the rejected answer went back as text, with the error for the model to fix
    assert second["messages"][-1]["role"] == "user"
    last = third["messages"][-1]["content"]
    text = last if isinstance(last, str) else " ".join(str(b.get("text", "")) for b in last)
    assert "Input should be a valid integer" in text
