"""``useStream`` (npm ``@langchain/langgraph-sdk/react``), unmodified, driving a React page in
headless Chromium against a real server's /langgraph API.

The page (tests/js/usestream/app.jsx) is bundled with esbuild at test time and served from a
loopback site of its own: another origin, which the server allows by ``AGENT_CORS_ORIGINS``,
as a browser app deployed apart from the service is. It sends its key as the SDK does
(``X-Api-Key``). The page shows the messages as they stream, the waiting interrupt with
Accept / Ignore, and a prompt box; the tests type, click and wait on the DOM.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

try:
    from playwright.sync_api import Locator, Page, expect
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import npm, ui
from tests.support.server import Server, launch
from tests.support.static_site import serve_directory

# the browser and its pages (a console error, a failed CORS check among them, fails the test)
browser = ui.browser
context = ui.context
page = ui.page

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(ui.SKIP is not None, reason=ui.SKIP or ""),
]

KEY = "sk-usestream-alice"


def _bundle(directory: Path) -> None:
    """The page and its bundle (app.js) into ``directory``, by tests/js/usestream/build.mjs."""
    done = subprocess.run(
        [npm.node(), str(npm.JS / "usestream" / "build.mjs"), str(directory)],
        cwd=npm.JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"the bundle failed:\n{done.stderr}\n{done.stdout}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The origin serving the bundled page."""
    directory = tmp_path_factory.mktemp("usestream-site")
    _bundle(directory)
    with serve_directory(directory) as origin:
        yield origin


@pytest.fixture(scope="module")
def lg_server(tmp_path_factory: pytest.TempPathFactory, site: str) -> Iterator[Server]:
    """Keys required; the page's origin allowed; "slow" words every 0.3 s."""
    server = launch(
        tmp_path_factory.mktemp("usestream-server"),
        {
            "AGENT_API_KEYS": f"{KEY}=alice",
            "AGENT_CORS_ORIGINS": site,
            "AGENT_DEMO_TOKEN_DELAY": "0.01",
            "AGENT_DEMO_SLOW_SECONDS": "0.3",
        },
    )
    yield server
    server.stop()


@pytest.fixture
def chat(page: Page, site: str, lg_server: Server) -> Page:
    """The page, open on the server's /langgraph API."""
    query = urlencode({"api": f"{lg_server.base_url}/langgraph", "key": KEY})
    page.goto(f"{site}/index.html?{query}")
    expect(page.locator("#status")).to_have_attribute("data-loading", "false")
    return page


def _send(page: Page, prompt: str) -> None:
    page.get_by_role("textbox", name="Prompt").fill(prompt)
    page.get_by_role("button", name="Send").click()


def _messages(page: Page, kind: str) -> Locator:
    return page.locator(f"#messages > li[data-type={kind}]")


def _created(page: Page) -> tuple[str, str]:
    """The thread and run of the page's last run, as ``useStream``'s ``onCreated`` got them."""
    status = page.locator("#status")
    expect(status).not_to_have_attribute("data-run-id", "")
    thread = status.get_attribute("data-thread-id")
    run = status.get_attribute("data-run-id")
    assert thread and run
    return thread, run


def _read(server: Server, path: str) -> dict[str, Any]:
    """``GET /langgraph{path}`` as the page's principal."""
    with httpx.Client(base_url=f"{server.base_url}/langgraph", timeout=10) as http:
        answer = http.get(path, headers={"X-Api-Key": KEY})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _wait_for_words(page: Page, least: int, fewer_than: int) -> str:
    """The last AI message's text once it has ``least`` words, and fewer than ``fewer_than``."""
    text: str = page.wait_for_function(
        """([least, fewerThan]) => {
            const answers = document.querySelectorAll('#messages > li[data-type=ai] .text');
            const text = answers[answers.length - 1]?.textContent ?? '';
            const count = text.split(/\\s+/).filter(Boolean).length;
            return count >= least && count < fewerThan ? text : null;
        }""",
        arg=[least, fewer_than],
    ).json_value()
    return text


def test_an_answer_streams_in(chat: Page, lg_server: Server) -> None:
    page = chat
    # the demo model says it back, one word every 0.3 s: "You said: slow w1 ... w5" (8 words)
    _send(page, "slow w1 w2 w3 w4 w5")
    expect(_messages(page, "human")).to_have_text(["slow w1 w2 w3 w4 w5"])
    expect(page.locator("#status")).to_have_attribute("data-loading", "true")
    early = _wait_for_words(page, 2, 5)
    later = _wait_for_words(page, 5, 8)
    final = "You said: slow w1 w2 w3 w4 w5"
    assert early != later
    assert final.startswith(early.strip()) and final.startswith(later.strip())
    expect(_messages(page, "ai").locator(".text")).to_have_text([final])
    expect(page.locator("#status")).to_have_attribute("data-loading", "false")
    # the streamed message is the stored one: one AI message, not a chunk and a copy
    expect(_messages(page, "ai")).to_have_count(1)
    thread, run = _created(page)
    assert _read(lg_server, f"/threads/{thread}/runs/{run}")["status"] == "success"
    stored = _read(lg_server, f"/threads/{thread}/state")["values"]["messages"][-1]
    expect(_messages(page, "ai")).to_have_attribute("data-id", stored["id"])
    assert stored["content"] == final


def test_an_interrupt_accepted_then_one_ignored(chat: Page, lg_server: Server) -> None:
    page = chat
    dialog = page.get_by_role("alertdialog", name="Interrupt")

    _send(page, "please delete notes.txt")
    expect(dialog.locator(".action")).to_have_text("delete_file")
    assert json.loads(dialog.locator(".args").inner_text()) == {"path": "notes.txt"}
    expect(page.locator("#status")).to_have_attribute("data-loading", "false")
    # the model's call is in the messages, waiting
    expect(_messages(page, "ai").locator(".tool-call")).to_contain_text(["delete_file"])
    thread, asked = _created(page)
    assert _read(lg_server, f"/threads/{thread}")["status"] == "interrupted"
    dialog.get_by_role("button", name="Accept").click()
    expect(dialog).to_have_count(0)
    # the tool ran: its result, then the model's answer
    expect(_messages(page, "tool").locator(".text")).to_have_text(["Deleted notes.txt"])
    expect(_messages(page, "ai").last.locator(".text")).to_have_text(
        "Deleted notes.txt as you asked."
    )
    expect(page.locator("#status")).to_have_attribute("data-loading", "false")
    # the answer went on with the same run, which is done
    assert _created(page) == (thread, asked)
    assert _read(lg_server, f"/threads/{thread}/runs/{asked}")["status"] == "success"

    _send(page, "delete old.log")
    expect(dialog.locator(".action")).to_have_text("delete_file")
    assert json.loads(dialog.locator(".args").inner_text()) == {"path": "old.log"}
    dialog.get_by_role("button", name="Ignore").click()
    expect(dialog).to_have_count(0)
    expect(_messages(page, "ai").last.locator(".text")).to_have_text(
        "I did not delete old.log: the request was not approved."
    )
    expect(page.locator("#status")).to_have_attribute("data-loading", "false")
    expect(_messages(page, "human")).to_have_text(["please delete notes.txt", "delete old.log"])
    # one thread for the page's conversation, idle again
    assert _created(page)[0] == thread
    assert _read(lg_server, f"/threads/{thread}")["status"] == "idle"
