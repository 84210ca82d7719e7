"""A directory served over loopback HTTP: a page of another origin than the service's, as a
browser app built apart from it is."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["serve_directory"]


class _Files(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test's output is the server's log, not every file fetched."""


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve ``directory``'s files on a free loopback port; yields the site's origin."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Files, directory=str(directory)))
    thread = threading.Thread(target=httpd.serve_forever, name="static-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
