"""The browser UI (app/http/ui/) in headless Chromium against real agent-server processes.

Every test waits on DOM state (Playwright's ``expect`` and ``wait_for_function``), never on
the clock. The screenshots docs/ui.md shows are taken here, as the states happen.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

try:
    from playwright.sync_api import (
        Browser,
        BrowserContext,
        Page,
        Request,
        Route,
        expect,
    )
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import ui
from tests.support.browser import DroppableProxy, screenshot
from tests.support.server import Server, launch
from tests.support.ui import (
    API_KEY,
    SKIP,
    SLOW_SECONDS,
    answer,
    confirmation,
    last_turn,
    new_page,
    prompt_box,
    send,
    session_id_of,
    slow_prompt,
    wait_for_words,
    wait_until,
)

# the browser, its pages and the open server, shared with the other UI tests
browser = ui.browser
context = ui.context
page = ui.page
ui_server = ui.ui_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
]


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """API keys, one execution slot and no queue, confirmations that expire after 2 s."""
    server = launch(
        tmp_path_factory.mktemp("ui-strict-server"),
        {
            "AGENT_API_KEYS": f"{API_KEY}=alice",
            "AGENT_MAX_CONCURRENT_RUNS": "1",
            "AGENT_MAX_QUEUED_RUNS": "0",
            "AGENT_CONFIRMATION_TIMEOUT": "2",
            "AGENT_DEMO_TOKEN_DELAY": "0.005",
            "AGENT_DEMO_SLOW_SECONDS": str(SLOW_SECONDS),
        },
    )
    yield server
    server.stop()


@pytest.fixture
def phone(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(
        viewport={"width": 375, "height": 667},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
        color_scheme="light",
    )
    yield from new_page(context)
    context.close()


@pytest.fixture
def keyed_page(context: BrowserContext) -> Iterator[Page]:
    """A page whose browser already holds the strict server's API key."""
    context.add_init_script(f"localStorage.setItem('agent-ui.api-key', '{json.dumps(API_KEY)}')")
    yield from new_page(context)


# --- helpers -------------------------------------------------------------------------------


def run_status(client: httpx.Client, run_id: str) -> str:
    status: str = client.get(f"/v1/runs/{run_id}").json()["status"]
    return status


# --- streaming and tools -------------------------------------------------------------------


def test_streaming_answer(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    expect(page.get_by_role("heading", name="What shall the agent do?")).to_be_visible()
    expect(prompt_box(page)).to_be_focused()
    screenshot(page, "empty")

    text = "Say something slow, so I can watch it stream"
    send(page, text)
    log = page.get_by_role("log", name="Conversation")
    expect(last_turn(page).locator(".msg.user .bubble")).to_have_text(text)
    wait_for_words(page, 6)
    # mid-stream: the log is busy (screen readers wait for the whole answer), Stop is offered
    expect(log).to_have_attribute("aria-busy", "true")
    expect(log).to_have_attribute("aria-live", "polite")
    expect(page.get_by_role("button", name="Stop", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_hidden()
    screenshot(page, "streaming")

    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text(f"You said: {text}")
    expect(log).to_have_attribute("aria-busy", "false")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()
    expect(last_turn(page).locator(".meta")).to_contain_text("demo")
    # the conversation is listed under its first prompt
    expect(page.locator(".session[aria-current=page]")).to_contain_text(text)
    expect(page.get_by_role("heading", level=1)).to_have_text(text)


def test_tool_call(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "What time is it?")
    card = last_turn(page).locator(".tool")
    expect(card).to_have_attribute("data-status", "ok")
    expect(card.locator(".tool-name")).to_have_text("current_time")
    expect(card.locator(".tool-args")).to_have_text("no arguments")
    result = card.locator(".tool-result").inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", result), result
    expect(answer(page)).to_have_text(f"The time is {result}.")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    screenshot(page, "tool-call")


def test_sse_parser_edge_cases(page: Page, ui_server: Server) -> None:
    """The page's SSE parser: chunks split anywhere, CRLF across chunks, comments, multi-line
    data, a missing space after the colon, an event without data."""
    page.goto(ui_server.base_url)
    result = page.evaluate(
        """async () => {
            const { SSEParser } = await import('/sse.js');
            const parser = new SSEParser();
            const chunks = [
                'id: 1\\r', '\\nevent: text.delta\\r\\ndata: {"a":', '1}\\n\\n: ping\\n\\n',
                'data: x\\ndata: y\\n\\n', 'id:2\\ndata:no-space\\n', '\\nevent: e\\n\\n',
                'data: unfinished',
            ];
            const events = [];
            let comments = 0;
            for (const chunk of chunks) {
                const out = parser.feed(chunk);
                events.push(...out.events);
                comments += out.comments;
            }
            return { events, comments };
        }"""
    )
    assert result == {
        "events": [
            {"id": "1", "event": "text.delta", "data": '{"a":1}'},
            {"id": "1", "event": "message", "data": "x\ny"},
            {"id": "2", "event": "message", "data": "no-space"},
        ],
        "comments": 1,
    }


# --- confirmations -------------------------------------------------------------------------


def test_approve(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "Please delete notes.txt")
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    # focus starts on the harmless answer; the dialog shows the tool, its arguments, the clock
    expect(dialog.get_by_role("button", name="Deny")).to_be_focused()
    expect(dialog.locator("#confirm-args")).to_have_text('{\n  "path": "notes.txt"\n}')
    expect(dialog.locator("#confirm-countdown")).to_have_text(re.compile(r"Expires in [12]:\d\d"))
    card = last_turn(page).locator(".tool")
    expect(card).to_have_attribute("data-status", "waiting")
    expect(page.locator("#conn")).to_have_text("Needs your approval")
    screenshot(page, "confirmation")

    dialog.get_by_role("button", name="Approve").click()
    expect(dialog).to_be_hidden()
    expect(card).to_have_attribute("data-status", "ok")
    expect(card.locator(".tool-state")).to_have_text("Approved · done")
    expect(card.locator(".tool-result")).to_have_text("Deleted notes.txt")
    expect(answer(page)).to_contain_text("Deleted notes.txt")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(prompt_box(page)).to_be_focused()  # focus came back where it was


def test_deny_with_escape(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "delete report.pdf")
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")  # Escape denies
    expect(dialog).to_be_hidden()
    card = last_turn(page).locator(".tool")
    expect(card).to_have_attribute("data-status", "denied")
    expect(card.locator(".tool-state")).to_have_text("Denied")
    expect(card.locator(".tool-error")).to_contain_text("denied")
    expect(answer(page)).to_contain_text("did not delete report.pdf")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    screenshot(page, "denied")
    page.emulate_media(color_scheme="dark")
    expect(page.locator("body")).to_have_css("background-color", "rgb(14, 16, 22)")
    screenshot(page, "dark")


def test_answer_no_longer_pending(context: BrowserContext, page: Page, ui_server: Server) -> None:
    """A 409 to the answer (someone answered first) reads "no longer pending"."""

    def answer_twice(route: Route) -> None:
        first = route.fetch()  # someone else's answer gets there first...
        assert first.status == 202
        route.fulfill(response=route.fetch())  # ...so this page's own answer gets the 409

    page.route("**/external-events", answer_twice)
    page.goto(ui_server.base_url)
    send(page, "delete twice.txt")
    dialog = confirmation(page)
    dialog.get_by_role("button", name="Approve").click()
    expect(dialog.locator("#confirm-message")).to_have_text(
        re.compile(r"^This request is no longer pending")
    )
    close = dialog.get_by_role("button", name="Close")
    expect(close).to_be_focused()
    close.press("Enter")
    expect(dialog).to_be_hidden()
    expect(answer(page)).to_contain_text("Deleted twice.txt")  # the first answer stood


def test_confirmation_expires(keyed_page: Page, strict_server: Server) -> None:
    page = keyed_page
    page.goto(strict_server.base_url)
    send(page, "Please delete old.log")
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    expect(dialog.locator("#confirm-message")).to_have_text(
        re.compile(r"^This request expired at .+\. The call counts as denied\.$")
    )
    expect(dialog.get_by_role("button", name="Approve")).to_be_hidden()
    screenshot(page, "expired")
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()
    card = last_turn(page).locator(".tool")
    expect(card.locator(".tool-state")).to_have_text("Expired")
    expect(answer(page)).to_contain_text("did not delete old.log")


# --- stop, reload, network drop ------------------------------------------------------------


def test_stop(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "Tell me a slow story, word by word, so that I can press Stop halfway through")
    wait_for_words(page, 5)
    run_id = last_turn(page).get_attribute("data-run-id")
    assert run_id
    page.get_by_role("button", name="Stop", exact=True).click()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "cancelled")
    expect(turn.get_by_role("status")).to_have_text(
        "Stopped. The run was cancelled at your request."
    )
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()
    with httpx.Client(base_url=ui_server.base_url) as client:
        body = client.get(f"/v1/runs/{run_id}").json()
    assert body["status"] == "cancelled"
    shown = answer(page).inner_text()
    assert shown.startswith("You said: Tell me") and not shown.endswith("through")
    screenshot(page, "stopped")


def test_reload_resumes_without_repeating(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    text = "A slow one: reload the page while it streams"
    expected = f"You said: {text}"
    send(page, text)
    wait_for_words(page, 4)
    saved = page.evaluate("JSON.parse(sessionStorage.getItem('agent-ui.active-run'))")
    assert saved["runId"] and saved["lastSeq"] >= 4

    resumed: list[Request] = []
    page.on("request", lambda r: resumed.append(r) if r.url.endswith("/events") else None)
    page.reload()
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text(expected)  # every word once: nothing repeated
    expect(page.locator("#log > .turn")).to_have_count(1)
    assert resumed, "the page did not reconnect to the run's events"
    last_event_id = int(resumed[0].headers["last-event-id"])
    assert last_event_id >= saved["lastSeq"]
    assert page.evaluate("sessionStorage.getItem('agent-ui.active-run')") is None

    # and the stored conversation comes back from the server on the next load
    page.reload()
    expect(answer(page)).to_have_text(expected)
    expect(page.locator("#log > .turn")).to_have_count(1)
    expect(last_turn(page).locator(".msg.user .bubble")).to_have_text(text)


def test_reload_while_waiting_for_approval(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "Please delete reload.txt")
    expect(confirmation(page)).to_be_visible()
    page.reload()
    # the question comes back (no new event announces it), and the answer still counts
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    expect(dialog.locator("#confirm-args")).to_contain_text("reload.txt")
    dialog.get_by_role("button", name="Approve").click()
    expect(answer(page)).to_contain_text("Deleted reload.txt")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(page.locator("#log > .turn")).to_have_count(1)


def test_network_drop_resumes(page: Page, ui_server: Server) -> None:
    port = ui_server.port
    proxy = DroppableProxy(port)
    try:
        page.goto(proxy.url)
        text = "A slow answer over a flaky network connection"
        resumed: list[Request] = []
        page.on("request", lambda r: resumed.append(r) if r.url.endswith("/events") else None)
        send(page, text)
        wait_for_words(page, 3)
        proxy.refusing = True  # the network goes down...
        assert proxy.drop() >= 1
        turn = last_turn(page)
        expect(turn).to_have_attribute("data-status", "reconnecting")
        expect(turn.get_by_role("status")).to_have_text("Connection lost, reconnecting…")
        expect(page.locator("#conn")).to_have_text("Reconnecting…")
        screenshot(page, "reconnecting")
        proxy.refusing = False  # ...and comes back
        expect(last_turn(page)).to_have_attribute("data-status", "completed")
        expect(answer(page)).to_have_text(f"You said: {text}")
        assert resumed, "the page did not reconnect after the drop"
        assert int(resumed[0].headers["last-event-id"]) >= 3
    finally:
        proxy.close()


def test_a_run_resumed_after_its_server_crashed_shows_its_answer_once(
    page: Page, tmp_path: Path
) -> None:
    # The only worker dies mid-answer and starts again on the same files: the run goes on
    # from its checkpoint in a new log (run.resumed), the answer made again from its start.
    # The page, reconnecting with the last seq it saw, drops the cut answer's words.
    env = {"AGENT_DEMO_TOKEN_DELAY": "0.02", "AGENT_DEMO_SLOW_SECONDS": str(SLOW_SECONDS)}
    server = launch(tmp_path / "server", env)
    proxy = DroppableProxy(server.port)
    try:
        page.goto(proxy.url)
        text = "A slow answer that outlives the crash of its server"
        resumed: list[Request] = []
        page.on("request", lambda r: resumed.append(r) if r.url.endswith("/events") else None)
        send(page, text)
        wait_for_words(page, 5)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.wait(10)
        expect(last_turn(page)).to_have_attribute("data-status", "reconnecting")
        server = launch(tmp_path / "server", env)
        proxy.target_port = server.port
        expect(last_turn(page)).to_have_attribute("data-status", "completed")
        expect(answer(page)).to_have_text(f"You said: {text}")  # every word once
        assert resumed and int(resumed[-1].headers["last-event-id"]) >= 5
    finally:
        proxy.close()
        server.stop()


def test_sessions_switch_and_delete(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "Hello from the first chat")
    expect(answer(page)).to_have_text("You said: Hello from the first chat")
    first = session_id_of(page)

    page.get_by_role("button", name="New chat").first.click()
    expect(page.get_by_role("heading", name="What shall the agent do?")).to_be_visible()
    assert session_id_of(page) != first
    send(page, "Hello from the second chat")
    expect(answer(page)).to_have_text("You said: Hello from the second chat")

    sessions = page.get_by_role("complementary", name="Conversations")
    sessions.get_by_role("button", name=re.compile("^Hello from the first chat")).click()
    expect(answer(page)).to_have_text("You said: Hello from the first chat")  # from the server
    expect(page.locator("#log > .turn")).to_have_count(1)
    assert session_id_of(page) == first

    delete = "Delete the conversation “Hello from the first chat”"
    sessions.get_by_role("button", name=delete).click()
    expect(page.get_by_role("heading", name="What shall the agent do?")).to_be_visible()
    expect(sessions.get_by_role("button", name=delete)).to_have_count(0)
    # deleted on the server once the Undo the page offers is over
    expect(page.get_by_role("button", name="Undo")).to_be_visible()
    with httpx.Client(base_url=ui_server.base_url) as client:
        wait_until(lambda: client.get(f"/v1/sessions/{first}").status_code == 404)


def test_sessions_come_from_the_server(keyed_page: Page, strict_server: Server) -> None:
    """A conversation started by a script (not this page, nor this browser) is listed, under
    its prompt, for the same key, and opens from the server."""
    page = keyed_page
    tag = uuid.uuid4().hex[:8]
    prompt = f"Started by a script {tag}"
    session = f"script-{tag}"
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=strict_server.base_url, headers=auth, timeout=10) as client:
        made = client.post(f"/v1/sessions/{session}/runs", json={"input": prompt, "stream": False})
        assert made.status_code == 200, made.text

    page.goto(strict_server.base_url)
    sessions = page.get_by_role("complementary", name="Conversations")
    listed = sessions.get_by_role("button", name=re.compile(f"^{prompt}"))
    expect(listed).to_be_visible()
    expect(page.locator("#log > .turn")).to_have_count(0)  # listed, not opened
    listed.click()
    expect(answer(page)).to_have_text(f"You said: {prompt}")
    expect(last_turn(page).locator(".msg.user .bubble")).to_have_text(prompt)
    assert session_id_of(page) == session
    expect(page.get_by_role("heading", level=1)).to_have_text(prompt)


def test_sessions_fall_back_to_this_browsers_list(page: Page, ui_server: Server) -> None:
    """When GET /v1/sessions fails, the Recent list is the one this browser kept."""
    asked: list[str] = []

    def unavailable(route: Route) -> None:
        asked.append(route.request.url)
        route.fulfill(
            status=503,
            content_type="application/problem+json",
            headers={"Retry-After": "1"},
            body=json.dumps(
                {
                    "type": "urn:agent-runtime:problem:unavailable",
                    "title": "Service unavailable",
                    "status": 503,
                    "detail": "the database cannot be reached right now; retry shortly",
                    "code": "unavailable",
                }
            ),
        )

    page.route(re.compile(r"/v1/sessions\?"), unavailable)
    page.goto(ui_server.base_url)
    text = f"Kept by this browser {uuid.uuid4().hex[:8]}"
    send(page, text)
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    page.reload()
    sessions = page.get_by_role("complementary", name="Conversations")
    expect(sessions.locator(".session")).to_have_count(1)
    expect(sessions.get_by_role("button", name=re.compile(f"^{text}"))).to_be_visible()
    expect(answer(page)).to_have_text(f"You said: {text}")
    assert len(asked) >= 2  # the page did ask, at each load


# --- errors --------------------------------------------------------------------------------


def test_busy_session_offers_to_follow(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    session = session_id_of(page)
    with httpx.Client(base_url=ui_server.base_url, timeout=10) as client:
        started = client.post(
            f"/v1/sessions/{session}/runs",
            json={"input": "delete hold.txt", "background": True},
        )
        assert started.status_code == 202
        run_id = started.json()["run_id"]
        wait_until(lambda: run_status(client, run_id) == "waiting")

    send(page, "Hello?")
    alert = last_turn(page).get_by_role("alert")
    expect(alert).to_contain_text("This conversation already has a run in progress")
    expect(alert).to_contain_text("already has an active run")
    screenshot(page, "busy")

    alert.get_by_role("button", name="Follow that run").click()
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    expect(dialog.locator("#confirm-args")).to_contain_text("hold.txt")
    dialog.get_by_role("button", name="Deny").click()
    expect(answer(page)).to_contain_text("did not delete hold.txt")
    expect(page.locator("#log > .turn")).to_have_count(1)


def test_busy_session_offers_to_wait_or_interrupt(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    session = session_id_of(page)
    with httpx.Client(base_url=ui_server.base_url, timeout=10) as client:

        def hold() -> str:
            started = client.post(
                f"/v1/sessions/{session}/runs",
                json={"input": "delete hold.txt", "background": True},
            )
            assert started.status_code == 202
            run_id: str = started.json()["run_id"]
            wait_until(lambda: run_status(client, run_id) == "waiting")
            return run_id

        # wait behind the active run: the message is answered once that run ends
        first = hold()
        send(page, "After you")
        alert = last_turn(page).get_by_role("alert")
        alert.get_by_role("button", name="Send after it").click()
        wait_until(lambda: client.get("/debug/state").json()["session_queued"] == 1)
        assert client.post(f"/v1/runs/{first}/cancel").status_code == 202
        expect(answer(page)).to_have_text("You said: After you")
        # its end, not only its last word: until then the session is still busy
        wait_until(lambda: client.get(f"/v1/sessions/{session}").json()["active_run_id"] is None)
        # stop the active run and send this one instead
        second = hold()
        send(page, "Instead")
        alert = last_turn(page).get_by_role("alert")
        alert.get_by_role("button", name="Stop it and send").click()
        expect(answer(page)).to_have_text("You said: Instead")
        assert run_status(client, second) == "cancelled"
        stored = client.get(f"/v1/sessions/{session}/messages").json()["messages"]
        assert {m.get("stopped") for m in stored if m["run_id"] == second} == {"superseded"}


def test_run_failed_shows_its_code(page: Page, ui_server: Server) -> None:
    def one_model_call(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}")
        route.continue_(post_data=json.dumps({**body, "max_iterations": 1}))

    page.route("**/v1/sessions/*/runs", one_model_call)
    page.goto(ui_server.base_url)
    send(page, "What time is it?")
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "failed")
    alert = turn.get_by_role("alert")
    expect(alert).to_contain_text("The run failed max_iterations")
    expect(alert).to_contain_text("raise max_iterations")
    screenshot(page, "failed")


def test_api_key_prompt(page: Page, strict_server: Server) -> None:
    page.goto(strict_server.base_url)
    expect(page.get_by_role("button", name="API key")).to_be_hidden()
    send(page, "Hello with a key")
    key_dialog = page.get_by_role("dialog", name="API key")
    expect(key_dialog).to_be_visible()
    key_field = key_dialog.get_by_label("API key")
    expect(key_field).to_be_focused()
    expect(last_turn(page).get_by_role("alert")).to_contain_text("This server needs an API key")
    screenshot(page, "api-key")

    key_field.fill("not-the-key")
    key_field.press("Enter")
    expect(key_dialog.get_by_role("alert")).to_have_text(
        "The server did not accept the saved key. Enter another one."
    )
    key_field.fill(API_KEY)
    key_field.press("Enter")
    expect(key_dialog).to_be_hidden()
    expect(answer(page)).to_have_text("You said: Hello with a key")
    expect(page.locator("#log > .turn")).to_have_count(1)
    assert page.evaluate("JSON.parse(localStorage.getItem('agent-ui.api-key'))") == API_KEY
    expect(page.get_by_role("button", name="API key")).to_be_visible()


def test_overloaded_honours_retry_after(keyed_page: Page, strict_server: Server) -> None:
    page = keyed_page
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=strict_server.base_url, headers=auth, timeout=10) as client:
        # the only execution slot is taken by a long run in another session
        held = client.post(
            f"/v1/sessions/holder-{uuid.uuid4().hex[:8]}/runs",
            json={"input": slow_prompt(60), "background": True},
        )
        assert held.status_code == 202
        held_id = held.json()["run_id"]
        wait_until(lambda: run_status(client, held_id) == "running")

        page.goto(strict_server.base_url)
        send(page, "Are you busy?")
        alert = last_turn(page).get_by_role("alert")
        expect(alert).to_contain_text("The server is busy right now")
        expect(alert).to_contain_text("Try again in 1 second.")
        screenshot(page, "error")

        assert client.post(f"/v1/runs/{held_id}/cancel").status_code in (200, 202)
        wait_until(lambda: client.get("/debug/state").json()["admission_running"] == 0)

    retry = alert.get_by_role("button", name="Retry")
    expect(retry).to_be_enabled()
    retry.click()
    expect(answer(page)).to_have_text("You said: Are you busy?")
    expect(page.locator("#log > .turn")).to_have_count(1)


# --- keyboard and phone --------------------------------------------------------------------


def test_keyboard_only(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    box = prompt_box(page)
    expect(box).to_be_focused()
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")  # a new line, not a send
    page.keyboard.type("second line")
    expect(box).to_have_value("first line\nsecond line")
    expect(page.locator("#log > .turn")).to_have_count(0)
    page.keyboard.press("Enter")
    expect(box).to_have_value("")
    expect(answer(page)).to_have_text("You said: first line\nsecond line")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")

    # a confirmation answered from the keyboard: Tab from Deny to Approve, Enter
    expect(box).to_be_focused()
    page.keyboard.type("delete draft.md")
    page.keyboard.press("Enter")
    dialog = confirmation(page)
    expect(dialog.get_by_role("button", name="Deny")).to_be_focused()
    page.keyboard.press("Tab")
    expect(dialog.get_by_role("button", name="Approve")).to_be_focused()
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    expect(answer(page)).to_contain_text("Deleted draft.md")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(box).to_be_focused()

    # Tab reaches the Send button, and the focus is visible
    page.keyboard.press("Tab")
    send_button = page.get_by_role("button", name="Send", exact=True)
    expect(send_button).to_be_focused()
    expect(send_button).to_have_css("outline-style", "solid")


def test_phone_layout(phone: Page, ui_server: Server) -> None:
    page = phone
    page.goto(ui_server.base_url)
    # nothing wider than the screen; the conversation list is a drawer behind a button
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    sidebar = page.get_by_role("complementary", name="Conversations")
    expect(sidebar).to_be_hidden()
    menu = page.get_by_role("button", name="Conversations")
    menu.click()
    expect(sidebar).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "true")
    page.keyboard.press("Escape")
    expect(sidebar).to_be_hidden()
    expect(menu).to_be_focused()

    send(page, "What time is it?")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    send(page, "Please delete phone-notes.txt")
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    box = dialog.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375
    assert box["y"] >= 0 and box["y"] + box["height"] <= 667
    screenshot(page, "phone-confirmation")
    dialog.get_by_role("button", name="Approve").click()
    expect(answer(page)).to_contain_text("Deleted phone-notes.txt")
    composer = page.locator("#composer").bounding_box()
    assert composer is not None and composer["y"] + composer["height"] <= 667
    assert composer["x"] >= 0 and composer["x"] + composer["width"] <= 375
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    screenshot(page, "phone")
