"""The recipes a new user copies first work as written.

- docs/configuration.md starts with ``docs/examples/starter.toml``, which serves offline: a
  server started with it, with no keys and no way off the machine, completes a run;
- README.md's "Use your own model" commands serve a model over the OpenAI and Anthropic wires:
  their settings, taken from the page, start a server against the fake upstream on loopback
  (the address of the model's server being the one thing the test changes).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Text
from tests.support.docs import ROOT, Block, blocks_of
from tests.support.server import AGENT_SERVER, Server, launch

pytestmark = pytest.mark.e2e

STARTER = ROOT / "docs" / "examples" / "starter.toml"
NOWHERE = "http://127.0.0.1:9"  # the discard port: a request off the machine fails at once
OFFLINE = {
    "HTTP_PROXY": NOWHERE,
    "HTTPS_PROXY": NOWHERE,
    "ALL_PROXY": NOWHERE,
    "NO_PROXY": "127.0.0.1,localhost",
    "OPENAI_API_KEY": "",
    "ANTHROPIC_API_KEY": "",
}


def commands(block: Block) -> list[str]:
    """The shell commands of a block, ``\\`` continuations joined, ``$ `` prompts removed."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    return [
        line.removeprefix("$ ").strip()
        for line in joined.splitlines()
        if line.strip() and not line.startswith(("#", " "))
    ]


def settings_of(command: str) -> dict[str, str]:
    """The ``NAME=value`` settings that lead a command."""
    found: dict[str, str] = {}
    for word in shlex.split(command):
        name, sep, value = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            break
        found[name] = value
    return found


def readme_command(naming: str) -> str:
    """The README's ``uv run agent-server`` command that sets ``naming``."""
    found = [
        command
        for block in blocks_of(ROOT / "README.md")
        if block.language == "bash"
        for command in commands(block)
        if naming in settings_of(command) and command.endswith("uv run agent-server")
    ]
    assert len(found) == 1, f"README.md should show one command that sets {naming}: {found}"
    return found[0]


def completed_run(server: Server, text: str) -> dict[str, object]:
    answer = httpx.post(
        f"{server.base_url}/v1/sessions/docs-1/runs",
        json={"input": text, "stream": False},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    run: dict[str, object] = answer.json()
    assert run["status"] == "completed", run
    return run


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread(default=Text("Hello from your model.")) as fake:
        yield fake


# the starter configuration --------------------------------------------------------------------


def test_the_configuration_page_starts_with_the_starter_file() -> None:
    first = blocks_of(ROOT / "docs" / "configuration.md")[0]
    assert commands(first)[0] == "AGENT_CONFIG=docs/examples/starter.toml uv run agent-server"


def test_the_starter_configuration_has_a_tool_of_the_repository_and_no_servers() -> None:
    from app.agents.build import load_config

    config = load_config(str(STARTER))
    default = config.agents["default"]
    assert default.model == "demo"
    assert "word_count" in [t.name for t in default.tools]
    assert not config.mcp_servers and not default.mcp_servers


def test_the_starter_configuration_serves_offline(tmp_path: Path) -> None:
    server = launch(tmp_path, {**OFFLINE, "AGENT_CONFIG": str(STARTER)})
    try:
        run = completed_run(server, "what time is it?")
        output = run["output"]
        assert isinstance(output, dict)
        assert str(output["content"]).startswith("The time is ")  # current_time ran
        agents = httpx.get(f"{server.base_url}/v1/agents", timeout=10).json()["agents"]
        assert [(a["name"], a["model"], a["ready"]) for a in agents] == [("default", "demo", True)]
    finally:
        server.stop()


# your own model -----------------------------------------------------------------------------------


def test_the_openai_compatible_recipe_serves_the_model(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    settings = settings_of(readme_command("OPENAI_BASE_URL"))
    assert settings["OPENAI_BASE_URL"] == "http://127.0.0.1:8080/v1"  # the local server's
    settings["OPENAI_BASE_URL"] = upstream.openai_url
    server = launch(tmp_path, {**OFFLINE, **settings})
    try:
        run = completed_run(server, "hello")
    finally:
        server.stop()
    model = settings["AGENT_MODEL"].removeprefix("openai:")
    assert run["output"] == {"content": "Hello from your model."}
    assert isinstance(run["usage"], dict) and run["usage"]["model"] == model
    # the warm-up and the run, each with the model's name and the key the page sets
    assert len(upstream.requests) >= 2
    assert {(r.path, r.model, r.api_key) for r in upstream.requests} == {
        ("/v1/chat/completions", model, settings["OPENAI_API_KEY"])
    }


def test_the_openai_compatible_recipe_without_a_key_says_so(tmp_path: Path) -> None:
    settings = settings_of(readme_command("OPENAI_BASE_URL"))
    del settings["OPENAI_API_KEY"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "OPENAI_"))}
    done = subprocess.run(
        [str(AGENT_SERVER), "--port", "0"],
        env={**env, **settings, "AGENT_DATABASE_URL": f"sqlite:///{tmp_path}/agent.db"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot start" in done.stderr and "set OPENAI_API_KEY" in done.stderr


def test_the_anthropic_recipe_serves_the_model(tmp_path: Path, upstream: FakeUpstream) -> None:
    settings = settings_of(readme_command("ANTHROPIC_API_KEY"))
    # the one setting the page leaves to its default, api.anthropic.com
    server = launch(tmp_path, {**OFFLINE, **settings, "ANTHROPIC_BASE_URL": upstream.anthropic_url})
    try:
        run = completed_run(server, "hello")
    finally:
        server.stop()
    model = settings["AGENT_MODEL"].removeprefix("anthropic:")
    assert run["output"] == {"content": "Hello from your model."}
    assert {(r.path, r.model, r.api_key) for r in upstream.requests} == {
        ("/v1/messages", model, settings["ANTHROPIC_API_KEY"])
    }
