"""The browser UI's branches in headless Chromium: Edit and Regenerate add a turn beside the
one they act on (the old one stays), the "2 / 3" control steps between a turn's siblings and
shows each one's later turns, a reload opens the newest branch with the stepping still there,
and a message sent after stepping continues the branch shown.

What the model saw is read from the server: the demo model counts every word it is given as
an input token (``usage.input_tokens`` of ``GET /v1/runs/{id}``), so a run that saw another
branch's turns would count their words too.

Every test waits on DOM or server state, never on the clock; the page fixtures fail a test on
any JavaScript error or console error.
"""

from __future__ import annotations

from typing import Any

import httpx
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
from tests.support.server import Server
from tests.support.ui import (
    SKIP,
    answer,
    last_turn,
    send,
    session_id_of,
    slow_prompt,
    wait_for_words,
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


def _turns(page: Page) -> Locator:
    return page.locator("#log > .turn")


def _answer_of(turn: Locator) -> Locator:
    return turn.locator(".parts > .text")


def _nav(turn: Locator) -> Locator:
    return turn.locator(".branch-nav")


def _said(page: Page, *texts: str) -> None:
    """The turns shown, in order, are the answers to ``texts``."""
    expect(_turns(page)).to_have_count(len(texts))
    for index, text in enumerate(texts):
        expect(_answer_of(_turns(page).nth(index))).to_have_text(f"You said: {text}")


def _ask(page: Page, text: str) -> None:
    send(page, text)
    expect(answer(page)).to_have_text(f"You said: {text}")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")


def _run_id(turn: Locator) -> str:
    run_id = turn.get_attribute("data-run-id")
    assert run_id
    return run_id


def _api(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=10)


def _parents(server: Server, session: str) -> dict[str, str | None]:
    """Each stored turn's parent, as GET /v1/sessions/{id}/messages names it."""
    with _api(server) as client:
        body = client.get(f"/v1/sessions/{session}/messages").json()
    return {m["run_id"]: m["parent_run"] for m in body["messages"] if "parent_run" in m}


def _input_tokens(server: Server, run_id: str) -> int:
    with _api(server) as client:
        view: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
    tokens: int = view["usage"]["input_tokens"]
    return tokens


def _words(*texts: str) -> int:
    """The words of a conversation of ``texts``, each with its answer (the input tokens the
    demo model counts for it)."""
    return sum(len(text.split()) + len(f"You said: {text}".split()) for text in texts)


def _edit(turn: Locator, text: str) -> None:
    turn.get_by_role("button", name="Edit and resend the message").click()
    box = turn.get_by_role("textbox", name="Edit the message")
    expect(box).to_be_focused()
    box.fill(text)
    box.press("Enter")


def test_edit_regenerate_and_step_between_branches(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    for text in ("one", "two", "three"):
        _ask(page, text)
    turns = _turns(page)
    one, two, three = (_run_id(turns.nth(i)) for i in range(3))
    expect(_nav(turns.nth(1))).to_have_count(0)  # one branch: no control

    # editing the second message sends it as a new branch from the first turn
    _edit(turns.nth(1), "two, edited")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    _said(page, "one", "two, edited")
    second = turns.nth(1)
    nav = _nav(second)
    expect(nav).to_have_text("2 / 2")
    expect(second.get_by_role("group", name="Branch 2 of 2")).to_be_visible()
    expect(nav.get_by_role("button", name="Show the next branch")).to_be_disabled()
    expect(_nav(turns.first)).to_have_count(0)
    edited = _run_id(second)
    screenshot(page, "branches")

    # back to the first branch: the original answer and the turn after it
    nav.get_by_role("button", name="Show the previous branch").click()
    _said(page, "one", "two", "three")
    nav = _nav(turns.nth(1))
    expect(nav).to_have_text("1 / 2")
    expect(nav.get_by_role("button", name="Show the previous branch")).to_be_disabled()
    # the keyboard stays on the control (the button that still steps)
    expect(nav.get_by_role("button", name="Show the next branch")).to_be_focused()
    expect(page.locator("#announcer")).to_have_text("Branch 1 of 2")

    # and forward again
    nav.get_by_role("button", name="Show the next branch").click()
    _said(page, "one", "two, edited")
    expect(_nav(turns.nth(1))).to_have_text("2 / 2")

    # regenerate: a third sibling, of the same prompt
    turns.nth(1).get_by_role("button", name="Regenerate the answer").click()
    expect(turns.nth(1)).not_to_have_attribute("data-run-id", edited)
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    _said(page, "one", "two, edited")
    expect(_nav(turns.nth(1))).to_have_text("3 / 3")
    again = _run_id(turns.nth(1))
    session = session_id_of(page)
    assert _parents(ui_server, session) == {
        one: None,
        two: one,
        three: two,
        edited: one,
        again: one,
    }

    # a reload opens the newest branch, and the stepping is still there
    page.reload()
    _said(page, "one", "two, edited")
    expect(_turns(page).nth(1)).to_have_attribute("data-run-id", again)
    nav = _nav(_turns(page).nth(1))
    expect(nav).to_have_text("3 / 3")
    nav.get_by_role("button", name="Show the previous branch").click()
    expect(_nav(_turns(page).nth(1))).to_have_text("2 / 3")
    expect(_turns(page).nth(1)).to_have_attribute("data-run-id", edited)
    _nav(_turns(page).nth(1)).get_by_role("button", name="Show the previous branch").click()
    _said(page, "one", "two", "three")
    expect(_nav(_turns(page).nth(1))).to_have_text("1 / 3")

    # a message sent now continues the branch shown: the model saw that branch's turns only
    _ask(page, "four")
    _said(page, "one", "two", "three", "four")
    four = _run_id(last_turn(page))
    assert _parents(ui_server, session)[four] == three
    assert _input_tokens(ui_server, four) == _words("one", "two", "three") + 1
    # (the latest branch would have been one, then "two, edited": fewer words)
    assert _words("one", "two, edited") + 1 != _words("one", "two", "three") + 1

    # that branch is the newest now: a reload opens it
    page.reload()
    _said(page, "one", "two", "three", "four")
    expect(_nav(_turns(page).nth(1))).to_have_text("1 / 3")


def test_editing_the_first_message_starts_again(page: Page, ui_server: Server) -> None:
    page.goto(ui_server.base_url)
    for text in ("hello there", "and more"):
        _ask(page, text)
    turns = _turns(page)
    first = _run_id(turns.first)

    _edit(turns.first, "hi")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    _said(page, "hi")
    expect(_nav(turns.first)).to_have_text("2 / 2")
    fresh = _run_id(turns.first)
    # a new first turn: the model saw the edited message alone
    assert _input_tokens(ui_server, fresh) == 1  # "hi"
    parents = _parents(ui_server, session_id_of(page))
    assert (parents[first], parents[fresh]) == (None, None)

    _nav(turns.first).get_by_role("button", name="Show the previous branch").click()
    _said(page, "hello there", "and more")

    # a message sent after stepping back to it continues the first branch
    _ask(page, "go on")
    _said(page, "hello there", "and more", "go on")
    assert _input_tokens(ui_server, _run_id(last_turn(page))) == (
        _words("hello there", "and more") + 2
    )


def test_a_reload_mid_run_keeps_the_branch_it_continues(page: Page, ui_server: Server) -> None:
    """The live turn kept for a reload remembers the turn it continues: the page shows that
    branch under it, not the latest one, and steps between the branches once it ends."""
    page.goto(ui_server.base_url)
    for text in ("one", "two", "three"):
        _ask(page, text)
    slow = slow_prompt(12)
    _edit(_turns(page).nth(1), slow)
    wait_for_words(page, 3)
    page.reload()
    expect(_turns(page)).to_have_count(2)
    expect(_answer_of(_turns(page).first)).to_have_text("You said: one")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_have_text(f"You said: {slow}")
    nav = _nav(last_turn(page))
    expect(nav).to_have_text("2 / 2")
    nav.get_by_role("button", name="Show the previous branch").click()
    _said(page, "one", "two", "three")
