"""A client's response_format schema: refused at the start when it cannot be validated safely,
and answers validated against it in bounded time, off the loop, stopped when their run ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import AgentCore, RunTimeoutError, StructuredOutputError
from agent_runtime import structured as structured_module
from agent_runtime.answer_check import Budget
from agent_runtime.errors import OutputSchemaError
from agent_runtime.schema_check import MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES
from agent_runtime.structured import MAX_ANSWER_CHARS, output_spec
from agent_runtime.testing import ScriptedModel
from tests.support.waiting import wait_until

CATASTROPHIC = {"type": "string", "pattern": "^(a+)+$"}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}
# both branches descend and both fail: 2**depth evaluations for an answer nested depth deep
_BRANCHY = {"type": "array", "items": {"$ref": "#/$defs/x"}}
EXPONENTIAL = {
    "$defs": {"x": {"anyOf": [{**_BRANCHY, "minItems": 2}, {**_BRANCHY, "minItems": 3}]}},
    "$ref": "#/$defs/x",
}


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    for _ in range(depth - 1):
        schema = {"items": schema}
    return schema


class LagProbe:
    """The event loop's worst delay in waking a 1 ms timer while the probe runs."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - started - 0.001)

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.fixture
async def agent_of() -> AsyncIterator[list[AgentCore]]:
    agents: list[AgentCore] = []
    yield agents
    for agent in agents:
        await agent.aclose()


async def test_a_catastrophic_pattern_is_refused_at_once_and_the_loop_stays_responsive(
    agent_of: list[AgentCore],
) -> None:
    # Python's re takes minutes for this answer and holds the GIL throughout
    answer = '"' + "a" * 32 + '!"'
    model = ScriptedModel([answer, answer, answer])
    agent = AgentCore(model)
    agent_of.append(agent)

    async with LagProbe() as probe:
        with pytest.raises(StructuredOutputError) as caught:
            await agent.chat("a's", response_format=_format(CATASTROPHIC))

    assert caught.value.attempts == 3
    assert "(root): pattern" in caught.value.problems
    assert probe.worst < 0.5, f"the loop stalled {probe.worst:.3f} s"


async def test_a_matching_answer_still_validates(agent_of: list[AgentCore]) -> None:
    agent = AgentCore(ScriptedModel(['"' + "a" * 40 + '"']))
    agent_of.append(agent)
    response = await agent.chat("a's", response_format=_format(CATASTROPHIC))
    assert response.structured is not None
    assert response.structured.value == "a" * 40


async def test_a_recursive_tree_schema_is_accepted(agent_of: list[AgentCore]) -> None:
    tree = '{"children": [{"children": []}, {"children": [{"children": []}]}]}'
    model = ScriptedModel(['{"children": [{"children": 3}]}', tree])
    agent = AgentCore(model)
    agent_of.append(agent)
    response = await agent.chat("a tree", response_format=_format(TREE))
    assert response.structured is not None
    assert response.structured.value["children"][1]["children"] == [{"children": []}]
    retry = model.requests[1].messages[-1].content
    assert "children.0.children: 3 is not of type 'array'" in str(retry)


@pytest.mark.parametrize(
    ("schema", "kind", "path"),
    [
        ({"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}, "ref_cycle", ("$defs", "n")),
        ({"properties": {"a": {"$ref": "#"}}, "allOf": [{"$ref": "#"}]}, "ref_cycle", ()),
        (
            {
                "$defs": {
                    "a": {"anyOf": [{"$ref": "#/$defs/b"}]},
                    "b": {"not": {"$ref": "#/$defs/a"}},
                }
            },
            "ref_cycle",
            None,
        ),
        (_nested(400), "too_deep", None),
        (_nested(MAX_SCHEMA_DEPTH + 1), "too_deep", None),
        ({"enum": list(range(MAX_SCHEMA_NODES))}, "too_large", ()),
        ({"type": "string", "pattern": "(a)\\1"}, "pattern", ("pattern",)),
        ({"type": "string", "pattern": "(?=a)"}, "pattern", ("pattern",)),
        ({"type": "string", "pattern": "(\\w+\\s?){1,1000}!"}, "pattern", ("pattern",)),
        (
            {"properties": {"x": {"patternProperties": {"(?<=a)b": {}}}}},
            "pattern",
            ("properties", "x", "patternProperties", "(?<=a)b"),
        ),
        ({"$ref": "https://example.invalid/s.json"}, "ref", ("$ref",)),
        ({"items": {"$ref": "#nowhere"}}, "ref", ("items", "$ref")),
        ({"$dynamicRef": "#meta"}, "unsupported", ("$dynamicRef",)),
        ({"properties": {"a": {"$id": "https://example.invalid/a"}}}, "unsupported", None),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "unsupported", ("$schema",)),
        ({"type": 3}, "invalid", ("type",)),
    ],
)
async def test_a_schema_that_cannot_be_validated_safely_is_refused_before_the_run(
    agent_of: list[AgentCore], schema: dict[str, Any], kind: str, path: tuple[Any, ...] | None
) -> None:
    model = ScriptedModel([])
    agent = AgentCore(model)
    agent_of.append(agent)
    with pytest.raises(OutputSchemaError) as caught:
        await agent.chat("x", response_format=_format(schema))
    assert caught.value.kind == kind
    if path is not None:
        assert caught.value.path == path
    assert "response_format.json_schema.schema" in str(caught.value)
    assert model.requests == []


def test_schemas_within_the_bounds_are_accepted() -> None:
    assert output_spec(response_format=_format(_nested(MAX_SCHEMA_DEPTH))) is not None
    assert output_spec(response_format=_format({"enum": list(range(100))})) is not None
    # a property named like a keyword is a property, not a keyword
    named = {"properties": {"$id": {"type": "string"}, "$ref": {"type": "string"}}}
    spec = output_spec(response_format=_format(named))
    assert spec is not None
    assert spec.check('{"$id": "x", "$ref": "y"}').ok


def test_pattern_properties_and_additional_properties_use_the_same_patterns() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x-(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    spec = output_spec(response_format=_format(schema))
    assert spec is not None
    assert spec.check('{"x-aaa": 1}').ok
    verdict = spec.check('{"x-aaa": "s", "x-' + "a" * 40 + '!": 1}')
    assert not verdict.ok
    assert "x-aaa: type" in verdict.summary
    assert "additionalProperties" in verdict.summary


@pytest.mark.parametrize(
    ("answer", "ok"),
    [("[1, 1.0]", False), ("[true, 1]", True), ('[{"a": [1]}, {"a": [1.0]}]', False)],
)
def test_unique_items_compares_as_json_schema_does(answer: str, ok: bool) -> None:
    spec = output_spec(response_format=_format({"uniqueItems": True}))
    assert spec is not None
    assert spec.check(answer).ok is ok


def test_an_answer_past_the_bounds_is_refused_unparsed() -> None:
    spec = output_spec(response_format=_format({}))
    assert spec is not None
    verdict = spec.check('"' + "a" * MAX_ANSWER_CHARS + '"')
    assert not verdict.ok
    assert f"at most {MAX_ANSWER_CHARS}" in verdict.feedback
    for depth in (65, 5000):
        verdict = spec.check("[" * depth + "]" * depth)
        assert not verdict.ok
        assert "nested deeper than 64" in verdict.feedback
    assert spec.check("```json\n[1]\n```").ok


async def test_a_validation_past_its_time_limit_refuses_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(structured_module, "VALIDATION_TIME_LIMIT", 0.2)
    spec = output_spec(response_format=_format(EXPONENTIAL))
    assert spec is not None
    verdict = await spec.acheck("[" * 40 + "]" * 40)
    assert not verdict.ok
    assert "took longer than 0.2 s" in verdict.feedback


async def test_a_cancelled_check_stops_and_frees_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a limit no test waits for: only the cancellation can end these checks early
    monkeypatch.setattr(structured_module, "VALIDATION_TIME_LIMIT", 600.0)
    threads: set[int] = set()  # the validation threads a check started on

    class Watched(Budget):
        def __enter__(self) -> Budget:
            threads.add(threading.get_ident())
            return super().__enter__()

    monkeypatch.setattr(structured_module, "Budget", Watched)
    spec = output_spec(response_format=_format(EXPONENTIAL))
    assert spec is not None
    slow = [asyncio.create_task(spec.acheck("[" * 40 + "]" * 40)) for _ in range(2)]
    await wait_until(lambda: len(threads) == 2)  # they took both validation threads
    for task in slow:
        task.cancel()
    await asyncio.gather(*slow, return_exceptions=True)
    # both threads were busy: this check runs only once the cancelled ones stopped
    verdict = await asyncio.wait_for(spec.acheck("[]"), timeout=30)
    assert not verdict.ok


async def test_run_timeout_reaches_a_slow_validation(
    monkeypatch: pytest.MonkeyPatch, agent_of: list[AgentCore]
) -> None:
    monkeypatch.setattr(structured_module, "VALIDATION_TIME_LIMIT", 600.0)
    agent = AgentCore(ScriptedModel(["[" * 40 + "]" * 40]))
    agent_of.append(agent)
    with pytest.raises(RunTimeoutError):
        await agent.chat("x", response_format=_format(EXPONENTIAL), run_timeout=0.5)
    # and the validation threads are free again
    spec = output_spec(response_format=_format({"type": "array"}))
    assert spec is not None
    assert (await asyncio.wait_for(spec.acheck("[]"), timeout=30)).ok
