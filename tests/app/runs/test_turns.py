"""A session's turns through the run manager: a stopped run keeps its turn, which goes back to
the model on the next run; a run that replaces the last turn removes it first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import AgentCore
from agent_runtime.messages import AssistantMessage
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse, Usage
from agent_runtime.testing import FunctionModel
from app.bus import LocalBus
from app.errors import Conflict
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.storage import Store, open_store
from tests.support.managers import run_manager
from tests.support.waiting import wait_until


class Model:
    """Answers "answer to <prompt>" word by word; a prompt starting "hold" stops after its
    first word until ``release`` is set. Keeps what each call was sent."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.seen: list[list[tuple[str, str | None]]] = []

    async def __call__(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.seen.append([(m.role, getattr(m, "content", None)) for m in request.messages])
        prompt = str(getattr(request.messages[-1], "content", ""))
        words = ["answer ", "to ", prompt]
        for index, word in enumerate(words):
            yield ModelEvent.text(word)
            if index == 0 and prompt.startswith("hold"):
                self.holding.set()
                await self.release.wait()
        text = "".join(words)
        yield ModelEvent.completed(ModelResponse(AssistantMessage(text), Usage(1, 3)))


class Turns:
    def __init__(self, manager: RunManager, store: Store, model: Model) -> None:
        self.manager = manager
        self.store = store
        self.model = model

    async def run(self, session: str, text: str, **options: Any) -> RunHandle:
        handle = await self.manager.start(
            "anonymous", session, RunRequestOptions(input=text, **options)
        )
        return handle

    async def finished(self, handle: RunHandle) -> None:
        await asyncio.wait_for(asyncio.shield(handle.finished), 10)

    async def stored(self, session: str) -> list[tuple[str, Any, Any]]:
        return [
            (m.role, m.message.get("content"), m.message.get("stopped"))
            for m in await self.store.list_messages(session)
        ]


@pytest.fixture
async def turns(tmp_path: Path) -> AsyncIterator[Turns]:
    store = await open_store(f"sqlite:///{tmp_path}/t.db")
    bus = LocalBus()
    model = Model()
    agent = AgentCore(FunctionModel(model, model_name="turns-model"))
    manager = run_manager(agent, store, bus)
    try:
        yield Turns(manager, store, model)
    finally:
        model.release.set()
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


async def test_a_stopped_turn_is_kept_and_goes_back_to_the_model(turns: Turns) -> None:
    handle = await turns.run("s1", "hold on")
    await turns.model.holding.wait()
    assert turns.manager.cancel_local(handle.run_id, "cancel_requested")
    await turns.finished(handle)
    assert await turns.stored("s1") == [
        ("user", "hold on", "cancel_requested"),
        ("assistant", "answer ", "cancel_requested"),
    ]
    record = await turns.store.get_run(handle.run_id)
    assert record is not None and record.status == "cancelled"

    turns.model.release.set()
    after = await turns.run("s1", "go on")
    await turns.finished(after)
    # the model read the stopped turn as it was (our marker is not part of what it sees)
    assert turns.model.seen[-1] == [
        ("user", "hold on"),
        ("assistant", "answer "),
        ("user", "go on"),
    ]
    assert (await turns.stored("s1"))[2:] == [
        ("user", "go on", None),
        ("assistant", "answer to go on", None),
    ]
    record = await turns.store.get_run(after.run_id)
    assert record is not None and record.model == "turns-model"
    assert record.usage == {"input_tokens": 1, "output_tokens": 3, "model": "turns-model"}


async def test_a_run_cancelled_before_the_runtime_keeps_its_prompt(turns: Turns) -> None:
    # every slot is taken, so the background run waits in the queue, and is cancelled there
    held = [await turns.run(f"busy-{i}", "hold it") for i in range(4)]
    await wait_until(lambda: turns.manager.debug_state()["admission_running"] == 4)
    handle = await turns.run("s2", "never answered", background=True)
    assert handle.status == "queued"
    assert turns.manager.cancel_local(handle.run_id, "cancel_requested")
    await turns.finished(handle)
    assert await turns.stored("s2") == [("user", "never answered", "cancel_requested")]
    turns.model.release.set()
    for run in held:
        await turns.finished(run)


async def test_a_run_replaces_the_last_turn(turns: Turns) -> None:
    first = await turns.run("s3", "one")
    await turns.finished(first)
    second = await turns.run("s3", "two")
    await turns.finished(second)

    # only the latest run's turn can be replaced; nothing is removed or started otherwise
    with pytest.raises(Conflict, match="latest run"):
        await turns.run("s3", "one again", replaces=first.run_id)
    assert len(await turns.stored("s3")) == 4
    await wait_until(lambda: turns.manager.debug_state()["runs"] == 0)

    again = await turns.run("s3", "two, said better", replaces=second.run_id)
    await turns.finished(again)
    assert turns.model.seen[-1] == [
        ("user", "one"),
        ("assistant", "answer to one"),
        ("user", "two, said better"),
    ]
    assert await turns.stored("s3") == [
        ("user", "one", None),
        ("assistant", "answer to one", None),
        ("user", "two, said better", None),
        ("assistant", "answer to two, said better", None),
    ]
    session = await turns.store.get_session("s3")
    assert session is not None and session.last_run_id == again.run_id
    # the lock was released after the refusal: the session is free again
    assert turns.manager.debug_state()["locks"] == 0
