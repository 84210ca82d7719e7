"""Helpers for the browser tests: Debian's Chromium driven by Playwright, screenshots into
docs/images/, and a TCP proxy whose connections a test can cut (a real network drop).

Playwright never downloads a browser here: the tests use ``/usr/bin/chromium`` (Debian's
``chromium`` package; ``.ci/run`` installs it) and are skipped, saying so, without it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Browser, Page, Playwright
except ImportError:
    pytest.skip(
        "playwright is not installed (the browser group): uv run --group browser pytest",
        allow_module_level=True,
    )

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "SCREENSHOTS",
    "DroppableProxy",
    "launch_chromium",
    "overview_screenshot",
    "screenshot",
    "skip_reason",
]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Screenshots go to a scratch folder, so a test run leaves the checkout clean; to refresh the
# pictures docs/ui.md and README.md show, run the browser tests with UI_SCREENSHOT_DIR=docs/images.
SCREENSHOTS = Path(
    os.environ.get("UI_SCREENSHOT_DIR", Path(tempfile.gettempdir()) / "agent-ui-screenshots")
)


def skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return (
            f"{CHROMIUM} is missing: install Debian's chromium package "
            "(apt-get install chromium) to run the browser tests"
        )
    return None


def launch_chromium(playwright: Playwright) -> Browser:
    """Headless Debian Chromium."""
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
    )


def screenshot(page: Page, name: str) -> Path:
    """Save ``docs/images/ui-<name>.png`` (animations settled, caret hidden)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"ui-{name}.png"
    page.screenshot(path=str(path), animations="disabled", caret="hide")
    return path


def overview_screenshot(page: Page) -> Path:
    """Save ``docs/images/ui.png``, the picture of the UI that README.md shows."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / "ui.png"
    page.screenshot(path=str(path), animations="disabled", caret="hide")
    return path


class DroppableProxy:
    """A loopback TCP proxy to ``target_port``; ``drop()`` cuts every open connection.

    The browser talks to the server through it, so a test can break a streaming response
    the way a flaky network does (Chromium's offline emulation leaves open streams alone).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self.refusing = False
        self._thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self.refusing:  # the network is down: connections fail at once
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            self._forget(source)
            self._forget(sink)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def drop(self) -> int:
        """Cut every open connection; how many were cut. New ones are accepted unless
        ``refusing`` is set."""
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        return len(sockets) // 2

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        self.drop()
        self._thread.join(5)
