"""Values a database cannot store exactly get the same answer on every backend.

A NUL in the input or in a metadata key or value (PostgreSQL's text and jsonb cannot hold one;
SQLite can), and a number JSON cannot carry (``1e400``, read as infinity; ``NaN``): each is a
422 ``validation_error`` on SQLite and on PostgreSQL alike, naming the field without echoing
what was sent, and nothing is stored. The same body without them is accepted on both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support.problems import assert_problem
from tests.support.server import BACKENDS, Server, backend_env, launch

pytestmark = pytest.mark.postgres

JSON = {"content-type": "application/json"}

# (label, raw body, the field the answer names)
BAD = [
    ("NUL in the input", b'{"input": "a\\u0000b", "stream": false}', "body.input"),
    ("NUL in a metadata value", b'{"input": "a", "metadata": {"k": "v\\u0000"}}', "metadata"),
    ("NUL in a metadata key", b'{"input": "a", "metadata": {"k\\u0000": "v"}}', "metadata"),
    ("NUL deep in metadata", b'{"input": "a", "metadata": {"k": [{"x": "\\u0000"}]}}', "metadata"),
    ("1e400 in metadata", b'{"input": "a", "metadata": {"a": 1e400}}', "metadata"),
    ("-1e400 in metadata", b'{"input": "a", "metadata": {"a": [-1e400]}}', "metadata"),
    ("NaN in metadata", b'{"input": "a", "metadata": {"a": NaN}}', "metadata"),
]


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with backend_env(request.param) as env:
        running = launch(tmp_path_factory.mktemp("bad-values"), env)
        yield running
        running.stop()


@pytest.mark.parametrize(("label", "body", "field"), BAD, ids=[b[0] for b in BAD])
async def test_unstorable_values_are_422_on_every_backend(
    server: Server, label: str, body: bytes, field: str
) -> None:
    session = f"bad-{abs(hash(label))}"
    async with server.client() as client:
        response = await client.post(f"/v1/sessions/{session}/runs", content=body, headers=JSON)
        problem = assert_problem(response, 422, "validation_error")
        assert field in response.text
        assert "\\u0000" not in response.text and "inf" not in response.text.lower()
        assert problem["status"] == 422
        # nothing was started or stored
        assert (await client.get(f"/v1/sessions/{session}")).status_code == 404


async def test_the_same_values_without_them_are_stored_on_every_backend(server: Server) -> None:
    async with server.client() as client:
        response = await client.post(
            "/v1/sessions/good-values/runs",
            json={
                "input": "a\u0001b\u001fc",
                "stream": False,
                "metadata": {"k\u0001": "v\u001f", "big": 1e308, "small": -1e-320, "n": [1, 2.5]},
            },
        )
        assert response.status_code == 200, response.text
        run = (await client.get(f"/v1/runs/{response.json()['run_id']}")).json()
        metadata = run["metadata"]
        # jsonb keeps a number's decimal value, and answers 1e308 in full digits
        assert float(metadata.pop("big")) == 1e308
        assert metadata == {"k\u0001": "v\u001f", "small": -1e-320, "n": [1, 2.5]}
        messages = (await client.get("/v1/sessions/good-values/messages")).json()["messages"]
        assert messages[0]["content"] == "a\u0001b\u001fc"
    assert "Traceback" not in server.log()


# ECMAScript's white space (what JSON Schema's regexes mean by \s), beside Python's own
_ECMA_SPACE = "\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_BLANKISH = [chr(c) for c in range(0x21) if chr(c).isspace() or c < 0x20] + [
    "\x1c",
    "\x1d",
    "\x1e",
    "\x1f",
    "\x85",
    "\xa0",
    "\u2028",
    "\u3000",
    "\ufeff",
    "\u200b",
    "x",
]


async def test_an_external_event_name_is_refused_exactly_when_the_schema_says(
    server: Server,
) -> None:
    async with server.client() as client:
        schema = (await client.get("/openapi.json")).json()
        name = schema["components"]["schemas"]["ExternalEventRequest"]["properties"]["name"]
        pattern = name["pattern"]
        ecma = pattern.replace("\\s", _ECMA_SPACE).replace("\\S", f"[^{_ECMA_SPACE}]")
        disagree = []
        for char in _BLANKISH:
            body = {"session_id": "names", "name": char, "payload": {}}
            response = await client.post("/external-events", json=body)
            refused = response.status_code == 422
            for engine in (pattern, ecma):
                if (re.search(engine, char) is None) != refused:
                    disagree.append((hex(ord(char)), engine == ecma, response.status_code))
        assert not disagree, disagree
