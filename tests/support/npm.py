"""The npm packages the tests drive (tests/js: the protocols' official clients, the reference MCP
server, the UI's vendored modules), pinned by tests/js/package-lock.json.

A test that needs them calls ``node()``: the ``node`` executable, once the pinned packages are
installed (``npm ci --prefix tests/js``) if they were not. The install runs once per test run:
the pytest-xdist workers take turns on an exclusive lock, the first one installs, and the others
then find the packages in place, or find the first one's failure, which they report without
trying again.

Without Node.js (or without npm while the packages are missing) the test is skipped, saying
what to install; an install that fails fails the test, with npm's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Literal

import pytest

__all__ = ["JS", "NODE_MODULES", "NODE_REQUIRED", "NpmPackages", "Outcome", "node"]

JS = Path(__file__).resolve().parents[1] / "js"
NODE_MODULES = JS / "node_modules"

#: what ``NpmPackages.prepare`` found: ("ready", node's path), or ("skip" | "fail", why)
Outcome = tuple[Literal["ready", "skip", "fail"], str]

# within the 120 s a test may take: a slower install is better run by hand, before the tests
_INSTALL_TIMEOUT = 90


class NpmPackages:
    """The packages pinned by ``directory``'s package.json and package-lock.json."""

    def __init__(self, directory: Path, lock: Path | None = None) -> None:
        self.directory = directory
        self.package: dict[str, Any] = json.loads(
            (directory / "package.json").read_text(encoding="utf-8")
        )
        # outside the directory (npm ci replaces node_modules whole, so a lock file in it could
        # be deleted while held); one per directory
        digest = hashlib.sha256(str(directory).encode()).hexdigest()[:16]
        self._lock = lock or Path(tempfile.gettempdir()) / f"agent-runtime-npm-{digest}.lock"
        self._outcome: Outcome | None = None

    @property
    def install_command(self) -> str:
        return f"npm ci --prefix {self.directory} --no-audit --no-fund"

    def missing(self) -> list[str]:
        """The packages of package.json that are not installed at their pinned version."""
        modules = self.directory / "node_modules"
        # npm writes its hidden lock file last: without it, an install was cut short
        complete = (modules / ".package-lock.json").is_file()
        missing = []
        for name, version in self.package["dependencies"].items():
            try:
                manifest = json.loads((modules / name / "package.json").read_text("utf-8"))
            except (OSError, ValueError):
                manifest = {}
            if not complete or manifest.get("version") != version:
                missing.append(f"{name}@{version}")
        return missing

    def node(self) -> str:
        """The path of ``node``, with the packages installed; else skips or fails the test."""
        verdict, detail = self.prepare()
        if verdict == "skip":
            pytest.skip(detail)
        if verdict == "fail":
            pytest.fail(detail, pytrace=False)
        return detail

    def prepare(self) -> Outcome:
        """Install the packages if they are missing (once per test run); what came of it."""
        if self._outcome is None:
            self._outcome = self._prepare()
        return self._outcome

    def _prepare(self) -> Outcome:
        executable = shutil.which("node")
        if executable is None:
            return "skip", (
                f"Node.js is not installed: the tests of the npm packages in {self.directory} "
                f"need Node {self.package['engines']['node']} and npm (https://nodejs.org)"
            )
        if not self.missing():
            return "ready", executable
        # the pytest-xdist run this process is a worker of: a failed install is not tried again
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
        with self._lock.open("a+", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not self.missing():
                    return "ready", executable
                lock.seek(0)
                earlier_run, _, earlier_failure = lock.read().partition("\n")
                if run and earlier_run == run and earlier_failure:
                    return "fail", earlier_failure
                verdict, detail = self._install()
                if verdict == "fail":
                    lock.seek(0)
                    lock.truncate()
                    lock.write(f"{run}\n{detail}")
                    lock.flush()
                return (verdict, executable) if verdict == "ready" else (verdict, detail)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _install(self) -> Outcome:
        missing = self.missing()
        npm = shutil.which("npm")
        if npm is None:
            return "skip", (
                f"npm is not installed, and the packages the test drives are not either "
                f"({', '.join(missing)}): install npm, or run `{self.install_command}`"
            )
        command = [npm, "ci", "--prefix", str(self.directory), "--no-audit", "--no-fund"]
        try:
            done = subprocess.run(
                [*command, "--loglevel=error"],
                capture_output=True,
                text=True,
                timeout=_INSTALL_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "fail", (
                f"`{self.install_command}` (for {', '.join(missing)}) took over "
                f"{_INSTALL_TIMEOUT} s: run it before the tests"
            )
        still = self.missing()
        if done.returncode != 0 or still:
            return "fail", (
                f"`{self.install_command}` failed (exit status {done.returncode}); still "
                f"missing: {', '.join(still) or 'nothing'}\n{done.stderr}{done.stdout}"
            )
        return "ready", ""


_CLIENTS = NpmPackages(JS)
#: the Node.js versions the pinned packages declare (tests/js/package.json's ``engines``)
NODE_REQUIRED: str = _CLIENTS.package["engines"]["node"]


def node() -> str:
    """``node``, with tests/js's pinned packages installed; else skips or fails the test."""
    return _CLIENTS.node()
