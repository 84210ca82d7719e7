"""The OpenAI-compatible endpoints, driven by the official ``openai`` SDK against a real server.

Every streamed Responses event is validated with the SDK's own ``ResponseStreamEvent`` union
(strict pydantic validation of the raw event, not just the SDK's lenient parsing), and every
``Response`` with the SDK's ``Response`` model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_input_item_param import McpApprovalResponse
from pydantic import TypeAdapter

from tests.support.server import Server, launch

KEY = "sk-openai-test"
OTHER_KEY = "sk-openai-other"
EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


@pytest.fixture(scope="module")
def oai_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("openai-server"),
        {
            "AGENT_API_KEYS": f"{KEY}=alice,{OTHER_KEY}=bob",
            "AGENT_DEMO_SLOW_SECONDS": "0.3",
        },
    )
    yield server
    server.stop()


@pytest.fixture
async def client(oai_server: Server) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=f"{oai_server.base_url}/openai/v1", api_key=KEY, max_retries=0
    ) as sdk:
        yield sdk


def validated(event: Any) -> Any:
    """The event re-validated strictly against the SDK's union; its sequence number."""
    raw = event.model_dump(mode="json", exclude_unset=True, by_alias=True)
    checked = EVENTS.validate_python(raw)
    assert type(checked) is type(event)
    return checked


def check_stream(events: list[Any], *, first: int = 0) -> Response:
    """Numbered from ``first`` without gaps, exactly one terminal event, last; its response."""
    assert [e.sequence_number for e in events] == list(range(first, first + len(events)))
    terminals = [e for e in events if e.type in TERMINAL]
    assert len(terminals) == 1
    assert events[-1] is terminals[0]
    final: Response = Response.model_validate(terminals[0].response.model_dump(mode="json"))
    return final


def approval(request_id: str, *, approve: bool) -> McpApprovalResponse:
    return {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": approve}


async def collect(stream: Any) -> list[Any]:
    return [validated(event) async for event in stream]


async def test_models_are_the_agents(client: AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["default"]
    model = await client.models.retrieve("default")
    assert model.id == "default"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")


async def test_response_not_streamed(client: AsyncOpenAI) -> None:
    response = await client.responses.create(
        model="default", input="hello there", metadata={"ticket": "42"}
    )
    Response.model_validate(response.model_dump(mode="json"))
    assert response.status == "completed"
    assert response.output_text == "You said: hello there"
    assert response.metadata == {"ticket": "42"}
    assert response.usage is not None
    assert response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    again = await client.responses.retrieve(response.id)
    assert again.status == "completed"
    assert again.output_text == "You said: hello there"


async def test_response_streamed_with_a_tool_call(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(model="default", input="what time is it", stream=True)
    events = await collect(stream)
    final = check_stream(events)
    assert events[0].type == "response.created"
    assert events[1].type == "response.in_progress"
    assert final.status == "completed"
    kinds = [item.type for item in final.output]
    assert kinds == ["function_call", "function_call_output", "message"]
    call = final.output[0]
    assert call.type == "function_call"
    assert call.name == "current_time"
    assert call.status == "completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    assert final.output_text.startswith("The time is ")
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [e.text for e in done] == [final.output_text]


async def test_previous_response_id_continues_the_session(
    client: AsyncOpenAI, oai_server: Server
) -> None:
    first = await client.responses.create(model="default", input="my name is Ada")
    second = await client.responses.create(
        model="default", input="what did I say", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    assert first.conversation is not None and second.conversation is not None
    assert second.conversation.id == first.conversation.id
    async with httpx.AsyncClient(
        base_url=oai_server.base_url, headers={"Authorization": f"Bearer {KEY}"}
    ) as http:
        messages = (await http.get(f"/v1/sessions/{first.conversation.id}/messages")).json()
    texts = [m.get("content") for m in messages["messages"]]
    assert "my name is Ada" in texts
    assert "what did I say" in texts
    assert "You said: what did I say" in texts


async def test_background_retrieve_resume_and_replay(client: AsyncOpenAI) -> None:
    started = await client.responses.create(
        model="default", input="slow one two three", background=True
    )
    assert started.status in ("queued", "in_progress")
    assert started.background is True
    # resume the stream after event 3 while the run is still going, then follow it live
    resumed = await collect(
        await client.responses.retrieve(started.id, stream=True, starting_after=3)
    )
    final = check_stream(resumed, first=4)
    assert final.status == "completed"
    assert final.output_text == "You said: slow one two three"
    # the whole stream, replayed after the end, numbers the same events the same way
    replay = await collect(await client.responses.retrieve(started.id, stream=True))
    check_stream(replay)
    assert [e.type for e in replay[4:]] == [e.type for e in resumed]
    retrieved = await client.responses.retrieve(started.id)
    assert retrieved.status == "completed"
    assert retrieved.output_text == final.output_text


async def test_cancel_a_background_response(client: AsyncOpenAI) -> None:
    words = " ".join(f"w{i}" for i in range(40))
    started = await client.responses.create(model="default", input=f"slow {words}", background=True)
    cancelled = await client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert (await client.responses.retrieve(started.id)).status == "cancelled"
    again = await client.responses.cancel(started.id)  # idempotent
    assert again.status == "cancelled"
    events = await collect(await client.responses.retrieve(started.id, stream=True))
    assert check_stream(events).status == "cancelled"


async def test_approval_round_trip_streamed(client: AsyncOpenAI) -> None:
    events = await collect(
        await client.responses.create(model="default", input="delete notes.txt", stream=True)
    )
    first = check_stream(events)
    assert first.status == "incomplete"
    request = first.output[-1]
    assert request.type == "mcp_approval_request"
    assert request.name == "delete_file"
    assert request.server_label == "default"
    assert '"notes.txt"' in request.arguments
    answer = await collect(
        await client.responses.create(
            model="default",
            previous_response_id=first.id,
            input=[approval(request.id, approve=True)],
            stream=True,
        )
    )
    final = check_stream(answer)
    assert final.status == "completed"
    assert final.id != first.id
    assert "Deleted notes.txt" in final.output_text
    outputs = [item for item in final.output if item.type == "function_call_output"]
    assert [o.output for o in outputs] == ["Deleted notes.txt"]
    # the first response stays what it was: it ended on the request
    assert (await client.responses.retrieve(first.id)).status == "incomplete"
    # the answer's response is the run from the request on; a window of the run that begins
    # anywhere else was never given out: unknown, like any made-up id
    assert (await client.responses.retrieve(final.id)).status == "completed"
    run_part, _, asked_seq = final.id.rpartition("_")
    for made_up in (int(asked_seq) - 1, int(asked_seq) + 1, 1, 999):
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.responses.retrieve(f"{run_part}_{made_up}")
        assert unknown.value.status_code == 404
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel(f"{run_part}_{made_up}")
    # a second answer to the same request is refused
    with pytest.raises(openai.ConflictError):
        await client.responses.create(
            model="default",
            previous_response_id=first.id,
            input=[approval(request.id, approve=True)],
        )


async def test_approval_denied_not_streamed(client: AsyncOpenAI) -> None:
    first = await client.responses.create(model="default", input="delete keep.txt")
    assert first.status == "incomplete"
    request = first.output[-1]
    assert request.type == "mcp_approval_request"
    final = await client.responses.create(
        model="default",
        previous_response_id=first.id,
        input=[approval(request.id, approve=False)],
    )
    assert final.status == "completed"
    assert "did not delete keep.txt" in final.output_text


async def test_chat_completion(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="default",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi there"},
        ],
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "You said: hi there"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0


async def test_chat_completion_streamed_with_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "what time is it"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("The time is ")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


async def test_chat_completion_confirmation_points_to_responses(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.ConflictError) as caught:
        await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "delete a.txt"}]
        )
    assert caught.value.code == "confirmation_required"
    assert "/openai/v1/responses" in caught.value.message
    stream = await client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "delete b.txt"}], stream=True
    )
    with pytest.raises(openai.APIError) as streamed:
        async for _ in stream:
            pass
    assert "mcp_approval_response" in streamed.value.message


async def test_errors_in_the_openai_shape(oai_server: Server, client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model="nope", input="hi")
    assert missing.value.code == "not_found"
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_0123456789abcdef0123456789abcdef")
    with pytest.raises(openai.UnprocessableEntityError):
        await client.responses.create(
            model="default",
            input="hi",
            tools=[{"type": "function", "name": "f", "parameters": {}, "strict": False}],
        )
    async with AsyncOpenAI(
        base_url=f"{oai_server.base_url}/openai/v1", api_key="sk-wrong", max_retries=0
    ) as wrong:
        with pytest.raises(openai.AuthenticationError) as denied:
            await wrong.models.list()
    assert denied.value.code == "unauthorized"
    # another principal's response does not exist for them
    mine = await client.responses.create(model="default", input="private")
    async with AsyncOpenAI(
        base_url=f"{oai_server.base_url}/openai/v1", api_key=OTHER_KEY, max_retries=0
    ) as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(mine.id)


async def test_a_full_worker_sheds_protocol_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = launch(
        tmp_path_factory.mktemp("openai-shed"),
        {
            "AGENT_MAX_CONCURRENT_RUNS": "1",
            "AGENT_MAX_QUEUED_RUNS": "0",
            "AGENT_DEMO_SLOW_SECONDS": "5",
        },
    )
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http:
            held = await http.post(
                "/v1/sessions/shed-holder/runs",
                json={"input": "slow a b c", "background": True},
            )
            assert held.status_code == 202
            async with AsyncOpenAI(
                base_url=f"{server.base_url}/openai/v1", api_key="none", max_retries=0
            ) as sdk:
                with pytest.raises(openai.RateLimitError) as refused:
                    await sdk.responses.create(model="default", input="hi")
                assert refused.value.code == "overloaded"
                assert refused.value.response.headers["retry-after"]
                with pytest.raises(openai.RateLimitError):
                    await sdk.chat.completions.create(
                        model="default", messages=[{"role": "user", "content": "hi"}]
                    )
            a2a = await http.post(
                "/a2a/default/message:send",
                json={
                    "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
                },
                headers={"A2A-Version": "1.0"},
            )
            assert a2a.status_code == 429
            assert a2a.headers["retry-after"]
            await http.post(f"/v1/runs/{held.json()['run_id']}/cancel")
    finally:
        server.stop()
