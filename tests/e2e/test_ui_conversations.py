"""The browser UI's conversations in headless Chromium: following a live answer (and letting
the reader scroll away from it), deleting with Undo, plain-text titles, the approval dialog's
arguments shown once, editing a message, the labelled agent picker, the Markdown suggestion,
and the overview picture README.md shows.

Every test waits on DOM or server state, never on the clock; the page fixtures fail a test on
any JavaScript error or console error.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

try:
    from playwright.sync_api import Browser, Locator, Page, Route, expect
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import ui
from tests.support.browser import overview_screenshot, screenshot
from tests.support.server import Server, launch
from tests.support.ui import (
    SKIP,
    answer,
    confirmation,
    last_turn,
    new_page,
    prompt_box,
    send,
    session_id_of,
    wait_for_words,
    wait_until,
)

# the browser, its pages and the open server, as the other UI tests have them
browser = ui.browser
context = ui.context
page = ui.page
ui_server = ui.ui_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
]

# the view is at the end of the conversation, and the conversation is taller than the view
AT_THE_END = """() => {
    const chat = document.getElementById('chat');
    return chat.scrollHeight > chat.clientHeight + 200
        && chat.scrollHeight - chat.scrollTop - chat.clientHeight < 4;
}"""


def _client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=30)


def _words(page: Page) -> int:
    count: int = page.evaluate(
        """() => {
            const turns = document.querySelectorAll('#log > .turn');
            const text = turns[turns.length - 1]?.querySelector('.parts > .text')?.textContent;
            return (text ?? '').trim().split(/\\s+/).filter(Boolean).length;
        }"""
    )
    return count


def _scroll_top(page: Page) -> float:
    top: float = page.evaluate("document.getElementById('chat').scrollTop")
    return top


def _recent(page: Page) -> Locator:
    return page.get_by_role("complementary", name="Conversations")


def _delete_button(page: Page, title: str) -> Locator:
    return _recent(page).get_by_role("button", name=f"Delete the conversation “{title}”")


def _status(client: httpx.Client, session: str) -> int:
    return client.get(f"/v1/sessions/{session}").status_code


# --- following the live answer ---------------------------------------------------------------


def test_a_conversation_opened_mid_run_follows_its_answer(page: Page, ui_server: Server) -> None:
    """A run started by a script, opened in the browser while it streams: the view keeps the
    answer's end in sight; scrolling up stops that (the view stays put while words arrive),
    scrolling back to the bottom starts it again, and so does "Jump to the latest"."""
    session = f"follow-{uuid.uuid4().hex[:8]}"
    earlier = "\n\n".join(f"Line {i} of an earlier message" for i in range(25))
    # one word per paragraph, every 0.3 s: the answer grows a line at a time
    prompt = "slow\n\n" + "\n\n".join(f"w{i}" for i in range(1, 45))
    with _client(ui_server) as client:
        for _ in range(2):
            done = client.post(
                f"/v1/sessions/{session}/runs", json={"input": earlier, "stream": False}
            )
            assert done.status_code == 200, done.text
        started = client.post(
            f"/v1/sessions/{session}/runs", json={"input": prompt, "background": True}
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        try:
            page.goto(ui_server.base_url)
            _recent(page).locator(f'[data-session="{session}"]').click()
            expect(last_turn(page)).to_have_attribute("data-status", "running")
            wait_for_words(page, 8)
            page.wait_for_function(AT_THE_END)
            jump = page.get_by_role("button", name="Jump to the latest")
            expect(jump).to_be_hidden()

            # the reader scrolls up: the view stays where they put it while words arrive
            page.locator("#chat").hover()
            page.mouse.wheel(0, -600)
            expect(jump).to_be_visible()
            top = _scroll_top(page)
            assert top > 0
            wait_for_words(page, _words(page) + 3)
            assert _scroll_top(page) == top
            assert not page.evaluate(AT_THE_END)

            # back to the bottom: it follows again
            page.mouse.wheel(0, 100_000)
            expect(jump).to_be_hidden()
            wait_for_words(page, _words(page) + 2)
            page.wait_for_function(AT_THE_END)

            # up again, then "Jump to the latest"
            page.mouse.wheel(0, -600)
            expect(jump).to_be_visible()
            screenshot(page, "jump")
            jump.click()
            expect(jump).to_be_hidden()
            wait_for_words(page, _words(page) + 2)
            page.wait_for_function(AT_THE_END)
        finally:
            client.post(f"/v1/runs/{run_id}/cancel")
    expect(last_turn(page)).to_have_attribute("data-status", "cancelled")


# --- deleting, with Undo -------------------------------------------------------------------------


def _three_conversations(server: Server) -> list[tuple[str, str]]:
    """Three sessions made by a script: (session id, title) each."""
    tag = uuid.uuid4().hex[:8]
    made = []
    with _client(server) as client:
        for name in ("first", "second", "third"):
            session, title = f"del-{name}-{tag}", f"To delete, {name} {tag}"
            done = client.post(
                f"/v1/sessions/{session}/runs", json={"input": title, "stream": False}
            )
            assert done.status_code == 200, done.text
            made.append((session, title))
    return made


def test_delete_waits_for_undo_then_deletes(page: Page, ui_server: Server) -> None:
    (first, first_title), (second, second_title), (third, third_title) = _three_conversations(
        ui_server
    )
    deletions: list[str] = []
    page.on("request", lambda r: deletions.append(r.url) if r.method == "DELETE" else None)
    page.goto(ui_server.base_url)
    toast = page.get_by_role("alert").filter(has_text="Deleted")
    with _client(ui_server) as client:
        # deleting takes the entry out of the list at once and offers Undo; nothing is gone yet
        _delete_button(page, first_title).click()
        expect(_recent(page).locator(f'[data-session="{first}"]')).to_have_count(0)
        expect(toast).to_contain_text(f"Deleted “{first_title}”")
        undo = toast.get_by_role("button", name="Undo")
        expect(undo).to_be_focused()
        screenshot(page, "undo")
        assert _status(client, first) == 200
        undo.click()
        expect(_recent(page).locator(f'[data-session="{first}"]')).to_have_count(1)
        expect(toast).to_have_count(0)

        # deleting another one sends the deletion waiting before it at once
        _delete_button(page, second_title).click()
        expect(toast).to_contain_text(second_title)
        _delete_button(page, third_title).click()
        expect(toast).to_contain_text(third_title)
        wait_until(lambda: _status(client, second) == 404)
        # the last one goes once its Undo is over
        expect(toast).to_have_count(0, timeout=20_000)
        wait_until(lambda: _status(client, third) == 404)

        # the one taken back was never sent
        assert _status(client, first) == 200
        assert not [url for url in deletions if first in url]
        assert len(deletions) == 2
    for session in (second, third):
        expect(_recent(page).locator(f'[data-session="{session}"]')).to_have_count(0)


def test_a_deletion_waiting_for_undo_is_sent_when_the_page_goes(
    page: Page, ui_server: Server
) -> None:
    (first, first_title), _, _ = _three_conversations(ui_server)
    page.goto(ui_server.base_url)
    _delete_button(page, first_title).click()
    expect(page.get_by_role("button", name="Undo")).to_be_visible()
    page.reload()
    with _client(ui_server) as client:
        wait_until(lambda: _status(client, first) == 404)
    expect(_recent(page).locator(".session").first).to_be_visible()
    expect(_recent(page).locator(f'[data-session="{first}"]')).to_have_count(0)


def test_deleting_the_open_conversation_and_taking_it_back(page: Page, ui_server: Server) -> None:
    (first, first_title), _, _ = _three_conversations(ui_server)
    page.goto(ui_server.base_url)
    _recent(page).locator(f'[data-session="{first}"]').click()
    expect(answer(page)).to_have_text(f"You said: {first_title}")
    _delete_button(page, first_title).click()
    expect(page.get_by_role("heading", name="What shall the agent do?")).to_be_visible()
    page.get_by_role("button", name="Undo").click()
    expect(answer(page)).to_have_text(f"You said: {first_title}")
    assert session_id_of(page) == first
    with _client(ui_server) as client:
        assert _status(client, first) == 200


# --- titles ----------------------------------------------------------------------------------


def test_titles_are_plain_text_on_one_line(page: Page, ui_server: Server) -> None:
    tag = uuid.uuid4().hex[:6]
    page.goto(ui_server.base_url)
    send(page, f"# A heading\n\n**Bold** and `code` {tag}, see [the docs](https://example.org/)")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    title = f"A heading Bold and code {tag}, see the docs"
    heading = page.locator("#chat-title")
    expect(heading).to_have_text(title)
    expect(page.locator(".session[aria-current=page] .session-title")).to_have_text(title)
    expect(page).to_have_title(f"{title} · agent-server")

    # a long first message: cut at 80 characters with an ellipsis, in the list as in the header
    page.get_by_role("button", name="New chat").first.click()
    send(page, "- " + " ".join(f"item{i}" for i in range(40)))
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    page.reload()  # the server's title now
    expect(heading).to_have_text(re.compile(r"^item0 item1 .*…$"))
    shown = heading.inner_text()
    assert len(shown) == 80, shown
    expect(page.locator(".session[aria-current=page] .session-title")).to_have_text(shown)
    # one line: the header keeps its height
    box = heading.bounding_box()
    assert box is not None and box["height"] < 30, box


# --- the approval dialog, editing, the agent picker --------------------------------------------


def test_the_approval_dialog_shows_the_arguments_once(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "Please delete notes.txt")
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    expect(dialog.locator("#confirm-args")).to_contain_text('"path": "notes.txt"')
    expect(dialog.locator("#confirm-question")).to_have_text(
        "The agent wants to run this tool with the arguments below."
    )
    assert dialog.inner_text().count("notes.txt") == 1, dialog.inner_text()
    page.keyboard.press("Escape")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")


def test_editing_a_message_hides_its_own_actions(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "Hello, to be edited")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    actions = last_turn(page).locator(".user-actions")
    last_turn(page).locator(".msg.user").hover()
    expect(actions).to_be_visible()
    last_turn(page).get_by_role("button", name="Edit and resend the message").click()
    box = page.get_by_role("textbox", name="Edit the message")
    expect(box).to_be_focused()
    expect(actions).to_be_hidden()
    expect(last_turn(page).get_by_role("button", name="Copy the message")).to_be_hidden()
    box.press("Escape")
    expect(box).to_have_count(0)
    last_turn(page).locator(".msg.user").hover()
    expect(actions).to_be_visible()


def test_the_agent_picker_is_labelled_under_the_message_box(page: Page, ui_server: Server) -> None:
    agents = {
        "agents": [
            {"name": "default", "description": "The default agent", "ready": True},
            {"name": "clock", "description": "Tells the time", "ready": True},
        ]
    }

    def two_agents(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=json.dumps(agents))

    page.route(re.compile(r"/v1/agents$"), two_agents)
    page.goto(ui_server.base_url)
    picker = page.get_by_role("combobox", name="Agent")
    expect(picker).to_be_visible()
    expect(page.locator("#agent-picker")).to_contain_text("Agent")  # a visible label
    expect(picker).to_have_value("default")
    # beside the message it applies to, not at the far end of the header
    composer = page.locator("#composer").bounding_box()
    placed = picker.bounding_box()
    header = page.locator(".topbar").bounding_box()
    assert composer is not None and placed is not None and header is not None
    assert placed["y"] >= composer["y"] + composer["height"] - 1, (placed, composer)
    assert placed["y"] > header["y"] + header["height"]
    assert placed["x"] < composer["x"] + composer["width"] / 2, (placed, composer)
    picker.select_option("clock")
    page.reload()
    expect(page.get_by_role("combobox", name="Agent")).to_have_value("clock")


# --- the demo's Markdown, and the overview picture ----------------------------------------------


def _markdown_suggestion(page: Page) -> Locator:
    return page.get_by_role("button", name=re.compile("^Show me some Markdown"))


def test_the_markdown_suggestion_renders_a_code_block(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    _markdown_suggestion(page).click()
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    text = answer(page)
    expect(text.get_by_role("heading", name="A heading")).to_be_visible()
    expect(text.locator("li")).to_have_count(2)
    expect(text.locator("strong")).to_have_text("bold")
    expect(text.get_by_role("link", name="a link")).to_have_attribute(
        "href", "https://example.org/"
    )
    block = text.locator(".code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("pre")).to_have_text('def greet(name):\n    return f"Hello, {name}!"')
    expect(block.locator(".hljs-keyword").first).to_have_text("def")  # highlighted
    screenshot(page, "suggestion-markdown")


@pytest.fixture
def overview_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A fresh server, so the picture's list holds only its own conversations."""
    server = launch(tmp_path_factory.mktemp("ui-overview"), {"AGENT_DEMO_TOKEN_DELAY": "0.005"})
    yield server
    server.stop()


def test_the_overview_picture(browser: Browser, overview_server: Server) -> None:
    """README.md's picture of the UI: a tool call, then an answer in Markdown with code."""
    with _client(overview_server) as client:
        for index, prompt in enumerate(
            ["Plan a weekend in Oslo", "Summarise the release notes", "Draft a reply to Sam"]
        ):
            made = client.post(
                f"/v1/sessions/overview-{index}/runs", json={"input": prompt, "stream": False}
            )
            assert made.status_code == 200, made.text
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    try:
        for page in new_page(context):
            page.goto(overview_server.base_url)
            markdown = _markdown_suggestion(page).get_attribute("data-prompt")
            assert markdown is not None
            send(page, "What time is it?")
            expect(last_turn(page).locator(".tool")).to_have_attribute("data-status", "ok")
            expect(last_turn(page)).to_have_attribute("data-status", "completed")
            prompt_box(page).fill(markdown)
            prompt_box(page).press("Enter")
            expect(last_turn(page)).to_have_attribute("data-status", "completed")
            expect(answer(page).locator(".code-block")).to_be_visible()
            page.wait_for_function(
                "() => { const c = document.getElementById('chat');"
                " return c.scrollHeight - c.scrollTop - c.clientHeight < 4; }"
            )
            path = overview_screenshot(page)
            assert path.name == "ui.png" and path.stat().st_size > 10_000
    finally:
        context.close()
