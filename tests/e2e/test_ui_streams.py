"""Streams in headless Chromium: the UI's Idempotency-Key on every send (a send cut by the
network never doubles the user's turn), and the browser's native EventSource reading a run of
an authenticated server with the stream token of its ``events_url``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

try:
    from playwright.sync_api import BrowserContext, Page, Request, expect
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import ui
from tests.support.browser import DroppableProxy
from tests.support.server import Server, launch
from tests.support.ui import API_KEY, SKIP, answer, last_turn, send, session_id_of, wait_for_words

browser = ui.browser
context = ui.context
page = ui.page

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
]


@pytest.fixture(scope="module")
def stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Words every 20 ms, "slow" words every 0.3 s; API keys for the EventSource test only."""
    server = launch(
        tmp_path_factory.mktemp("ui-stream-server"),
        {"AGENT_DEMO_TOKEN_DELAY": "0.02", "AGENT_DEMO_SLOW_SECONDS": "0.3"},
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("ui-keyed-server"),
        {"AGENT_API_KEYS": f"{API_KEY}=alice", "AGENT_DEMO_TOKEN_DELAY": "0.01"},
    )
    yield server
    server.stop()


def user_turns(server: Server, session_id: str) -> list[str]:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        stored = client.get(f"/v1/sessions/{session_id}/messages").json()
    return [m["content"] for m in stored["messages"] if m["role"] == "user"]


def test_every_send_carries_its_own_key(page: Page, stream_server: Server) -> None:
    keys: list[str | None] = []

    def on_request(request: Request) -> None:
        if request.method == "POST" and request.url.endswith("/runs"):
            keys.append(request.headers.get("idempotency-key"))

    page.on("request", on_request)
    page.goto(stream_server.base_url)
    for text in ("First message", "Second message"):
        send(page, text)
        expect(answer(page)).to_have_text(f"You said: {text}")
    assert len(keys) == 2 and all(keys) and keys[0] != keys[1], keys


def test_a_send_cut_by_the_network_keeps_one_turn(page: Page, stream_server: Server) -> None:
    port = stream_server.port
    proxy = DroppableProxy(port)
    posts: list[Request] = []
    page.on(
        "request",
        lambda r: posts.append(r) if r.method == "POST" and r.url.endswith("/runs") else None,
    )
    try:
        page.goto(proxy.url)
        text = "slow words over a network that drops the send"
        send(page, text)
        wait_for_words(page, 2)
        assert proxy.drop() >= 1  # the POST's own stream is cut
        expect(last_turn(page)).to_have_attribute("data-status", "completed", timeout=60_000)
        expect(answer(page)).to_have_text(f"You said: {text}")
    finally:
        proxy.close()
    # however the page came back (a repeat of the POST, or a reader of the run's events),
    # the conversation holds the user's turn once
    assert user_turns(stream_server, session_id_of(page)) == [text]
    assert len({r.headers.get("idempotency-key") for r in posts}) == 1


_EVENT_SOURCE = """
async ({ key, withToken }) => {
  const started = await fetch("v1/sessions/es-token/runs", {
    method: "POST",
    headers: { "Authorization": `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ input: "hello from EventSource", background: true }),
  });
  const { events_url } = await started.json();
  const url = withToken ? events_url : events_url.split("?")[0];
  const source = new EventSource(url.replace(/^\\//, ""));
  const seen = [];
  return await new Promise((resolve) => {
    for (const type of ["run.started", "text.delta", "usage", "run.completed"]) {
      source.addEventListener(type, (event) => {
        seen.push({ type, id: event.lastEventId });
        if (type === "run.completed") {
          source.close(); // the terminal event: the pattern docs/api.md shows
          resolve({ seen, url: events_url, state: source.readyState });
        }
      });
    }
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        resolve({ seen, url: events_url, state: source.readyState });
      }
    };
  });
}
"""


def test_native_eventsource_reads_with_a_stream_token(
    context: BrowserContext, keyed_server: Server
) -> None:
    # a page of its own: the refused EventSource below is a console error by design
    page = context.new_page()
    page.goto(keyed_server.base_url)
    result: dict[str, Any] = page.evaluate(_EVENT_SOURCE, {"key": API_KEY, "withToken": True})
    assert "?token=" in result["url"]
    types = [event["type"] for event in result["seen"]]
    assert types[0] == "run.started" and types[-1] == "run.completed"
    assert [int(e["id"]) for e in result["seen"]] == sorted(int(e["id"]) for e in result["seen"])
    # without the token, the browser's EventSource cannot authenticate: 401, and it gives up
    refused: dict[str, Any] = page.evaluate(_EVENT_SOURCE, {"key": API_KEY, "withToken": False})
    assert refused["seen"] == [] and refused["state"] == 2
