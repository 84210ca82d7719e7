"""A2A 1.0, driven by ``a2a-sdk``'s own client against a real server, on both bindings.

Card discovery, send (blocking and streaming), get, list, cancel, subscribe, and the
input-required round trip of a confirmation; and A2A 0.3 compatibility behind AGENT_A2A_V03.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
from google.protobuf import json_format

from tests.support import files as samples
from tests.support.server import Server, launch

KEY = "sk-a2a-test"
BINDINGS = ("JSONRPC", "HTTP+JSON")


@pytest.fixture(scope="module")
def a2a_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("a2a-server"),
        {"AGENT_API_KEYS": f"{KEY}=alice", "AGENT_DEMO_SLOW_SECONDS": "0.3"},
    )
    yield server
    server.stop()


@pytest.fixture
async def http(a2a_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {KEY}"}, timeout=30.0
    ) as client:
        yield client


async def make_client(
    base_url: str, http: httpx.AsyncClient, binding: str, *, streaming: bool
) -> Client:
    card = await A2ACardResolver(http, base_url).get_agent_card()
    config = ClientConfig(
        httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding]
    )
    return ClientFactory(config).create(card)


def user(
    text: str = "", *, task_id: str = "", context_id: str = "", data: Any = None
) -> pb.Message:
    message = pb.Message(
        message_id=str(uuid.uuid4()), role=pb.ROLE_USER, task_id=task_id, context_id=context_id
    )
    if text:
        message.parts.append(pb.Part(text=text))
    if data is not None:
        part = message.parts.add()
        json_format.ParseDict(data, part.data)
    return message


def answer_text(task: pb.Task) -> str:
    return "".join(p.text for p in task.status.message.parts if p.HasField("text"))


async def responses(client: Client, message: pb.Message) -> list[pb.StreamResponse]:
    return [r async for r in client.send_message(pb.SendMessageRequest(message=message))]


async def test_agent_card(a2a_server: Server, http: httpx.AsyncClient) -> None:
    card = await A2ACardResolver(http, a2a_server.base_url).get_agent_card()
    assert [skill.id for skill in card.skills] == ["default"]
    bindings = {(i.protocol_binding, i.protocol_version) for i in card.supported_interfaces}
    assert bindings == {("JSONRPC", "1.0"), ("HTTP+JSON", "1.0")}
    assert all(i.url == f"{a2a_server.base_url}/a2a/default" for i in card.supported_interfaces)
    assert card.capabilities.streaming
    assert "bearer" in card.security_schemes
    own = await A2ACardResolver(http, f"{a2a_server.base_url}/a2a/default").get_agent_card()
    assert own.name == "default"
    # a card is public; everything else needs the key
    async with httpx.AsyncClient() as anonymous:
        card_url = f"{a2a_server.base_url}/.well-known/agent-card.json"
        assert (await anonymous.get(card_url)).is_success
        denied = await anonymous.post(
            f"{a2a_server.base_url}/a2a/default",
            json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
        )
    assert denied.status_code == 401
    assert denied.json()["error"]["status"] == "UNAUTHENTICATED"


@pytest.mark.parametrize("binding", BINDINGS)
async def test_send_get_list(a2a_server: Server, http: httpx.AsyncClient, binding: str) -> None:
    client = await make_client(a2a_server.base_url, http, binding, streaming=False)
    (result,) = await responses(client, user("hello agent"))
    task = result.task
    assert task.status.state == pb.TASK_STATE_COMPLETED
    assert answer_text(task) == "You said: hello agent"
    assert "".join(p.text for a in task.artifacts for p in a.parts) == "You said: hello agent"
    assert task.context_id
    fetched = await client.get_task(pb.GetTaskRequest(id=task.id))
    assert fetched.status.state == pb.TASK_STATE_COMPLETED
    assert [m.role for m in fetched.history] == [pb.ROLE_USER, pb.ROLE_AGENT]
    # the same context is the same session: the conversation goes on
    (second,) = await responses(client, user("again", context_id=task.context_id))
    assert second.task.context_id == task.context_id
    listed = await client.list_tasks(pb.ListTasksRequest(context_id=task.context_id))
    assert [t.id for t in listed.tasks] == [second.task.id, task.id]
    with pytest.raises(TaskNotFoundError):
        await client.get_task(pb.GetTaskRequest(id="run_00000000000000000000000000000000"))


@pytest.mark.parametrize("binding", BINDINGS)
async def test_stream(a2a_server: Server, http: httpx.AsyncClient, binding: str) -> None:
    client = await make_client(a2a_server.base_url, http, binding, streaming=True)
    events = await responses(client, user("what time is it"))
    assert events[0].HasField("task")
    assert events[0].task.status.state == pb.TASK_STATE_SUBMITTED
    kinds = [e.WhichOneof("payload") for e in events[1:]]
    assert set(kinds) <= {"status_update", "artifact_update"}
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[0] == pb.TASK_STATE_WORKING
    assert states[-1] == pb.TASK_STATE_COMPLETED
    chunks = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    text = "".join(p.text for chunk in chunks for p in chunk.parts)
    assert text.startswith("The time is ")
    final = events[-1].status_update.status
    assert "".join(p.text for p in final.message.parts) == text


@pytest.mark.parametrize("binding", BINDINGS)
async def test_cancel_and_subscribe(
    a2a_server: Server, http: httpx.AsyncClient, binding: str
) -> None:
    client = await make_client(a2a_server.base_url, http, binding, streaming=True)
    words = " ".join(f"w{i}" for i in range(30))
    request = pb.SendMessageRequest(
        message=user(f"slow {words}"),
        configuration=pb.SendMessageConfiguration(return_immediately=True),
    )
    polling = await make_client(a2a_server.base_url, http, binding, streaming=False)
    (started,) = [r async for r in polling.send_message(request)]
    task_id = started.task.id
    assert started.task.status.state in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING)
    subscription = client.subscribe(pb.SubscribeToTaskRequest(id=task_id))
    first = await anext(subscription)
    assert first.HasField("task")
    assert first.task.id == task_id
    # a word arrives live on the subscription, then the task is cancelled
    while True:
        event = await anext(subscription)
        if event.HasField("artifact_update"):
            break
    cancelled = await client.cancel_task(pb.CancelTaskRequest(id=task_id))
    assert cancelled.status.state == pb.TASK_STATE_CANCELED
    rest = [e async for e in subscription]
    assert rest[-1].status_update.status.state == pb.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(pb.CancelTaskRequest(id=task_id))


@pytest.mark.parametrize("binding", BINDINGS)
async def test_input_required_round_trip(
    a2a_server: Server, http: httpx.AsyncClient, binding: str
) -> None:
    client = await make_client(a2a_server.base_url, http, binding, streaming=True)
    events = await responses(client, user("delete report.txt"))
    asked = events[-1].status_update.status
    assert asked.state == pb.TASK_STATE_INPUT_REQUIRED
    details = [json_format.MessageToDict(p.data) for p in asked.message.parts if p.HasField("data")]
    assert details[0]["confirmation"]["tool"] == "delete_file"
    assert details[0]["confirmation"]["arguments"] == {"path": "report.txt"}
    task_id = events[0].task.id
    waiting = await client.get_task(pb.GetTaskRequest(id=task_id))
    assert waiting.status.state == pb.TASK_STATE_INPUT_REQUIRED
    answered = await responses(
        client, user(task_id=task_id, context_id=events[0].task.context_id, data={"approved": True})
    )
    assert answered[0].task.id == task_id
    final = answered[-1].status_update.status
    assert final.state == pb.TASK_STATE_COMPLETED
    assert "Deleted report.txt" in "".join(p.text for p in final.message.parts)
    # blocking, denied
    blocking = await make_client(a2a_server.base_url, http, binding, streaming=False)
    (first,) = await responses(blocking, user("delete keep.txt"))
    assert first.task.status.state == pb.TASK_STATE_INPUT_REQUIRED
    denial = user(task_id=first.task.id, context_id=first.task.context_id, data={"approved": False})
    (done,) = await responses(blocking, denial)
    assert done.task.status.state == pb.TASK_STATE_COMPLETED
    assert "did not delete keep.txt" in answer_text(done.task)


async def test_a2a_v03_compatibility(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = launch(tmp_path_factory.mktemp("a2a-v03"), {"AGENT_A2A_V03": "1"})
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http:
            card = (await http.get("/.well-known/agent-card.json")).json()
            versions = {i["protocolVersion"] for i in card["supportedInterfaces"]}
            assert versions == {"1.0", "0.3"}
            reply = await http.post(
                "/a2a/default",
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "message/send",
                    "params": {
                        "message": {
                            "kind": "message",
                            "messageId": str(uuid.uuid4()),
                            "role": "user",
                            "parts": [{"kind": "text", "text": "old client"}],
                        }
                    },
                },
            )
            body = reply.json()
            assert body["result"]["kind"] == "task"
            assert body["result"]["status"]["state"] == "completed"
            # 0.3's file part (FileWithBytes): stored as a file, named by URL in the history
            image = samples.png()
            with_file = await http.post(
                "/a2a/default",
                json={
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "message/send",
                    "params": {
                        "message": {
                            "kind": "message",
                            "messageId": str(uuid.uuid4()),
                            "role": "user",
                            "parts": [
                                {"kind": "text", "text": "and a picture"},
                                {
                                    "kind": "file",
                                    "file": {
                                        "bytes": base64.b64encode(image).decode(),
                                        "mimeType": "image/png",
                                        "name": "dot.png",
                                    },
                                },
                            ],
                        }
                    },
                },
            )
            task = with_file.json()["result"]
            assert task["status"]["state"] == "completed"
            sent = task["history"][0]["parts"][1]
            assert sent["kind"] == "file"
            assert sent["file"]["mimeType"] == "image/png"
            assert sent["file"]["name"] == "dot.png"
            assert "bytes" not in sent["file"]
            assert sent["file"]["uri"].startswith(f"{server.base_url}/v1/files/file_")
            assert (await http.get(sent["file"]["uri"])).content == image
    finally:
        server.stop()
