"""The browser UI's answers in headless Chromium: Markdown with hostile payloads, copy, edit and
regenerate (each a new branch; tests/e2e/test_ui_branches.py steps between them), stopped and
stored turns drawn as the live ones were, titles from the server, the security headers (and no
CSP violation), /docs offline, the phone viewport.

Every test waits on DOM state, never on the clock; the page fixtures fail a test on any
JavaScript error or console error (a CSP violation is one).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

try:
    from playwright.sync_api import Browser, BrowserContext, Page, Route, expect
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import ui
from tests.support.browser import screenshot
from tests.support.server import Server, launch
from tests.support.ui import (
    SKIP,
    answer,
    last_turn,
    new_page,
    send,
    session_id_of,
    slow_prompt,
    wait_for_words,
)

# the browser and its pages, as the other UI tests have them
browser = ui.browser
context = ui.context
page = ui.page

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
]

# a hostile answer: the demo model says back what it is told, so this is what it answers
HOSTILE = (
    "Here is a plan.\n\n"
    "## Steps\n\n"
    "1. read **the docs**\n"
    "2. run `make`\n\n"
    "```python\n"
    "def greet(name):\n"
    "    return f\"<script>window.__pwned = 'code'</script> {name}\"\n"
    "```\n\n"
    "<img src=x onerror=\"window.__pwned = 'img'\"> "
    "<script>window.__pwned = 'script'</script>\n\n"
    "[a harmless link](javascript:window.__pwned='link') and [a real one](https://example.org/)"
)


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("ui-answers"),
        {"AGENT_DEMO_TOKEN_DELAY": "0.01", "AGENT_DEMO_SLOW_SECONDS": "0.3"},
    )
    yield server
    server.stop()


@pytest.fixture
def csp_watch(page: Page) -> Page:
    """The page, recording every CSP violation in ``window.__violations``."""
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation',"
        " e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
    )
    return page


def stored(server: Server, session: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        body: dict[str, Any] = client.get(f"/v1/sessions/{session}/messages").json()
        return body


def log_text(page: Page) -> str:
    text: str = page.locator("#log").inner_text()
    return text


def test_markdown_renders_and_nothing_executes(csp_watch: Page, ui_server: Server) -> None:
    page = csp_watch
    response = page.goto(ui_server.base_url)
    assert response is not None
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    send(page, HOSTILE)
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    text = answer(page)
    expect(text.get_by_role("heading", name="Steps", level=2)).to_be_visible()
    expect(text.locator("ol > li")).to_have_count(2)
    expect(text.locator("strong")).to_have_text("the docs")
    expect(text.locator(":not(pre) > code")).to_have_text("make")
    code = text.locator(".code-block")
    expect(code.locator(".code-lang")).to_have_text("python")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator("pre")).to_contain_text("<script>window.__pwned = 'code'</script>")
    # the raw HTML is text; the javascript: link lost its URL; the real one opens apart
    expect(text).to_contain_text("<img src=x onerror=")
    expect(text).to_contain_text("<script>window.__pwned = 'script'</script>")
    assert text.locator("script, img, iframe, [onerror]").count() == 0
    harmless = text.get_by_text("a harmless link")
    assert harmless.get_attribute("href") is None
    real = text.get_by_role("link", name="a real one")
    expect(real).to_have_attribute("href", "https://example.org/")
    expect(real).to_have_attribute("target", "_blank")
    expect(real).to_have_attribute("rel", "noopener noreferrer nofollow")
    harmless.click()
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("window.__violations") == []
    screenshot(page, "markdown")


def test_copy_the_answer_a_code_block_and_a_message(
    context: BrowserContext, page: Page, ui_server: Server
) -> None:
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=ui_server.base_url)
    page.goto(ui_server.base_url)
    prompt = "Show me:\n\n```js\nconst answer = 42;\n```"
    send(page, prompt)
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")

    def clipboard() -> str:
        text: str = page.evaluate("navigator.clipboard.readText()")
        return text

    copy_code = turn.get_by_role("button", name="Copy the js code")
    copy_code.click()
    expect(copy_code).to_have_text("Copied")
    assert clipboard() == "const answer = 42;"
    turn.get_by_role("button", name="Copy the answer").click()
    assert clipboard() == f"You said: {prompt}"  # the Markdown, as the model wrote it
    turn.get_by_role("button", name="Copy the message").click()
    assert clipboard() == prompt


def test_edit_and_resend_makes_a_branch(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "first question")
    expect(answer(page)).to_have_text("You said: first question")
    send(page, "second question, with a typo")
    expect(answer(page)).to_have_text("You said: second question, with a typo")
    turns = page.locator("#log > .turn")
    # any message can be edited, the last one here
    expect(turns.first.get_by_role("button", name="Edit and resend the message")).to_be_visible()
    turns.last.get_by_role("button", name="Edit and resend the message").click()
    box = turns.last.get_by_role("textbox", name="Edit the message")
    expect(box).to_be_focused()
    expect(box).to_have_value("second question, with a typo")
    box.fill("second question, fixed")
    screenshot(page, "edit")
    box.press("Enter")
    expect(answer(page)).to_have_text("You said: second question, fixed")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(turns).to_have_count(2)
    expect(turns.last.get_by_role("group", name="Branch 2 of 2")).to_be_visible()
    # the server keeps both branches: the edited turn beside the first one's answer
    contents = [m["content"] for m in stored(ui_server, session_id_of(page))["messages"]]
    assert contents == [
        "first question",
        "You said: first question",
        "second question, with a typo",
        "You said: second question, with a typo",
        "second question, fixed",
        "You said: second question, fixed",
    ]
    live = log_text(page)
    page.reload()
    expect(turns).to_have_count(2)
    expect(answer(page)).to_have_text("You said: second question, fixed")
    assert log_text(page) == live


def test_regenerate_makes_a_sibling_answer(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "tell me once")
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    before = turn.get_attribute("data-run-id")
    turn.get_by_role("button", name="Regenerate the answer").click()
    turns = page.locator("#log > .turn")
    expect(turns).to_have_count(1)
    expect(last_turn(page)).not_to_have_attribute("data-run-id", before or "")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text("You said: tell me once")
    after = last_turn(page).get_attribute("data-run-id")
    body = stored(ui_server, session_id_of(page))
    assert [r["run_id"] for r in body["runs"]] == [before, after]
    # two first turns: the regenerated one continues nothing, as the first did
    firsts = [(m["run_id"], m["parent_run"]) for m in body["messages"] if "parent_run" in m]
    assert firsts == [(before, None), (after, None)]


def test_a_stopped_turn_survives_a_reload_unchanged(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, slow_prompt(40))
    wait_for_words(page, 4)
    page.get_by_role("button", name="Stop", exact=True).click()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "cancelled")
    expect(turn.get_by_role("status")).to_have_text(
        "Stopped. The run was cancelled at your request."
    )
    live = log_text(page)
    body = stored(ui_server, session_id_of(page))
    assert [m["stopped"] for m in body["messages"]] == ["cancel_requested"] * 2

    page.reload()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "cancelled")
    expect(turn.get_by_role("status")).to_have_text(
        "Stopped. The run was cancelled at your request."
    )
    assert log_text(page) == live
    screenshot(page, "stopped-reload")


def test_stored_turns_read_as_the_live_ones(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    send(page, "What time is it?")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    send(page, "Please delete kept.txt")
    dialog = page.get_by_role("alertdialog", name="Allow delete_file to run?")
    dialog.get_by_role("button", name="Approve").click()
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    send(page, "delete other.txt")
    page.get_by_role("alertdialog", name="Allow delete_file to run?").get_by_role(
        "button", name="Deny"
    ).click()
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    turns = page.locator("#log > .turn")
    expect(turns.nth(1).locator(".tool-state")).to_have_text("Approved · done")
    expect(turns.nth(2).locator(".tool-state")).to_have_text("Denied")
    expect(turns.nth(2).locator(".meta")).to_contain_text(re.compile(r"demo · \d+ tokens in"))
    live = log_text(page)
    page.reload()
    expect(turns).to_have_count(3)
    expect(turns.nth(1).locator(".tool-state")).to_have_text("Approved · done")
    assert log_text(page) == live
    error = turns.nth(2).locator(".tool-error").inner_text()
    assert not error.startswith("Error: ")


def test_titles_come_with_the_list(page: Page, ui_server: Server) -> None:
    tag = uuid.uuid4().hex[:6]
    with httpx.Client(base_url=ui_server.base_url, timeout=10) as client:
        for i in range(4):
            made = client.post(
                f"/v1/sessions/titled-{tag}-{i}/runs",
                json={"input": f"Question {i} of {tag}", "stream": False},
            )
            assert made.status_code == 200
        # a session whose only run was cancelled still has its title
        held = client.post(
            f"/v1/sessions/titled-{tag}-stopped/runs",
            json={"input": f"Stopped early {tag} slow", "background": True},
        ).json()
        client.post(f"/v1/runs/{held['run_id']}/cancel")
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/v1/" in r.url else None)
    page.goto(ui_server.base_url)
    sessions = page.get_by_role("complementary", name="Conversations")
    expect(sessions.get_by_role("button", name=re.compile(f"^Stopped early {tag}"))).to_be_visible()
    for i in range(4):
        expect(
            sessions.get_by_role("button", name=re.compile(f"^Question {i} of {tag}"))
        ).to_be_visible()
    expect(sessions.get_by_text("Untitled conversation")).to_have_count(0)
    assert len([u for u in asked if re.search(r"/v1/sessions\?", u)]) == 1
    assert not [u for u in asked if "/v1/runs/" in u]  # no title looked up run by run

    sessions.get_by_role("button", name=re.compile(f"^Question 2 of {tag}")).click()
    expect(answer(page)).to_have_text(f"You said: Question 2 of {tag}")
    page.get_by_role("button", name="Rename the conversation").click()
    box = page.get_by_role("textbox", name="Conversation title")
    box.fill(f"Renamed {tag}")
    box.press("Enter")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Renamed {tag}")
    page.reload()
    expect(sessions.get_by_role("button", name=re.compile(f"^Renamed {tag}"))).to_be_visible()


def test_framing_is_refused(browser: Browser, ui_server: Server) -> None:
    """Another site cannot frame the page (and so cannot trick a click on Approve)."""
    context = browser.new_context()
    try:
        host = context.new_page()
        with host.expect_console_message(lambda m: "frame-ancestors" in m.text) as refusal:
            host.set_content(f'<iframe src="{ui_server.base_url}/" width="600"></iframe>')
        assert "'none'" in refusal.value.text
        framed = host.frames[1]
        assert framed.locator("#prompt").count() == 0  # the UI never loaded in the frame
    finally:
        context.close()


def test_docs_render_with_the_network_blocked(context: BrowserContext, ui_server: Server) -> None:
    elsewhere: list[str] = []

    def only_this_server(route: Route) -> None:
        if route.request.url.startswith(ui_server.base_url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", only_this_server)
    for docs in new_page(context):
        docs.goto(f"{ui_server.base_url}/docs")
        expect(docs.locator(".swagger-ui .info .title")).to_contain_text("agent-server")
        expect(docs.locator(".opblock-summary-path").first).to_be_visible()
        screenshot(docs, "docs")
    assert elsewhere == []


def test_skill_and_the_model_that_answered(page: Page, ui_server: Server) -> None:
    """A run whose skill was activated and whose answer came from a fallback model: the turn
    names both (the stream is the server's own, with those two events added)."""

    def with_skill_and_fallback(route: Route) -> None:
        upstream = route.fetch()
        frames = upstream.text().split("\n\n")
        out: list[str] = []
        for frame in frames:
            if "event: usage" in frame or "event: run.completed" in frame:
                data = json.loads(frame.split("data: ", 1)[1])
                usage = data["data"]["usage"] if "usage" in data["data"] else data["data"]
                usage["model"] = "fallback-model"
                frame = frame.split("data: ", 1)[0] + "data: " + json.dumps(data)
            out.append(frame)
            if "event: run.started" in frame:
                started = json.loads(frame.split("data: ", 1)[1])
                # between run.started and the next event (the page applies rising seqs)
                skill = {
                    **started,
                    "seq": started["seq"] + 0.5,
                    "type": "custom",
                    "data": {"name": "skill_activated", "payload": {"skill": "summarise"}},
                }
                out.append(f"event: custom\ndata: {json.dumps(skill)}")
        route.fulfill(response=upstream, body="\n\n".join(out))

    page.route("**/v1/sessions/*/runs", with_skill_and_fallback)
    page.goto(ui_server.base_url)
    send(page, "sum this up")
    meta = last_turn(page).locator(".meta")
    expect(meta.locator(".skill")).to_have_text("skill summarise")
    expect(meta.locator(".model")).to_contain_text("fallback-model")
    # no agent picker: this server lists no agents (GET /v1/agents answers 404)
    expect(page.locator("#agent-picker")).to_be_hidden()


def test_phone_viewport(browser: Browser, ui_server: Server) -> None:
    context = browser.new_context(
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    try:
        for page in new_page(context):
            page.goto(ui_server.base_url)
            send(page, HOSTILE + "\n\n```\n" + "x" * 300 + "\n```")
            expect(last_turn(page)).to_have_attribute("data-status", "completed")
            # a long code line scrolls inside its block; the page stays as wide as the screen
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            box = last_turn(page).locator(".code-block").last.bounding_box()
            assert box is not None and box["x"] + box["width"] <= 390
            expect(
                last_turn(page).get_by_role("button", name="Regenerate the answer")
            ).to_be_visible()
            screenshot(page, "phone-markdown")
    finally:
        context.close()
