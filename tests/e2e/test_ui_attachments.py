"""Attachments in the browser UI, in headless Chromium against real agent-server processes.

Files come in by the Attach button (the file picker), by pasting an image and by dropping
files on the composer (synthetic ``paste`` and ``drop`` events carrying a ``DataTransfer``);
each is uploaded at once (``POST /v1/files``) and the run names it by ``file_id``. With API
keys on, the conversation's images are fetched with the key and shown through object URLs,
also after a reload. A file the server would refuse (its type, or over the server's
``AGENT_MAX_FILE_BYTES``) is refused in the page without an upload; one the server refuses
all the same shows the server's reason.

Every test waits on DOM or server state, never on the clock; the page fixtures fail a test on
any JavaScript error or console error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

try:
    from playwright.sync_api import BrowserContext, FilePayload, Locator, Page, Request, expect
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

from tests.support import ui
from tests.support.browser import screenshot
from tests.support.server import Server, launch
from tests.support.ui import (
    API_KEY,
    SKIP,
    answer,
    last_turn,
    new_page,
    prompt_box,
    wait_for_words,
)

browser = ui.browser
context = ui.context

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
]

MAX_FILE_BYTES = 64 * 1024


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """API keys on, and a 64 KiB limit on uploads."""
    server = launch(
        tmp_path_factory.mktemp("ui-files-server"),
        {
            "AGENT_API_KEYS": f"{API_KEY}=alice",
            "AGENT_MAX_FILE_BYTES": str(MAX_FILE_BYTES),
            "AGENT_DEMO_TOKEN_DELAY": "0.005",
        },
    )
    yield server
    server.stop()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    """A page whose browser holds the server's API key."""
    context.add_init_script(f"localStorage.setItem('agent-ui.api-key', '{json.dumps(API_KEY)}')")
    yield from new_page(context)


@pytest.fixture
def keyless(context: BrowserContext) -> Iterator[Page]:
    """A page whose browser has no API key yet."""
    yield from new_page(context)


# --- helpers -------------------------------------------------------------------------------


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A real PNG of one colour."""
    row = b"\x00" + bytes(rgb) * width
    raw = row * height

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def client() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def short_hash(data: bytes) -> str:
    """The first 12 hex digits of ``data``'s sha256: the demo model names what it received by
    them, so an answer that has them shows the model was given those bytes."""
    return hashlib.sha256(data).hexdigest()[:12]


def stored_user_parts(server: Server, session: str) -> list[dict[str, Any]]:
    """The content parts of the session's stored user messages, in order."""
    with httpx.Client(base_url=server.base_url, headers=client(), timeout=10) as http:
        answer = http.get(f"/v1/sessions/{session}/messages")
        assert answer.status_code == 200, answer.text
        parts: list[dict[str, Any]] = []
        for message in answer.json()["messages"]:
            if message["role"] == "user" and isinstance(message["content"], list):
                parts.extend(message["content"])
        return parts


def tray(page: Page) -> Locator:
    return page.get_by_role("list", name="Attachments")


def attach_by_button(page: Page, *files: FilePayload) -> None:
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach files").click()
    chooser.value.set_files(list(files))


def file_payload(name: str, media_type: str, data: bytes) -> FilePayload:
    return {"name": name, "mimeType": media_type, "buffer": data}


# a DataTransfer built in the page from (name, type, base64) triples, handed to an event
_DISPATCH = """([selector, kind, files]) => {
    const transfer = new DataTransfer();
    for (const [name, type, data] of files) {
        const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
        transfer.items.add(new File([bytes], name, { type }));
    }
    const target = document.querySelector(selector);
    const init = { bubbles: true, cancelable: true };
    if (kind === 'paste') {
        const paste = new ClipboardEvent('paste', { ...init, clipboardData: transfer });
        return target.dispatchEvent(paste);
    }
    for (const type of ['dragenter', 'dragover']) {
        target.dispatchEvent(new DragEvent(type, { ...init, dataTransfer: transfer }));
    }
    return target.dispatchEvent(new DragEvent('drop', { ...init, dataTransfer: transfer }));
}"""


def dispatch(page: Page, selector: str, kind: str, *files: tuple[str, str, bytes]) -> bool:
    """Dispatch a ``paste`` or a drag and ``drop`` of ``files`` at ``selector``; whether the
    event was left to the browser's default (False: the page took it)."""
    encoded = [(name, type_, base64.b64encode(data).decode()) for name, type_, data in files]
    taken: bool = page.evaluate(_DISPATCH, [selector, kind, encoded])
    return taken


def image_shown(image: Locator) -> None:
    """``image`` is drawn from an object URL (the bytes fetched with the key)."""
    expect(image).to_have_attribute("data-state", "loaded")
    expect(image).to_have_attribute("src", re.compile(r"^blob:"))
    image.evaluate("img => img.decode()")
    width: int = image.evaluate("img => img.naturalWidth")
    assert width > 0


def uploads(page: Page) -> list[Request]:
    """Every POST /v1/files the page makes from now on."""
    seen: list[Request] = []
    page.on(
        "request",
        lambda request: (
            seen.append(request)
            if request.method == "POST" and request.url.endswith("/v1/files")
            else None
        ),
    )
    return seen


# --- attaching and sending ------------------------------------------------------------------


def test_attach_by_button_send_and_see_it_after_a_reload(page: Page, files_server: Server) -> None:
    page.goto(files_server.base_url)
    picture = png(96, 64, (214, 48, 72))
    recipe = b"# Tomato soup\n\n1. Roast the tomatoes.\n2. Blend.\n"
    attach_by_button(
        page,
        file_payload("red square.png", "image/png", picture),
        file_payload("soup.md", "text/markdown", recipe),
    )
    items = tray(page).get_by_role("listitem")
    expect(items).to_have_count(2)
    for item in items.all():
        expect(item).to_have_attribute("data-status", "ready")
    items.first.locator("img.attachment-thumb").evaluate("img => img.decode()")
    expect(items.first.get_by_role("button", name="Remove red square.png")).to_be_visible()
    expect(items.last.get_by_role("button", name="Remove soup.md")).to_be_visible()
    prompt_box(page).fill("Is this the colour of the soup?")
    screenshot(page, "attachments-composing")
    prompt_box(page).press("Enter")

    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_contain_text("Is this the colour of the soup?")
    expect(answer(page)).to_contain_text(short_hash(picture))
    expect(answer(page)).to_contain_text(short_hash(recipe))
    expect(tray(page)).to_be_hidden()
    files = turn.get_by_role("list", name="Attached files")
    image_shown(files.get_by_role("img", name="red square.png"))
    expect(files.locator(".file-link.document .file-name")).to_have_text("soup.md")

    session: str = page.evaluate("window.agentUI.sessionId")
    parts = stored_user_parts(files_server, session)
    assert [p["type"] for p in parts] == ["image", "document", "text"], parts
    file_id = parts[0]["file_id"]
    with httpx.Client(base_url=files_server.base_url, timeout=10) as http:
        # what an <img src> would get: the page has to send its key
        assert http.get(f"/v1/files/{file_id}/content").status_code == 401
        content = http.get(f"/v1/files/{file_id}/content", headers=client())
        assert content.content == picture

    page.reload()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    files = turn.get_by_role("list", name="Attached files")
    image_shown(files.get_by_role("img", name="red square.png"))
    expect(files.locator(".file-link.document .file-name")).to_have_text("soup.md")
    expect(files.locator(".file-link.document .file-about")).to_have_text(
        f"Markdown, {len(recipe)} bytes"
    )
    expect(turn.locator(".msg.user .bubble")).to_have_text("Is this the colour of the soup?")
    screenshot(page, "attachments-sent")


def test_paste_an_image_and_regenerate_with_it(page: Page, files_server: Server) -> None:
    page.goto(files_server.base_url)
    sent = uploads(page)
    picture = png(40, 40, (40, 120, 220))
    default = dispatch(page, "#prompt", "paste", ("image.png", "image/png", picture))
    assert default is False  # the page took the picture: nothing pasted as text
    item = tray(page).get_by_role("listitem")
    expect(item).to_have_attribute("data-status", "ready")
    assert len(sent) == 1
    expect(prompt_box(page)).to_have_value("")
    # a picture alone is a message
    prompt_box(page).press("Enter")
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_contain_text(short_hash(picture))
    image_shown(turn.get_by_role("img", name="image.png"))
    expect(turn.locator(".msg.user .bubble")).to_be_hidden()
    # the conversation is titled by the file
    expect(page.get_by_role("heading", level=1)).to_have_text("image.png")

    # Regenerate sends the turn's picture again, by its id: nothing is uploaded twice
    first_run = turn.get_attribute("data-run-id")
    turn.get_by_role("button", name="Regenerate the answer").click()
    expect(last_turn(page)).not_to_have_attribute("data-run-id", first_run or "")
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_contain_text(short_hash(picture))
    image_shown(turn.get_by_role("img", name="image.png"))
    expect(page.locator("#log > .turn")).to_have_count(1)
    assert len(sent) == 1
    session: str = page.evaluate("window.agentUI.sessionId")
    # both branches keep the turn: the picture twice, the same stored file
    parts = stored_user_parts(files_server, session)
    assert [p["type"] for p in parts] == ["image", "image"], parts
    assert parts[0]["file_id"] == parts[1]["file_id"]


def test_a_reload_mid_run_keeps_the_turns_picture(page: Page, files_server: Server) -> None:
    """The live turn kept for a reload (sessionStorage) holds its files: the page draws it
    again with its picture, fetched with the key, and follows the run to its end."""
    page.goto(files_server.base_url)
    picture = png(32, 32, (30, 160, 90))
    attach_by_button(page, file_payload("green.png", "image/png", picture))
    expect(tray(page).get_by_role("listitem")).to_have_attribute("data-status", "ready")
    prompt_box(page).fill("slow " + " ".join(f"w{i}" for i in range(1, 30)))
    prompt_box(page).press("Enter")
    wait_for_words(page, 4)
    saved = page.evaluate("JSON.parse(sessionStorage.getItem('agent-ui.active-run'))")
    assert [a["filename"] for a in saved["turn"]["attachments"]] == ["green.png"]
    page.reload()
    turn = last_turn(page)
    image_shown(turn.get_by_role("img", name="green.png"))
    expect(turn).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_contain_text(short_hash(picture))
    expect(page.locator("#log > .turn")).to_have_count(1)


def test_drop_documents_and_open_one(page: Page, files_server: Server) -> None:
    page.goto(files_server.base_url)
    hostile = "<img src=x onerror=window.__pwned=1>.md"
    notes = b"# Notes\n\nThree things to remember.\n"
    dispatch(
        page,
        "#composer",
        "drop",
        (hostile, "text/markdown", notes),
        ("data.csv", "text/csv", b"a,b\n1,2\n"),
    )
    items = tray(page).get_by_role("listitem")
    expect(items).to_have_count(2)
    expect(items.nth(0)).to_have_attribute("data-status", "ready")
    expect(items.nth(1)).to_have_attribute("data-status", "ready")
    expect(page.locator("#composer-wrap")).to_have_attribute("data-dragging", "false")
    # the name is text, never markup
    expect(items.nth(0).locator(".attachment-name")).to_have_text(hostile)

    # Remove by keyboard: focus goes to the file left
    remove = items.nth(1).get_by_role("button", name="Remove data.csv")
    remove.focus()
    page.keyboard.press("Enter")
    expect(items).to_have_count(1)
    expect(items.nth(0).get_by_role("button", name=f"Remove {hostile}")).to_be_focused()

    prompt_box(page).fill("Summarise my notes")
    prompt_box(page).press("Enter")
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    expect(answer(page)).to_contain_text(short_hash(notes))
    chips = turn.get_by_role("list", name="Attached files").get_by_role("link")
    expect(chips).to_have_count(1)
    chip = chips.first
    expect(chip.locator(".file-name")).to_have_text(hostile)
    expect(chip.locator(".file-about")).to_have_text(f"Markdown, {len(notes)} bytes")
    assert turn.locator(".turn-files img").count() == 0
    assert page.evaluate("window.__pwned") is None

    session: str = page.evaluate("window.agentUI.sessionId")
    parts = stored_user_parts(files_server, session)
    assert [p["type"] for p in parts if p["type"] != "text"] == ["document"], parts

    # the chip opens the stored file, fetched with the key
    with page.context.expect_page() as opened:
        chip.click()
    tab = opened.value
    tab.wait_for_load_state()
    assert tab.url.startswith("blob:")
    assert "Three things to remember." in tab.locator("body").inner_text()
    tab.close()


# --- refusals --------------------------------------------------------------------------------


def test_the_page_refuses_what_the_server_would(page: Page, files_server: Server) -> None:
    page.goto(files_server.base_url)
    sent = uploads(page)
    message = page.locator("#attach-message")
    # the limit is the server's (AGENT_MAX_FILE_BYTES), not the default
    big = png(8, 8, (0, 0, 0)) + b"\x00" * MAX_FILE_BYTES
    attach_by_button(page, file_payload("huge.png", "image/png", big))
    expect(message).to_be_visible()
    expect(message).to_contain_text(f"“huge.png” is {len(big):,} bytes")
    expect(message).to_contain_text(f"up to {MAX_FILE_BYTES:,} bytes")
    attach_by_button(page, file_payload("tool.exe", "application/x-msdownload", b"MZ\x90\x00"))
    expect(message).to_contain_text("“tool.exe” cannot be attached")
    expect(message).not_to_contain_text("huge.png")
    # several at once: each refusal on a line of its own, the file that fits attached
    dispatch(
        page,
        "#composer",
        "drop",
        ("archive.zip", "application/zip", b"PK\x03\x04"),
        ("huge.png", "image/png", big),
        ("empty.txt", "text/plain", b""),
    )
    expect(message).to_have_text(
        "“archive.zip” cannot be attached: only images (PNG, JPEG, GIF, WebP), PDF and text"
        " files (.txt, .md, .csv) can.\n"
        f"“huge.png” is {len(big):,} bytes: the server takes files up to"
        f" {MAX_FILE_BYTES:,} bytes.\n"
        "“empty.txt” is empty."
    )
    expect(tray(page)).to_be_hidden()
    screenshot(page, "attachments-refused")
    assert sent == []

    # each file fits, but a message's files together may not pass the server's bound
    text = b"lorem ipsum " * 3500
    attach_by_button(page, file_payload("one.txt", "text/plain", text))
    expect(tray(page).get_by_role("listitem")).to_have_attribute("data-status", "ready")
    attach_by_button(page, file_payload("two.txt", "text/plain", text))
    expect(message).to_have_text(
        "“two.txt” was not attached: a message's files may come to 64 KB together, and these"
        " would be 82 KB."
    )
    expect(tray(page).get_by_role("listitem")).to_have_count(1)
    assert len(sent) == 1


def test_a_server_refusal_is_shown(page: Page, files_server: Server) -> None:
    page.goto(files_server.base_url)
    sent = uploads(page)
    # named and typed as a PNG, but its bytes are text: only the server can tell
    attach_by_button(page, file_payload("fake.png", "image/png", b"not a picture at all\n"))
    message = page.locator("#attach-message")
    expect(message).to_contain_text("“fake.png” was not attached:")
    expect(tray(page).get_by_role("listitem")).to_have_count(0)
    assert len(sent) == 1
    refusal = sent[0].response()
    assert refusal is not None and refusal.status == 415
    detail = refusal.json()["detail"]
    expect(message).to_contain_text(detail.rstrip("."))
    # nothing to send: the message box is as it was
    expect(prompt_box(page)).to_have_value("")


def test_an_upload_without_a_key_asks_for_one(
    context: BrowserContext, files_server: Server
) -> None:
    page = next(new_page(context))
    page.goto(files_server.base_url)
    attach_by_button(page, file_payload("dot.png", "image/png", png(4, 4, (9, 9, 9))))
    key_dialog = page.get_by_role("dialog", name="API key")
    expect(key_dialog).to_be_visible()
    expect(page.locator("#attach-message")).to_contain_text("the server needs an API key")
    key_dialog.get_by_label("API key").fill(API_KEY)
    key_dialog.get_by_role("button", name="Save").click()
    attach_by_button(page, file_payload("dot.png", "image/png", png(4, 4, (9, 9, 9))))
    expect(tray(page).get_by_role("listitem")).to_have_attribute("data-status", "ready")
