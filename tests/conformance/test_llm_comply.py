"""``llm-comply`` (PyPI, pinned in the ``conformance`` group): the Open Responses and the Chat
Completions compliance suites, run as their CLI runs them, against a real server.

Every case the service claims passes; the cases it does not claim (docs/protocols.md, "What the
suites check") may fail or skip, and nothing else may.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Server, launch

KEY = "sk-comply"
LLM_COMPLY = Path(sys.executable).with_name("llm-comply")

# format -> the cases not claimed, and why (docs/protocols.md says the same)
NOT_CLAIMED: dict[str, dict[str, str]] = {
    "open-responses": {
        "tool-calling": "tools defined by the client: the agent's own tools run on the server",
        "image-input": "an image in the input",
        "reasoning-summary": "reasoning output (the suite skips it for a non-reasoning model)",
    },
    "openai-chat": {
        "chat-tool-calling": "tools defined by the client",
        "chat-image-input": "an image in the input",
        "chat-reasoning-summary": "reasoning output (skipped for a non-reasoning model)",
    },
}
# the cases each format has (llm-comply 0.5.0): a new case in a new version is noticed here
CASES: dict[str, set[str]] = {
    "open-responses": {
        "basic-response",
        "system-prompt",
        "multi-turn",
        "tool-calling",
        "streaming-response",
        "streaming-usage",
        "image-input",
        "assistant-phase",
        "response-output-phase-schema",
        "compact-response",
        "compact-missing-model",
        "reasoning-summary",
        "error-handling",
    },
    "openai-chat": {
        "chat-basic-response",
        "chat-system-prompt",
        "chat-multi-turn",
        "chat-tool-calling",
        "chat-streaming-response",
        "chat-streaming-usage",
        "chat-image-input",
        "chat-reasoning-summary",
        "chat-error-handling",
    },
}


@pytest.fixture(scope="module")
def comply_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not LLM_COMPLY.exists() and shutil.which("llm-comply") is None:
        pytest.skip("llm-comply is not installed: uv sync --group conformance")
    server = launch(tmp_path_factory.mktemp("comply"), {"AGENT_API_KEYS": f"{KEY}=alice"})
    yield server
    server.stop()


def _run(server: Server, form: str) -> dict[str, Any]:
    command = str(LLM_COMPLY) if LLM_COMPLY.exists() else "llm-comply"
    done = subprocess.run(
        [
            command,
            "--format",
            form,
            "--base-url",
            f"{server.base_url}/openai/v1",
            "--api-key",
            KEY,
            "--model",
            "default",
            "--timeout",
            "30",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize("form", ["open-responses", "openai-chat"])
def test_every_claimed_case_passes(comply_server: Server, form: str) -> None:
    report = _run(comply_server, form)
    results = {result["id"]: result for result in report["results"]}
    assert set(results) == CASES[form]
    failed = {
        case: result.get("errors")
        for case, result in results.items()
        if result["status"] != "passed" and case not in NOT_CLAIMED[form]
    }
    assert failed == {}
    claimed = CASES[form] - set(NOT_CLAIMED[form])
    assert {case for case, r in results.items() if r["status"] == "passed"} >= claimed
