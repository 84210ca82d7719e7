"""The chat UI in a browser: the shared browser, its pages and the open server, and what a
test reads or does on a page (send a prompt, the last answer, a confirmation)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.browser import launch_chromium, skip_reason
from tests.support.server import Server, launch

try:
    from playwright.sync_api import (
        Browser,
        BrowserContext,
        Locator,
        Page,
        expect,
        sync_playwright,
    )
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

expect.set_options(timeout=15_000)

SKIP = skip_reason()
API_KEY = "ui-test-key"
SLOW_SECONDS = 0.3


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Open server: words every 20 ms, "slow" words every 0.3 s, confirmations wait 2 min."""
    server = launch(
        tmp_path_factory.mktemp("ui-server"),
        {
            "AGENT_DEMO_TOKEN_DELAY": "0.02",
            "AGENT_DEMO_SLOW_SECONDS": str(SLOW_SECONDS),
            "AGENT_CONFIRMATION_TIMEOUT": "120",
        },
    )
    yield server
    server.stop()


def new_page(context: BrowserContext) -> Iterator[Page]:
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))

    def on_console(message: Any) -> None:
        # answers like 401, 404 or 429 are logged as failed loads: the UI handles them
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(f"console: {message.text}")

    page.on("console", on_console)
    yield page
    assert not errors, errors


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport={"width": 1100, "height": 760}, color_scheme="light")
    yield context
    context.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    yield from new_page(context)


def prompt_box(page: Page) -> Locator:
    return page.get_by_role("textbox", name="Message")


def send(page: Page, text: str) -> None:
    box = prompt_box(page)
    box.fill(text)
    box.press("Enter")


def last_turn(page: Page) -> Locator:
    return page.locator("#log > .turn").last


def answer(page: Page) -> Locator:
    return last_turn(page).locator(".parts > .text")


def confirmation(page: Page, tool: str = "delete_file") -> Locator:
    return page.get_by_role("alertdialog", name=f"Allow {tool} to run?")


def wait_for_words(page: Page, count: int) -> None:
    """Until the last answer shows at least ``count`` words."""
    page.wait_for_function(
        """count => {
            const turns = document.querySelectorAll('#log > .turn');
            const last = turns[turns.length - 1];
            const text = last?.querySelector('.parts > .text')?.textContent ?? '';
            return text.trim().split(/\\s+/).filter(Boolean).length >= count;
        }""",
        arg=count,
    )


def slow_prompt(words: int) -> str:
    return "slow " + " ".join(f"w{i}" for i in range(1, words))


def wait_until(check: Callable[[], Any], within: float = 15.0) -> Any:
    """Poll ``check`` (a server-side condition) until it is truthy."""
    deadline = time.monotonic() + within
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.02)
    return value


def session_id_of(page: Page) -> str:
    value: str = page.evaluate("window.agentUI.sessionId")
    return value
