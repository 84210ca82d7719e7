"""A2A 1.0 as its Technology Compatibility Kit checks it, through ``a2a-sdk``'s own client.

A2A's TCK is not on a package registry; what it found is checked here with the SDK's client on
both bindings: the JSON-RPC interface URL with a trailing slash, a subscription to a task that
waits for input (it lasts until the task ends), a part of a media type the agent cannot take
(``ContentTypeNotSupportedError``), and the agent card's caching headers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError
from google.protobuf import json_format

from tests.support.server import Server, launch

KEY = "sk-a2a-conformance"
BINDINGS = ("JSONRPC", "HTTP+JSON")


@pytest.fixture(scope="module")
def a2a_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(tmp_path_factory.mktemp("a2a-conformance"), {"AGENT_API_KEYS": f"{KEY}=a"})
    yield server
    server.stop()


@pytest.fixture
async def http(a2a_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(headers=headers, timeout=30.0) as client:
        yield client


async def _client(
    server: Server, http: httpx.AsyncClient, binding: str, *, streaming: bool, slash: bool = False
) -> Client:
    card = await A2ACardResolver(http, server.base_url).get_agent_card()
    if slash:
        for interface in card.supported_interfaces:
            interface.url += "/"
    config = ClientConfig(
        httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding]
    )
    return ClientFactory(config).create(card)


def _message(
    text: str = "", *, task_id: str = "", context_id: str = "", approved: bool | None = None
) -> pb.Message:
    message = pb.Message(
        message_id=str(uuid.uuid4()), role=pb.ROLE_USER, task_id=task_id, context_id=context_id
    )
    if text:
        message.parts.append(pb.Part(text=text))
    if approved is not None:
        json_format.ParseDict({"approved": approved}, message.parts.add().data)
    return message


async def _send(client: Client, message: pb.Message) -> list[pb.StreamResponse]:
    return [r async for r in client.send_message(pb.SendMessageRequest(message=message))]


async def test_json_rpc_at_the_interface_url_with_a_trailing_slash(
    a2a_server: Server, http: httpx.AsyncClient
) -> None:
    for streaming in (False, True):
        client = await _client(a2a_server, http, "JSONRPC", streaming=streaming, slash=True)
        events = await _send(client, _message("hello"))
        last = events[-1]
        state = last.task.status.state if last.HasField("task") else last.status_update.status.state
        assert state == pb.TASK_STATE_COMPLETED
        task_id = events[0].task.id
        fetched = await client.get_task(pb.GetTaskRequest(id=task_id))
        assert fetched.status.state == pb.TASK_STATE_COMPLETED


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_subscription_to_a_waiting_task_lasts_until_it_ends(
    a2a_server: Server, http: httpx.AsyncClient, binding: str
) -> None:
    asking = await _client(a2a_server, http, binding, streaming=True)
    events = await _send(asking, _message("delete notes.txt"))
    assert events[-1].status_update.status.state == pb.TASK_STATE_INPUT_REQUIRED
    task = events[0].task
    subscriber = await _client(a2a_server, http, binding, streaming=True)
    subscription = subscriber.subscribe(pb.SubscribeToTaskRequest(id=task.id))
    first = await anext(subscription)
    assert first.task.status.state == pb.TASK_STATE_INPUT_REQUIRED
    # the subscription stays open while the task waits: nothing more comes yet
    following = asyncio.ensure_future(anext(subscription))
    done, _ = await asyncio.wait([following], timeout=0.5)
    assert not done
    answer = _message(task_id=task.id, context_id=task.context_id, approved=True)
    answering = await _client(a2a_server, http, binding, streaming=False)
    (answered,) = await _send(answering, answer)
    assert answered.task.status.state == pb.TASK_STATE_COMPLETED
    rest = [await following] + [event async for event in subscription]
    states = [e.status_update.status.state for e in rest if e.HasField("status_update")]
    assert states[-1] == pb.TASK_STATE_COMPLETED
    final = rest[-1].status_update.status
    assert "Deleted notes.txt" in "".join(p.text for p in final.message.parts)


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    "part",
    [
        pb.Part(url="https://example.com/song.mp3", media_type="audio/mpeg"),
        pb.Part(raw=b"\x00\x01", media_type="application/octet-stream", filename="blob.bin"),
        pb.Part(text="plain words", media_type="application/x-unknown"),
    ],
    ids=["url-audio", "raw-bytes", "text-of-another-type"],
)
async def test_a_part_it_cannot_take_is_content_type_not_supported(
    a2a_server: Server, http: httpx.AsyncClient, binding: str, part: pb.Part
) -> None:
    client = await _client(a2a_server, http, binding, streaming=False)
    message = _message()
    message.parts.append(part)
    with pytest.raises(ContentTypeNotSupportedError):
        await _send(client, message)
    # beside text too: a part is never dropped
    message = _message("look at this")
    message.parts.append(part)
    with pytest.raises(ContentTypeNotSupportedError):
        await _send(client, message)


async def test_json_rpc_error_code_is_32005(a2a_server: Server, http: httpx.AsyncClient) -> None:
    answer = await http.post(
        f"{a2a_server.base_url}/a2a/default",
        headers={"A2A-Version": "1.0"},
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": "m-1",
                    "role": "ROLE_USER",
                    "parts": [{"url": "https://example.com/a.mp3", "mediaType": "audio/mpeg"}],
                }
            },
        },
    )
    assert answer.json()["error"]["code"] == -32005


@pytest.mark.parametrize(
    "path", ["/.well-known/agent-card.json", "/a2a/default/.well-known/agent-card.json"]
)
async def test_the_agent_card_can_be_cached_and_revalidated(a2a_server: Server, path: str) -> None:
    async with httpx.AsyncClient(base_url=a2a_server.base_url) as anonymous:
        first = await anonymous.get(path)
        assert first.status_code == 200
        assert "max-age=" in first.headers["cache-control"]
        etag = first.headers["etag"]
        assert etag.startswith('"') and etag.endswith('"')
        again = await anonymous.get(path)
        assert again.headers["etag"] == etag and again.content == first.content
        revalidated = await anonymous.get(path, headers={"If-None-Match": etag})
        assert revalidated.status_code == 304 and revalidated.content == b""
        changed = await anonymous.get(path, headers={"If-None-Match": '"other"'})
        assert changed.status_code == 200
