"""Images and documents through every protocol surface, each driven by its official client.

A PNG and a PDF go to a real server process running the demo model through the Responses and
Chat Completions APIs (``openai``), AG-UI (``@ag-ui/client``'s HttpAgent), the AI SDK's chat
(``ai``) and A2A (``a2a-sdk``, both bindings), each in the protocol's own parts. Each time:

- the stored conversation (``GET /v1/sessions/{id}/messages``) holds the same user message,
  with the files by reference (``file_id``, media type, size, sha256) and no base64 anywhere;
- the demo model's answer names what it received (its size and hash);
- with the service's model pointed at the recording fake upstream, the provider gets the
  image and the document as its own wire's blocks (``test_provider_wire_blocks``).

And what a surface cannot pass on is refused in that protocol's own error shape, with a clear
message: a part the surface cannot carry, a media type the bytes contradict, a file id that is
not the caller's.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from openai import AsyncOpenAI

from tests.fakes.upstream import FakeUpstream, Respond
from tests.support import files as samples
from tests.support import npm as npm_clients
from tests.support.npm import JS
from tests.support.server import Server, launch
from tests.support.upstream import Provider, demo_like, upstream_env

KEY = "sk-media-alice"
OTHER_KEY = "sk-media-bob"
AUTH = {"Authorization": f"Bearer {KEY}"}

PNG = samples.png()
PDF = samples.pdf()
PNG_B64 = base64.b64encode(PNG).decode()
PDF_B64 = base64.b64encode(PDF).decode()
PNG_URL = f"data:image/png;base64,{PNG_B64}"
PDF_URL = f"data:application/pdf;base64,{PDF_B64}"
QUESTION = "what are these?"

# the user message every surface stores, whichever brought the files (file ids aside)
STORED = [
    {"type": "text", "text": QUESTION},
    {
        "type": "image",
        "media_type": "image/png",
        "bytes": len(PNG),
        "sha256": hashlib.sha256(PNG).hexdigest(),
    },
    {
        "type": "document",
        "media_type": "application/pdf",
        "bytes": len(PDF),
        "sha256": hashlib.sha256(PDF).hexdigest(),
        "filename": "doc.pdf",
    },
]

# the runtime's providers and demo model carry media (agent_runtime.input_kinds comes with them)
RUNTIME_MEDIA = importlib.util.find_spec("agent_runtime.input_kinds") is not None
needs_runtime_media = pytest.mark.skipif(
    not RUNTIME_MEDIA, reason="the runtime's media wires and demo model are not merged here"
)
SURFACES = ("responses", "chat", "agui", "ai-sdk", "a2a-jsonrpc", "a2a-rest")


@pytest.fixture(scope="module")
def media_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("media-server"),
        {"AGENT_API_KEYS": f"{KEY}=alice,{OTHER_KEY}=bob"},
    )
    yield server
    server.stop()


@pytest.fixture
async def http(media_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with media_server.client(headers=AUTH) as client:
        yield client


def oai(server: Server, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.base_url}/openai/v1", api_key=key, max_retries=0)


def node(
    server: Server, scenario: str, session: str, question: str = QUESTION, png: bytes = PNG
) -> dict[str, Any]:
    """One scenario of ``tests/js/media_scenarios.mjs``; what it printed. The samples go in a
    file: a large one would not fit in an argument."""
    samples = {
        "id": session,
        "png": base64.b64encode(png).decode(),
        "pdf": PDF_B64,
        "key": KEY,
        "question": question,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as file:
        json.dump(samples, file)
        file.flush()
        done = subprocess.run(
            [
                npm_clients.node(),
                str(JS / "media_scenarios.mjs"),
                server.base_url,
                scenario,
                file.name,
            ],
            cwd=JS,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stderr}\n{done.stdout}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def a2a_client(server: Server, http: httpx.AsyncClient, binding: str) -> Client:
    card = await A2ACardResolver(http, server.base_url).get_agent_card()
    config = ClientConfig(httpx_client=http, streaming=False, supported_protocol_bindings=[binding])
    return ClientFactory(config).create(card)


def a2a_message(*parts: pb.Part, context_id: str = "") -> pb.Message:
    return pb.Message(
        message_id=str(uuid.uuid4()), role=pb.ROLE_USER, context_id=context_id, parts=list(parts)
    )


def a2a_parts(question: str = QUESTION, png: bytes = PNG) -> list[pb.Part]:
    return [
        pb.Part(text=question),
        pb.Part(raw=png, media_type="image/png"),
        pb.Part(raw=PDF, media_type="application/pdf", filename="doc.pdf"),
    ]


async def send(
    server: Server,
    http: httpx.AsyncClient,
    surface: str,
    session: str,
    question: str = QUESTION,
    png: bytes = PNG,
) -> str:
    """Send ``question``, the PNG (``png``) and the PDF through ``surface`` (its client, its
    parts) in session ``session``; the answer's text."""
    png_url = f"data:image/png;base64,{base64.b64encode(png).decode()}"
    if surface == "responses":
        async with oai(server) as client:
            response = await client.responses.create(
                model="default",
                conversation=session,
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": question},
                            {"type": "input_image", "image_url": png_url, "detail": "auto"},
                            {"type": "input_file", "file_data": PDF_URL, "filename": "doc.pdf"},
                        ],
                    }
                ],
            )
        return response.output_text
    if surface == "chat":
        async with oai(server) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="default",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": question},
                            {"type": "image_url", "image_url": {"url": png_url}},
                            {"type": "file", "file": {"file_data": PDF_URL, "filename": "doc.pdf"}},
                        ],
                    }
                ],
            )
        completion = raw.parse()
        # a completion runs in a session of its own: the run names it
        run = (await http.get(f"/v1/runs/{raw.headers['x-run-id']}")).json()
        return f"{run['session_id']}\n{completion.choices[0].message.content}"
    if surface in ("agui", "ai-sdk"):
        result = node(server, "agui" if surface == "agui" else "aiSdk", session, question, png)
        return str(result["text"])
    binding = "JSONRPC" if surface == "a2a-jsonrpc" else "HTTP+JSON"
    agent = await a2a_client(server, http, binding)
    request = pb.SendMessageRequest(
        message=a2a_message(*a2a_parts(question, png), context_id=session)
    )
    (reply,) = [r async for r in agent.send_message(request)]
    assert reply.task.status.state == pb.TASK_STATE_COMPLETED
    return "".join(p.text for p in reply.task.status.message.parts if p.HasField("text"))


async def stored_user_message(http: httpx.AsyncClient, session: str) -> list[dict[str, Any]]:
    answer = await http.get(f"/v1/sessions/{session}/messages")
    assert answer.status_code == 200, answer.text
    text = answer.text
    # by reference only: neither sample's base64, nor any data URL, is in the conversation
    assert PNG_B64[:40] not in text and PDF_B64[:40] not in text
    assert "base64," not in text
    user = [m for m in answer.json()["messages"] if m["role"] == "user"]
    assert len(user) == 1
    content: list[dict[str, Any]] = user[0]["content"]
    return content


def without_ids(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for part in content[1:]:
        assert part["file_id"].startswith("file_")
    return [{k: v for k, v in part.items() if k != "file_id"} for part in content]


def received(data: bytes, media_type: str) -> str:
    kind = "an image" if media_type.startswith("image/") else "a document"
    digest = hashlib.sha256(data).hexdigest()[:12]
    return f"I received {kind} ({media_type}, {len(data)} bytes, sha256 {digest})."


@pytest.mark.parametrize("surface", SURFACES)
async def test_each_surface_stores_file_references(
    media_server: Server, http: httpx.AsyncClient, surface: str
) -> None:
    session = f"media-{surface}-{uuid.uuid4().hex[:8]}"
    answer = await send(media_server, http, surface, session)
    if surface == "chat":
        session, _, answer = answer.partition("\n")
    content = await stored_user_message(http, session)
    assert without_ids(content) == STORED
    # each file is the caller's, and its bytes are the ones sent
    for part, data in ((content[1], PNG), (content[2], PDF)):
        got = await http.get(f"/v1/files/{part['file_id']}/content")
        assert (got.status_code, got.content) == (200, data)
    assert QUESTION in answer
    if RUNTIME_MEDIA:
        said = [QUESTION, received(PNG, "image/png"), received(PDF, "application/pdf")]
        assert answer == " ".join(["You said:", *said])


async def test_files_by_id(media_server: Server, http: httpx.AsyncClient) -> None:
    """Files uploaded first are named by id: Responses ``file_id``, Chat ``file.file_id``."""
    uploaded = await http.post("/v1/files", files={"file": ("doc.pdf", PDF, "application/pdf")})
    assert uploaded.status_code == 201, uploaded.text
    file_id = uploaded.json()["file_id"]
    image = await http.post("/v1/files", files={"file": ("dot.png", PNG, "image/png")})
    image_id = image.json()["file_id"]
    session = f"media-ids-{uuid.uuid4().hex[:8]}"
    async with oai(media_server) as client:
        await client.responses.create(
            model="default",
            conversation=session,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": QUESTION},
                        {"type": "input_image", "file_id": image_id, "detail": "auto"},
                        {"type": "input_file", "file_id": file_id},
                    ],
                }
            ],
        )
        chat = await client.chat.completions.with_raw_response.create(
            model="default",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": QUESTION},
                        {"type": "file", "file": {"file_id": file_id}},
                    ],
                }
            ],
        )
    content = await stored_user_message(http, session)
    assert [p.get("file_id") for p in content] == [None, image_id, file_id]
    assert content[2]["filename"] == "doc.pdf"  # the upload's name
    run = (await http.get(f"/v1/runs/{chat.headers['x-run-id']}")).json()
    assert [p.get("file_id") for p in run["input_parts"]] == [None, file_id]


async def test_a2a_history_names_files_by_url(
    media_server: Server, http: httpx.AsyncClient
) -> None:
    client = await a2a_client(media_server, http, "JSONRPC")
    request = pb.SendMessageRequest(message=a2a_message(*a2a_parts()))
    (reply,) = [r async for r in client.send_message(request)]
    task = await client.get_task(pb.GetTaskRequest(id=reply.task.id))
    sent = task.history[0]
    assert sent.role == pb.ROLE_USER
    assert sent.parts[0].text == QUESTION
    for part, data, media_type in ((sent.parts[1], PNG, "image/png"), (sent.parts[2], PDF, None)):
        assert not part.raw
        assert part.url.startswith(f"{media_server.base_url}/v1/files/file_")
        assert part.url.endswith("/content")
        got = await http.get(part.url)
        assert got.content == data
        if media_type:
            assert part.media_type == media_type
    assert sent.parts[2].filename == "doc.pdf"


# --- bodies larger than AGENT_MAX_BODY_BYTES -------------------------------------------------

# an image whose base64 alone is larger than the server's body limit (AGENT_MAX_BODY_BYTES,
# 1 MiB): a run start may carry it beside a body of its own within the limit
BIG_PNG = samples.png(1_200_000, seed=7)


@pytest.mark.parametrize("surface", SURFACES)
async def test_media_beyond_the_body_limit(
    media_server: Server, http: httpx.AsyncClient, surface: str
) -> None:
    session = f"big-{surface}-{uuid.uuid4().hex[:8]}"
    answer = await send(media_server, http, surface, session, png=BIG_PNG)
    if surface == "chat":
        session, _, answer = answer.partition("\n")
    content = await stored_user_message(http, session)
    image = content[1]
    assert (image["bytes"], image["sha256"]) == (len(BIG_PNG), hashlib.sha256(BIG_PNG).hexdigest())
    if RUNTIME_MEDIA:
        assert received(BIG_PNG, "image/png") in answer


async def test_a_body_too_large_is_refused_in_each_shape(media_server: Server) -> None:
    """Text beyond the body limit is refused however much media rides with it: 413, in the
    OpenAI shape on its paths (problem+json elsewhere: refused before the request is read)."""
    text = "x" * (1_048_576 + 10)
    async with oai(media_server) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.responses.create(
                model="default",
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": text},
                            {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
                        ],
                    }
                ],
            )
    assert caught.value.status_code == 413
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "payload_too_large"
    assert "not counting images and documents" in caught.value.body["message"]
    async with media_server.client(headers=AUTH) as http:
        agui = await http.post(
            "/v1/agents/default/ag-ui",
            json={
                "threadId": "too-large",
                "runId": "r1",
                "messages": [{"id": "u", "role": "user", "content": text}],
            },
        )
    assert agui.status_code == 413
    assert agui.json()["code"] == "payload_too_large"


# --- refusals, each in its protocol's shape -----------------------------------------------


async def test_openai_refusals(media_server: Server, http: httpx.AsyncClient) -> None:
    bob = await http.post(
        "/v1/files",
        files={"file": ("b.png", PNG, "image/png")},
        headers={"Authorization": f"Bearer {OTHER_KEY}"},
    )
    bobs = bob.json()["file_id"]
    cases: list[tuple[dict[str, Any], int, str, str, str]] = [
        # a part the surface cannot carry
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            400,
            "unsupported_media_type",
            "input[0].content[1]",
            "audio input is not supported",
        ),
        # a media type its bytes contradict
        (
            {
                "type": "input_image",
                "image_url": f"data:image/png;base64,{PDF_B64}",
                "detail": "auto",
            },
            400,
            "unsupported_media_type",
            "input[0].content[1]",
            "its bytes are application/pdf",
        ),
        # a file id that is not the caller's (another principal's is no different from none)
        (
            {"type": "input_image", "file_id": bobs, "detail": "auto"},
            400,
            "file_not_found",
            "input[0].content[1]",
            "names no file of yours",
        ),
        (
            {"type": "input_file", "file_url": "http://example.com/a.pdf"},
            400,
            "validation_error",
            "input[0].content[1]",
            "http: URLs cannot be used",
        ),
    ]
    async with oai(media_server) as client:
        for part, status, code, param, words in cases:
            # parts the SDK's types may not allow: what a client can still send
            items: Any = [{"role": "user", "content": [{"type": "input_text", "text": "x"}, part]}]
            with pytest.raises(openai.APIStatusError) as caught:
                await client.responses.create(model="default", input=items)
            error = caught.value
            assert error.status_code == status, error.body
            assert isinstance(error.body, dict)
            assert (error.body["code"], error.body["param"]) == (code, param)
            assert error.body["type"] == "invalid_request_error"
            assert words in error.body["message"]
        with pytest.raises(openai.BadRequestError) as chat_refused:
            await client.chat.completions.create(
                model="default",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "x"},
                            {
                                "type": "input_audio",
                                "input_audio": {"data": "AAAA", "format": "mp3"},
                            },
                        ],
                    }
                ],
            )
        assert isinstance(chat_refused.value.body, dict)
        assert chat_refused.value.body["param"] == "messages[0].content[1]"
        with pytest.raises(openai.BadRequestError) as lying:
            await client.chat.completions.create(
                model="default",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "file",
                                "file": {"file_data": f"data:application/pdf;base64,{PNG_B64}"},
                            }
                        ],
                    }
                ],
            )
        assert isinstance(lying.value.body, dict)
        assert lying.value.body["code"] == "unsupported_media_type"


def test_agui_refusals(media_server: Server) -> None:
    seen = node(media_server, "aguiRefusals", f"agui-no-{uuid.uuid4().hex[:8]}")
    assert seen["lying"]["code"] == "unsupported_media_type"
    assert "application/pdf" in seen["lying"]["message"]
    assert seen["audio"]["code"] == "unsupported_media_type"
    assert "audio input is not supported" in seen["audio"]["message"]
    assert seen["unknownFile"]["code"] == "file_not_found"
    assert seen["unknownFile"]["message"].startswith("messages[0].content[1]")
    assert "'openai' cannot be read here" in seen["otherProvider"]["message"]
    assert seen["httpUrl"]["code"] == "validation_error"
    assert "http: URLs cannot be used" in seen["httpUrl"]["message"]


def test_ai_sdk_refusals(media_server: Server) -> None:
    seen = node(media_server, "aiSdkRefusals", f"chat-no-{uuid.uuid4().hex[:8]}")
    # the transport raises the error answer's text: the problem object
    problems = {name: json.loads(text) for name, text in seen.items()}
    assert (problems["lying"]["status"], problems["lying"]["code"]) == (
        415,
        "unsupported_media_type",
    )
    assert problems["lying"]["detail"] == (
        "messages[0].parts[1] says its media type is image/png, but its data: URL says "
        "application/pdf"
    )
    assert problems["wrongBytes"]["code"] == "unsupported_media_type"
    assert problems["wrongBytes"]["param"] == "messages[0].parts[1]"
    assert "http: URLs cannot be used" in problems["httpUrl"]["detail"]
    assert problems["httpUrl"]["param"] == "messages[0].parts[1]"
    assert problems["audio"]["code"] == "unsupported_media_type"
    assert "audio input is not supported" in problems["audio"]["detail"]
    assert "'data-note'" in problems["data"]["detail"]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_a2a_refusals(media_server: Server, http: httpx.AsyncClient, binding: str) -> None:
    client = await a2a_client(media_server, http, binding)

    async def refused(*parts: pb.Part) -> Exception:
        request = pb.SendMessageRequest(message=a2a_message(pb.Part(text="x"), *parts))
        with pytest.raises(Exception) as caught:
            [r async for r in client.send_message(request)]
        return caught.value

    lying = await refused(pb.Part(raw=PDF, media_type="image/png"))
    assert isinstance(lying, ContentTypeNotSupportedError)
    assert "its bytes are application/pdf" in str(lying)
    untyped = await refused(pb.Part(raw=PNG))
    assert isinstance(untyped, InvalidParamsError)
    assert "message.parts[1]: a file's bytes need their mediaType" in str(untyped)
    audio = await refused(pb.Part(url="https://example.com/a.mp3", media_type="audio/mpeg"))
    assert isinstance(audio, ContentTypeNotSupportedError)
    data = pb.Part()
    data.data.struct_value.update({"note": 1})
    assert isinstance(await refused(data), InvalidParamsError)


# --- what the provider receives -----------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread(default=Respond(demo_like)) as running:
        yield running


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def wired_server(
    request: pytest.FixtureRequest,
    upstream: FakeUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Provider, Server]]:
    provider: Provider = request.param
    server = launch(
        tmp_path_factory.mktemp(f"media-{provider}"),
        upstream_env(upstream, provider, AGENT_API_KEYS=f"{KEY}=alice"),
    )
    yield provider, server
    server.stop()


def wire_blocks(provider: Provider, question: str) -> list[dict[str, Any]]:
    """The user message's content as the provider's wire carries the question, the PNG and
    the PDF."""
    if provider == "openai":
        return [
            {"type": "text", "text": question},
            {"type": "image_url", "image_url": {"url": PNG_URL}},
            {"type": "file", "file": {"filename": "doc.pdf", "file_data": PDF_URL}},
        ]
    return [
        {"type": "text", "text": question},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64},
            "title": "doc.pdf",
            # prompt caching is on by default: the conversation so far ends in a breakpoint
            "cache_control": {"type": "ephemeral"},
        },
    ]


@needs_runtime_media
@pytest.mark.parametrize("surface", SURFACES)
async def test_provider_wire_blocks(
    wired_server: tuple[Provider, Server], upstream: FakeUpstream, surface: str
) -> None:
    provider, server = wired_server
    question = f"what are these, {surface} on {provider}?"
    before = len(upstream.requests)
    async with server.client(headers=AUTH) as http:
        answer = await send(server, http, surface, f"wire-{uuid.uuid4().hex[:12]}", question)
    assert answer.endswith(f"You said: {question}")
    (request,) = upstream.requests[before:]
    assert request.protocol == provider
    user = [m for m in request.messages if m.get("role") == "user"]
    assert len(user) == 1
    assert user[0]["content"] == wire_blocks(provider, question)
