"""Every program under docs/examples runs and exits cleanly, as a reader would run it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import npm as npm_clients
from tests.support.local_models import needs_local_models

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "docs" / "examples").glob("*.py"))
# custom_tools checks agents.toml, whose in-process embedding model must be installed
NEED_LOCAL_MODELS = {"custom_tools"}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p, id=p.stem, marks=[needs_local_models] if p.stem in NEED_LOCAL_MODELS else []
        )
        for p in EXAMPLES
    ],
)
def test_example_runs(path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip(), "an example should say what it did"


def test_cancellation_example_output() -> None:
    path = next(p for p in EXAMPLES if p.stem == "cancellation")
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "run cancelled, extension state released" in out
    assert "next run: Second time lucky" in out


def _output(stem: str) -> str:
    path = next(p for p in EXAMPLES if p.stem == stem)
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout


def test_skills_example_output() -> None:
    out = _output("skills")
    assert "skills: code-review (0 file(s)), release-notes (1 file(s))" in out
    assert "tool publish: error: tool 'publish' is not available while skill(s)" in out
    assert "advertised while active: current_time, load_skill, read_skill_resource" in out
    assert "dispatched: [{'skill': 'code-review'}]" in out
    assert "pipeline output: - Fixed empty lists." in out


def test_structured_output_example_output() -> None:
    out = _output("structured_output")
    assert "invoice: number='INV-7' total=120.5 paid=True" in out
    assert "total: Field required" in out
    assert "weather: {'city': 'Oslo', 'celsius': -3}" in out
    assert "gave up after 3 attempts: invalid_output" in out


def test_content_parts_example_output() -> None:
    out = _output("content_parts")
    assert "You said: What are these? I received an image (image/png, 69 bytes, sha256 " in out
    assert "I received a document (application/pdf, 69 bytes, sha256 " in out
    assert 'stored as: {"type": "image", "ref": "sha256:' in out and "base64" not in out
    assert "bytes kept: 69" in out
    assert "text-only binding: unsupported_content: model 'demo' cannot take an image" in out


JS_EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "docs" / "examples").glob("*.mjs"))


@pytest.mark.e2e
@pytest.mark.parametrize("path", JS_EXAMPLES, ids=[p.stem for p in JS_EXAMPLES])
def test_js_example_runs(path: Path, tmp_path: Path) -> None:
    """The front-end examples run with the official clients (tests/js) against a real server."""
    from tests.support.server import launch

    node = npm_clients.node()
    server = launch(tmp_path / "server", {})
    # run where tests/js's node_modules resolve the clients' imports, as a reader's project
    # would with the packages installed
    where = npm_clients.JS / ".examples"
    where.mkdir(exist_ok=True)
    copy = where / path.name
    shutil.copyfile(path, copy)
    try:
        completed = subprocess.run(
            [node, str(copy)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "AGENT_URL": server.base_url},
        )
    finally:
        copy.unlink(missing_ok=True)
        server.stop()
    assert completed.returncode == 0, completed.stderr
    assert "Deleted draft.txt" in completed.stdout, completed.stdout


def test_verify_webhook_example_output() -> None:
    out = _output("verify_webhook")
    assert "first delivery: run.completed for run_0123" in out
    assert "its retry: duplicate, ignored" in out
    assert "tampered body: no matching signature" in out


def test_verify_webhook_example_accepts_the_reference_signature() -> None:
    # the docs' verifier agrees with the Standard Webhooks reference library
    import base64
    import importlib.util
    from datetime import UTC, datetime

    from standardwebhooks.webhooks import Webhook

    path = next(p for p in EXAMPLES if p.stem == "verify_webhook")
    spec = importlib.util.spec_from_file_location("verify_webhook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    secret = "whsec_" + base64.b64encode(b"x" * 32).decode()
    body = '{"type":"run.failed","data":{"run_id":"run_1"}}'
    now = datetime.now(UTC)
    headers = {
        "webhook-id": "msg_2",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign("msg_2", now, body),
    }
    assert module.verify(secret, headers, body.encode())["type"] == "run.failed"
