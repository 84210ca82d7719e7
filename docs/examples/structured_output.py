"""Structured output: ``chat_structured`` validates the answer against a pydantic model.

Offline: a scripted model answers, first with JSON that misses a field (the runtime shows it
the validation error and asks again), then correctly. With a hosted model the schema also goes
to the provider natively (OpenAI ``response_format``, Anthropic a forced output tool).
"""

import asyncio

import pydantic

from agent_runtime import AgentCore, StructuredOutputError
from agent_runtime.testing import ScriptedModel


class Invoice(pydantic.BaseModel):
    number: str
    total: float
    paid: bool = False


async def main() -> None:
    model = ScriptedModel(
        [
            '{"number": "INV-7"}',  # no total: rejected, the error goes back to the model
            '{"number": "INV-7", "total": 120.5, "paid": true}',
        ]
    )
    async with AgentCore.open(model, run_timeout=30) as agent:
        result = await agent.chat_structured("Read this invoice: ...", output_type=Invoice)
        print("invoice:", result.output)
        retry = str(model.requests[1].messages[-1].content)
        print("retry told the model:", retry.splitlines()[0])

    # the same with a JSON schema, as the HTTP API's response_format takes it
    weather = {
        "type": "json_schema",
        "json_schema": {
            "name": "weather",
            "schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
                "required": ["city", "celsius"],
            },
        },
    }
    weather_model = ScriptedModel(['{"city": "Oslo", "celsius": -3}'])
    async with AgentCore.open(weather_model) as agent:
        response = await agent.chat("Weather in Oslo?", response_format=weather)
        assert response.structured is not None
        print("weather:", response.structured.json)

    async with AgentCore.open(ScriptedModel(["{}", "{}", "{}"])) as agent:
        try:
            await agent.chat_structured("Read this invoice", output_type=Invoice)
        except StructuredOutputError as exc:
            print(f"gave up after {exc.attempts} attempts: {exc.code}")


if __name__ == "__main__":
    asyncio.run(main())
