"""Structured output through the frameworks built on the OpenAI wire: LangChain's
``ChatOpenAI.with_structured_output`` and pydantic-ai's ``NativeOutput`` (Chat Completions and
the Responses API). Each sends a ``json_schema`` format and parses the answer it gets back.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel, SecretStr

try:
    from langchain_openai import ChatOpenAI
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
except ImportError:
    pytest.skip(
        "langchain-openai and pydantic-ai are not installed: uv sync --group conformance",
        allow_module_level=True,
    )

from tests.support.server import Server, launch

KEY = "sk-frameworks"


class City(BaseModel):
    name: str
    population: int


@pytest.fixture(scope="module")
def oai_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(tmp_path_factory.mktemp("frameworks"), {"AGENT_API_KEYS": f"{KEY}=alice"})
    yield server
    server.stop()


async def test_langchain_with_structured_output(oai_server: Server) -> None:
    async with httpx.AsyncClient() as http:
        model = ChatOpenAI(
            model="default",
            base_url=f"{oai_server.base_url}/openai/v1",
            api_key=SecretStr(KEY),
            max_retries=0,
            http_async_client=http,
        )
        structured = model.with_structured_output(City)  # its default: json_schema
        city = await structured.ainvoke("Lisbon")
    assert city == City(name="Lisbon", population=0)


@pytest.mark.parametrize("wire", ["chat", "responses"])
async def test_pydantic_ai_native_output(oai_server: Server, wire: str) -> None:
    async with AsyncOpenAI(
        base_url=f"{oai_server.base_url}/openai/v1", api_key=KEY, max_retries=0
    ) as client:
        provider = OpenAIProvider(openai_client=client)
        model = (
            OpenAIChatModel("default", provider=provider)
            if wire == "chat"
            else OpenAIResponsesModel("default", provider=provider)
        )
        agent = Agent(model, output_type=NativeOutput(City))
        result = await agent.run("Porto")
    assert result.output == City(name="Porto", population=0)
