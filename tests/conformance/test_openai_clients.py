"""The OpenAI-compatible endpoints as the ``openai`` SDK's typed helpers use them.

Structured output (``responses.parse``, ``chat.completions.parse``, ``response_format``) is
the run's own, validated before the run completes; what the service cannot honour (``n``,
log probabilities, other formats) is a 400 in OpenAI's error shape, never ignored.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.support.server import Server, launch

KEY = "sk-openai-conformance"


class Person(BaseModel):
    name: str
    age: int
    languages: list[str]


@pytest.fixture(scope="module")
def oai_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(tmp_path_factory.mktemp("openai-conformance"), {"AGENT_API_KEYS": f"{KEY}=a"})
    yield server
    server.stop()


@pytest.fixture
async def client(oai_server: Server) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=f"{oai_server.base_url}/openai/v1", api_key=KEY, max_retries=0
    ) as sdk:
        yield sdk


async def test_responses_parse_gets_the_validated_object(client: AsyncOpenAI) -> None:
    response = await client.responses.parse(
        model="default", input="Ada Lovelace", text_format=Person
    )
    assert response.status == "completed"
    assert response.output_parsed == Person(name="Ada Lovelace", age=0, languages=["Ada Lovelace"])
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


async def test_responses_stream_with_a_text_format(client: AsyncOpenAI) -> None:
    async with client.responses.stream(
        model="default", input="Grace", text_format=Person
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_parsed == Person(name="Grace", age=0, languages=["Grace"])


async def test_chat_parse_and_response_formats(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": "Alan"}],
        response_format=Person,
    )
    message = completion.choices[0].message
    assert message.parsed == Person(name="Alan", age=0, languages=["Alan"])
    assert message.refusal is None
    answer = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "anything"}],
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    streamed = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Edsger"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": Person.model_json_schema(), "strict": True},
        },
        stream=True,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
    assert Person.model_validate_json(text).name == "Edsger"


async def test_a_response_has_integer_times_and_the_open_responses_members(
    client: AsyncOpenAI,
) -> None:
    # the SDK's model types created_at as a float: read the wire's JSON
    answer = await client.responses.with_raw_response.create(
        model="default", input="hi", temperature=0.5
    )
    raw = answer.http_response.json()
    assert type(raw["created_at"]) is int and type(raw["completed_at"]) is int
    assert raw["created_at"] <= raw["completed_at"]
    for member in (
        "truncation",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "reasoning",
        "max_output_tokens",
        "max_tool_calls",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
    ):
        assert member in raw, member
    assert raw["temperature"] == 0.5 and raw["store"] is True
    got = await client.responses.with_raw_response.retrieve(raw["id"])
    retrieved = got.http_response.json()
    assert type(retrieved["created_at"]) is int and type(retrieved["completed_at"]) is int


async def _refused(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        await call
    return caught.value


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("n", 2),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("stop", ["\n"]),
        ("logit_bias", {"50256": -100}),
    ],
)
async def test_chat_parameters_it_cannot_honour_are_400(
    client: AsyncOpenAI, param: str, value: Any
) -> None:
    error = await _refused(
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "hi"}],
            **{param: value},
        )
    )
    assert error.status_code == 400
    body = error.body
    assert isinstance(body, dict) and body["param"] == param
    assert body["type"] == "invalid_request_error"


async def test_formats_it_cannot_take_are_400(client: AsyncOpenAI) -> None:
    error = await _refused(
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"response_format": {"type": "grammar"}},
        )
    )
    assert isinstance(error.body, dict) and error.body["param"] == "response_format"
    error = await _refused(
        client.responses.create(
            model="default",
            input="hi",
            text={"format": {"type": "json_schema", "name": "bad name!", "schema": {}}},
        )
    )
    assert isinstance(error.body, dict) and error.body["param"] == "text.format"
    error = await _refused(client.responses.create(model="default", input="hi", top_logprobs=2))
    assert isinstance(error.body, dict) and error.body["param"] == "top_logprobs"


async def test_a_tool_call_then_a_structured_answer(client: AsyncOpenAI) -> None:
    # "what time is it": the demo model answers after its tool, in the schema
    response = await client.responses.parse(
        model="default", input="what time is it", text_format=Person
    )
    assert response.status == "completed"
    assert response.output_parsed is not None and response.output_parsed.name.startswith("20")
