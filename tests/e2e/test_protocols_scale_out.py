"""The standard protocols on two servers sharing Redis and PostgreSQL: each answers for the
responses and tasks of the other, from the shared event log, and delivers answers to a run the
other one holds."""

from __future__ import annotations

import uuid

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types import a2a_pb2 as pb
from openai import AsyncOpenAI

from tests.support.server import Server, launch
from tests.support.services import shared_backend

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]


def sdk(server: Server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.base_url}/openai/v1", api_key="none", max_retries=0)


async def test_each_server_answers_for_the_others_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with shared_backend() as env:
        env = {**env, "AGENT_DEMO_SLOW_SECONDS": "0.2"}
        one = launch(tmp_path_factory.mktemp("protocols-one"), env)
        two = launch(tmp_path_factory.mktemp("protocols-two"), env)
        try:
            async with sdk(one) as on_one, sdk(two) as on_two:
                started = await on_one.responses.create(
                    model="default", input="slow one two three four", background=True
                )
                # streamed from the other server, live, to the end
                events = [e async for e in await on_two.responses.retrieve(started.id, stream=True)]
                assert events[-1].type == "response.completed"
                assert events[-1].response.output_text == "You said: slow one two three four"
                assert (await on_two.responses.retrieve(started.id)).status == "completed"
                # a confirmation asked on one server, answered on the other
                first = await on_one.responses.create(model="default", input="delete x.txt")
                request = first.output[-1]
                assert request.type == "mcp_approval_request"
                answered = await on_two.responses.create(
                    model="default",
                    previous_response_id=first.id,
                    input=[
                        {
                            "type": "mcp_approval_response",
                            "approval_request_id": request.id,
                            "approve": True,
                        }
                    ],
                )
                assert "Deleted x.txt" in answered.output_text
            async with httpx.AsyncClient(timeout=30.0) as http:
                clients = []
                for server in (one, two):
                    card = await A2ACardResolver(http, server.base_url).get_agent_card()
                    config = ClientConfig(httpx_client=http, streaming=False)
                    clients.append(ClientFactory(config).create(card))
                message = pb.Message(
                    message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=[pb.Part(text="hi")]
                )
                request_one = pb.SendMessageRequest(message=message)
                (sent,) = [r async for r in clients[0].send_message(request_one)]
                task = await clients[1].get_task(pb.GetTaskRequest(id=sent.task.id))
                assert task.status.state == pb.TASK_STATE_COMPLETED
                assert task.status.message.parts[0].text == "You said: hi"
        finally:
            one.stop()
            two.stop()
