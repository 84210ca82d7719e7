"""A model's reasoning through a run: ``reasoning.delta`` events in the log before the text
they lead to, the reasoning text kept with the stored turn (never the signed state, which stays
in the server's checkpoints), and the cache and reasoning token counts in every usage figure."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent_runtime import AgentCore
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    ReasoningState,
    ToolCall,
    UserMessage,
)
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse, Usage
from agent_runtime.providers.demo import demo_tools
from agent_runtime.testing import FunctionModel
from app.bus import LocalBus
from app.runs import RunRequestOptions
from app.runs.turns import model_history, stopped_turn
from app.storage import open_store
from tests.fakes.reasoning_models import CACHED_TOKENS, SIGNATURE_PREFIX, Thinker
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.support.managers import run_manager
from tests.support.served import Serve, Served, replay, run_blocking
from tests.support.waiting import wait_until

WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
THINKER = """
[agents.thinker]
model = "python:tests.fakes.reasoning_models:thinker"
tools = ["current_time", "delete_file"]

[agents.thinker.policies]
delete_file = "ask"
"""


def config(tmp_path: Path) -> str:
    path = tmp_path / "agents.toml"
    path.write_text(THINKER, encoding="utf-8")
    return str(path)


async def run_thinker(served: Served, session: str, text: str) -> dict[str, Any]:
    answer = await run_blocking(served, session, text, agent="thinker")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_reasoning_streams_before_its_text_and_is_stored_without_its_signed_state(
    serve: Serve, tmp_path: Path
) -> None:
    async with serve(config=config(tmp_path)) as served:
        done = await run_thinker(served, "r1", "what time is it")
        assert done["status"] == "completed"
        events = await replay(served, done["run_id"])
        kinds = [e.event for e in events]
        # each model call: its reasoning first, then what it leads to (a tool call, the answer)
        first_tool = kinds.index("tool.call.started")
        first_text = kinds.index("text.delta")
        reasoning = [i for i, kind in enumerate(kinds) if kind == "reasoning.delta"]
        assert reasoning and reasoning[0] < first_tool
        assert any(first_tool < i < first_text for i in reasoning)
        said = "".join(
            e.data["data"]["delta"] for e in events if e.event == "reasoning.delta" and e.data
        )
        assert said == (
            'Thinking about "what time is it", step 1.Thinking about "what time is it", step 2.'
        )

        # every usage figure carries the details, summed over the run's two calls
        calls = [e.data["data"] for e in events if e.event == "usage" and e.data]
        assert [c["cached_input_tokens"] for c in calls] == [80, 80]
        assert [c["cache_write_tokens"] for c in calls] == [20, 20]
        assert [c["reasoning_tokens"] for c in calls] == [8, 8]
        total = done["usage"]
        assert total["cached_input_tokens"] == 160
        assert total["cache_write_tokens"] == 40
        assert total["reasoning_tokens"] == 16
        assert total["input_tokens"] == sum(c["input_tokens"] for c in calls)
        assert events[-1].data is not None
        assert events[-1].data["data"]["usage"] == total
        record = (await served.client.get(f"/v1/runs/{done['run_id']}")).json()
        assert record["usage"] == total
        usage = (await served.client.get("/v1/usage")).json()
        assert usage["usage"] == [
            {
                "agent": "thinker",
                "input_tokens": total["input_tokens"],
                "output_tokens": total["output_tokens"],
                "total_tokens": total["input_tokens"] + total["output_tokens"],
                "runs": 1,
                "cached_input_tokens": 160,
                "cache_write_tokens": 40,
                "reasoning_tokens": 16,
            }
        ]
        assert usage["total"]["reasoning_tokens"] == 16

        # the stored turn: the reasoning text with each answer, never its signed state
        listed = await served.client.get("/v1/sessions/r1/messages")
        assistants = [m for m in listed.json()["messages"] if m["role"] == "assistant"]
        assert [m["reasoning"] for m in assistants] == [
            'Thinking about "what time is it", step 1.',
            'Thinking about "what time is it", step 2.',
        ]
        assert SIGNATURE_PREFIX not in listed.text
        stored = await served.services.store.list_messages("r1")
        assert all("reasoning_state" not in m.message for m in stored)
        for answer in (json.dumps(done), record, usage):
            assert SIGNATURE_PREFIX not in json.dumps(answer)
        assert all(SIGNATURE_PREFIX not in json.dumps(e.data) for e in events)


async def test_the_webhook_of_a_run_s_end_carries_its_usage_details(
    serve: Serve, tmp_path: Path
) -> None:
    receiver = await WebhookReceiver(WEBHOOK_SECRET).start()
    try:
        path = tmp_path / "agents.toml"
        hooked = f'[agents.thinker]\nwebhook_url = "{receiver.url}"\n'
        path.write_text(THINKER.replace("[agents.thinker]\n", hooked), encoding="utf-8")
        settings = {
            "webhook_secret": WEBHOOK_SECRET,
            "webhook_allow_private": True,
            "webhook_poll_interval": 0.05,
        }
        async with serve(config=str(path), **settings) as served:
            done = await run_thinker(served, "r3", "hello")
            await receiver.wait_for(lambda r: len(r.deliveries) == 1)
            (body,) = receiver.deliveries.values()
            assert body["type"] == "run.completed"
            assert body["data"]["usage"] == done["usage"]
            assert body["data"]["usage"]["cached_input_tokens"] == CACHED_TOKENS
            assert body["data"]["usage"]["reasoning_tokens"] == 5  # 'Thinking about "hello", ...'
            assert all(SIGNATURE_PREFIX not in r.body.decode() for r in receiver.requests)
            await served.wait_idle()
    finally:
        await receiver.aclose()


async def test_a_reasoning_model_goes_on_from_the_stored_conversation(
    serve: Serve, tmp_path: Path
) -> None:
    async with serve(config=config(tmp_path)) as served:
        await run_thinker(served, "r2", "hello")
        second = await run_thinker(served, "r2", "again")
        assert second["output"]["content"] == "You said: again"
        listed = (await served.client.get("/v1/sessions/r2/messages")).json()["messages"]
        assert [(m["role"], m.get("reasoning")) for m in listed] == [
            ("user", None),
            ("assistant", 'Thinking about "hello", step 1.'),
            ("user", None),
            ("assistant", 'Thinking about "again", step 1.'),
        ]


async def test_a_resumed_run_gives_its_model_back_the_signed_state_it_kept(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/a.db")
    model = Thinker()
    agent = AgentCore(model, tools=demo_tools(), extensions=[ConfirmationExtension()])
    first = run_manager(agent, store, LocalBus(), resume_runs=True, hand_over=True)
    handle = await first.start(
        "anonymous", "s1", RunRequestOptions(input="delete notes.txt", background=True)
    )
    await wait_until(lambda: first.live_status(handle) == "waiting")
    first.begin_drain()  # parked at the question, its checkpoint kept for the restart
    await handle.finished
    await first.drain(5)
    await first.aclose()
    checkpoint = await store.get_checkpoint(handle.run_id)
    assert checkpoint is not None
    (asked,) = [m for m in checkpoint.data["added"] if m["role"] == "assistant"]
    assert asked["reasoning_state"]["blocks"][0]["signature"].startswith(SIGNATURE_PREFIX)

    second = run_manager(agent, store, LocalBus(), resume_runs=True, hand_over=True)
    try:
        await second.recover()
        resumed = second.local(handle.run_id)
        assert resumed is not None
        await wait_until(lambda: second.live_status(resumed) == "waiting")
        (call,) = checkpoint.data["calls"]
        answer = {"tool_call_id": call["call_id"], "approved": True}
        assert await second.routing.external_event(
            "anonymous", "s1", handle.run_id, ExternalEvent("confirmation_response", answer)
        )
        await resumed.finished
        # the call after the answer got the first call's signed reasoning back, as it was
        given = [m for m in model.requests[-1].messages if isinstance(m, AssistantMessage)]
        assert [m.reasoning_state for m in given] == [
            ReasoningState(
                asked["reasoning_state"]["provider"],
                tuple(asked["reasoning_state"]["blocks"]),
            )
        ]
        record = await store.get_run(handle.run_id)
        assert record is not None and record.status == "completed"
        assert record.usage is not None
        # the counts of the call before the restart, and of the one after it
        assert record.usage["cached_input_tokens"] == 2 * CACHED_TOKENS
        stored = [m.message for m in await store.list_messages("s1")]
        assert [m.get("reasoning") for m in stored if m["role"] == "assistant"] == [
            'Thinking about "delete notes.txt", step 1.',
            'Thinking about "delete notes.txt", step 2.',
        ]
        assert SIGNATURE_PREFIX not in json.dumps(stored)
    finally:
        await second.drain(5)
        await second.aclose()
        await agent.aclose()
        await store.close()


async def test_a_run_stopped_while_its_model_thinks_keeps_the_thought(tmp_path: Path) -> None:
    thinking = asyncio.Event()
    seen: list[list[Message]] = []

    async def model(request: ModelRequest) -> AsyncIterator[ModelEvent]:
        seen.append(list(request.messages))
        if len(seen) == 1:
            yield ModelEvent.reasoning("Let me ")
            yield ModelEvent.reasoning("think about")
            thinking.set()
            await asyncio.Event().wait()  # cut here, by the stop
        yield ModelEvent.completed(ModelResponse(AssistantMessage("Sure."), Usage(1, 1)))

    store = await open_store(f"sqlite:///{tmp_path}/a.db")
    agent = AgentCore(FunctionModel(model))
    manager = run_manager(agent, store, LocalBus())
    try:
        first = await manager.start("anonymous", "s1", RunRequestOptions(input="plan it"))
        await thinking.wait()
        assert manager.cancel_local(first.run_id, "cancel_requested")
        await first.finished
        stored = [m.message for m in await store.list_messages("s1")]
        assert [
            (m["role"], m.get("content"), m.get("reasoning"), m["stopped"]) for m in stored
        ] == [
            ("user", "plan it", None, "cancel_requested"),
            ("assistant", None, "Let me think about", "cancel_requested"),
        ]
        # the next run's model gets the question, not the unsigned half-thought
        second = await manager.start("anonymous", "s1", RunRequestOptions(input="go on"))
        await second.finished
        assert [(m.role, getattr(m, "content", None)) for m in seen[-1]] == [
            ("user", "plan it"),
            ("user", "go on"),
        ]
    finally:
        await manager.aclose()
        await agent.aclose()
        await store.close()


def test_a_stopped_turn_keeps_reasoning_the_model_is_not_given_again() -> None:
    state = ReasoningState("thinker", ({"type": "thinking", "signature": "SIGNED-x"},))
    called = AssistantMessage(None, [ToolCall("c1", "current_time", {})], reasoning="first")
    cut = AssistantMessage(None, reasoning="half a tho")  # stopped while it was thinking
    stored = stopped_turn(
        "q",
        [
            UserMessage("q"),
            AssistantMessage(None, [ToolCall("c0", "t", {})], reasoning="r", reasoning_state=state),
            called,
            cut,
            AssistantMessage(None),  # says nothing: left out
        ],
        "cancel_requested",
    )
    assert [(m["role"], m.get("reasoning")) for m in stored] == [
        ("user", None),
        ("assistant", "r"),
        ("assistant", "first"),
        ("assistant", "half a tho"),
    ]
    assert all(m["stopped"] == "cancel_requested" for m in stored)
    assert "SIGNED-x" not in json.dumps(stored)
    # what goes back to the model: everything but the reasoning alone, which no provider takes
    signed = AssistantMessage(None, reasoning="r", reasoning_state=state)
    history: list[Message] = [UserMessage("q"), called, cut, signed, AssistantMessage("text")]
    assert model_history(history) == [UserMessage("q"), called, signed, AssistantMessage("text")]
