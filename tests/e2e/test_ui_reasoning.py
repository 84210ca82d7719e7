"""A model's reasoning in the chat UI (headless Chromium): a collapsed "Reasoning" above what
it led to, while the run streams and in the stored conversation read back after a reload. The
server's ``thinker`` agent reasons before each answer and tool call
(``tests/fakes/reasoning_models.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

try:
    from playwright.sync_api import Locator, Page, expect
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import ui
from tests.support.browser import screenshot
from tests.support.server import Server, launch
from tests.support.ui import SKIP, answer, confirmation, last_turn, send

browser = ui.browser
context = ui.context
page = ui.page

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
]

AGENTS = """
[agents.thinker]
model = "python:tests.fakes.reasoning_models:thinker"
tools = ["current_time", "delete_file"]

[agents.thinker.policies]
delete_file = "ask"
"""
FIRST = 'Thinking about "Please delete notes.txt", step 1.'
SECOND = 'Thinking about "Please delete notes.txt", step 2.'


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("ui-thinking-server")
    config = directory / "agents.toml"
    config.write_text(AGENTS, encoding="utf-8")
    server = launch(
        directory / "server",
        {
            "AGENT_CONFIG": str(config),
            "AGENT_DEMO_TOKEN_DELAY": "0.02",
            "AGENT_CONFIRMATION_TIMEOUT": "120",
        },
    )
    yield server
    server.stop()


def reasoning(page: Page) -> Locator:
    return last_turn(page).locator(".parts > details.reasoning")


def check_collapsed_above(turn: Locator, texts: list[str]) -> None:
    """Each reasoning collapsed, titled "Reasoning", holding its text, right before what it
    led to (a tool call, then the answer)."""
    shown = turn.locator(".parts > details.reasoning")
    expect(shown).to_have_count(len(texts))
    for index, text in enumerate(texts):
        details = shown.nth(index)
        expect(details).not_to_have_attribute("open", re.compile(".*"))
        expect(details.locator("summary")).to_have_text("Reasoning")
        expect(details.locator(".reasoning-text")).to_have_text(text)
        expect(details.locator(".reasoning-text")).to_be_hidden()  # collapsed
    kinds = turn.locator(".parts > *").evaluate_all(
        "els => els.map(el => el.tagName === 'DETAILS' ? 'reasoning' : el.className.split(' ')[0])"
    )
    assert kinds == ["reasoning", "tool", "reasoning", "text"][: len(kinds)], kinds


def test_reasoning_is_collapsed_above_the_answer_live_and_stored(
    page: Page, thinking_server: Server
) -> None:
    page.goto(thinking_server.base_url)
    page.get_by_role("combobox", name="Agent").select_option("thinker")
    send(page, "Please delete notes.txt")
    # the run waits for the approval: live, its first call's reasoning above the held call
    dialog = confirmation(page)
    expect(dialog).to_be_visible()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "waiting")
    check_collapsed_above(turn, [FIRST])
    dialog.get_by_role("button", name="Approve").click()
    expect(answer(page)).to_contain_text("Deleted notes.txt")
    expect(turn).to_have_attribute("data-status", "completed")
    check_collapsed_above(turn, [FIRST, SECOND])
    # a reader opens it: the text is there, and the summary still says what it is
    first = reasoning(page).first
    first.locator("summary").click()
    expect(first).to_have_attribute("open", "")
    expect(first.locator(".reasoning-text")).to_be_visible()
    screenshot(page, "reasoning")
    # the meta line counts what the model reported beyond the totals
    expect(turn.locator(".meta")).to_contain_text(re.compile(r"tokens in \(\d+ cached\)"))
    expect(turn.locator(".meta")).to_contain_text(re.compile(r"out \(14 reasoning\)"))

    # the stored conversation shows the same, collapsed again
    page.reload()
    stored = last_turn(page)
    expect(stored).to_have_attribute("data-status", "completed")
    check_collapsed_above(stored, [FIRST, SECOND])
    expect(answer(page)).to_contain_text("Deleted notes.txt")
    # Copy copies the answer, not the reasoning
    assert "Thinking about" not in stored.locator(".parts > .text").inner_text()


def test_a_reasoning_the_reader_opened_stays_open_as_the_run_goes_on(
    page: Page, thinking_server: Server
) -> None:
    page.goto(thinking_server.base_url)
    page.get_by_role("combobox", name="Agent").select_option("thinker")
    send(page, "what time is it")
    shown = reasoning(page)
    expect(shown.first).to_be_attached()
    shown.first.locator("summary").click()  # opened while the run goes on
    expect(answer(page)).to_contain_text("The time is")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    # the next call's reasoning comes collapsed; the one the reader opened stays open
    expect(shown).to_have_count(2)
    expect(shown.first).to_have_attribute("open", "")
    expect(shown.first.locator(".reasoning-text")).to_have_text(
        'Thinking about "what time is it", step 1.'
    )
    expect(shown.nth(1)).not_to_have_attribute("open", re.compile(".*"))
