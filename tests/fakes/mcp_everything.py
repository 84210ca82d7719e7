"""The reference MCP server, ``@modelcontextprotocol/server-everything`` (TypeScript SDK), as a
process on a loopback port, for tests that need a stateful streamable-HTTP server: it gives
each session an ``Mcp-Session-Id`` and answers an id it does not know with 400 "Bad Request: No
valid session ID provided". Pinned in tests/js (``tests.support.npm.node()`` installs it and
names the ``node`` that runs it); ``restart()`` replaces the process on the same port, as a
deployment's restart would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["EVERYTHING", "EverythingServer"]

_JS = Path(__file__).resolve().parents[1] / "js"
EVERYTHING = (
    _JS / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EverythingServer:
    """``server-everything streamableHttp`` on 127.0.0.1 (blocking: for sync fixtures)."""

    def __init__(self, node: str, log: Path) -> None:
        self._node = node
        self.port = _free_port()
        self._log = log
        self.process = self._start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _start(self) -> subprocess.Popen[bytes]:
        with self._log.open("ab") as log:
            process = subprocess.Popen(
                [
                    self._node,
                    "--require",
                    str(_JS / "loopback.cjs"),
                    str(EVERYTHING),
                    "streamableHttp",
                ],
                cwd=_JS,
                env={**os.environ, "PORT": str(self.port)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server-everything exited:\n{self._log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return process
            except OSError:
                time.sleep(0.05)
        process.kill()
        raise RuntimeError("server-everything did not listen within 30 s")

    def restart(self) -> None:
        """Stop the server and start a new process on the same port: no session survives."""
        self.close()
        self.process = self._start()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
