"""Every fenced block of README.md and docs/*.md runs, parses, or is marked a fragment.

The convention (docs/architecture.md, "Code blocks in the docs"): a block is a *fragment* when
the line right before its opening fence is ``<!-- fragment -->`` or ``<!-- fragment: why -->``
(GitHub shows neither). Every other block is checked by its language:

- ``python``: a program of its own, run in a subprocess, offline (proxies point nowhere, no
  provider keys), which must exit 0; ``127.0.0.1:8000`` and ``localhost:8000`` are a demo
  server the test starts. The blocks docs/capabilities.md sends to the fake upstream run in
  ``tests/test_docs_capabilities.py`` instead;
- ``console``: a transcript. A page's transcripts run in order against one fresh demo server
  (``uv run agent-server``'s defaults), each ``$`` command with ``curl``, and the output shown
  must be what the server answers, ids, times and dates aside;
- ``json`` parses (one document, or one per line), ``yaml`` parses, ``toml`` parses and, when
  it defines agents, loads with the service's own reader (``app.agents.build.load_config``);
- ``text``: output, diagrams and layouts, with nothing to run.

A block in any other language (``bash``, ``js``, ...) or with none must be a fragment. A Python
fragment must still compile (top-level ``await`` allowed).
"""

from __future__ import annotations

import ast
import copy
import difflib
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support.docs import CAPABILITY_BLOCKS, ROOT, Block, blocks_of
from tests.support.local_models import MISSING as LOCAL_MODELS_MISSING
from tests.support.server import Server, launch

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHECKED = frozenset({"python", "console", "json", "yaml", "toml", "text"})
EXAMPLE = re.compile(r"\bfrom examples/(?P<file>[\w.]+\.py)\b")
DOCS_ADDRESS = re.compile(r"(?:127\.0\.0\.1|localhost):8000")
RUN_TIMEOUT = 60


ALL = [block for page in PAGES for block in blocks_of(page)]


def checked(*languages: str) -> list[Block]:
    return [b for b in ALL if b.language in languages and not b.fragment]


def params(blocks: list[Block]) -> list[object]:
    return [pytest.param(block, id=block.name) for block in blocks]


# the convention ---------------------------------------------------------------------------------


def test_the_parser_sees_markers_languages_and_indented_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- fragment: needs a key -->\n```python\nx = 1\n```\n\n"
        "- item:\n\n  ```text\n  indented\n  ```\n\n````json\n{}\n````\n",
        encoding="utf-8",
    )
    found = [(b.language, b.fragment, b.text, b.line) for b in blocks_of(page, tmp_path)]
    assert found == [
        ("python", True, "x = 1\n", 4),
        ("text", False, "indented\n", 10),
        ("json", False, "{}\n", 14),
    ]


def test_every_block_is_checked_or_a_fragment() -> None:
    assert len(ALL) > 100  # the parser found the docs' blocks
    loose = [
        f"{b.name} ({b.language or 'no language'})"
        for b in ALL
        if not b.fragment and b.language not in CHECKED
    ]
    assert not loose, (
        "mark these blocks <!-- fragment: why --> on the line before the fence, or give them a "
        f"language the test checks ({', '.join(sorted(CHECKED))}): {loose}"
    )


@pytest.mark.parametrize("block", params([b for b in ALL if b.fragment and b.language == "python"]))
def test_a_python_fragment_compiles(block: Block) -> None:
    compile(block.text, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_a_fragment_from_an_example_is_the_examples_own_text() -> None:
    # "<!-- fragment: from examples/NAME.py -->": the page shows part of a program the tests
    # run, and must show it as it is there
    quoted = [(b, EXAMPLE.search(b.why or "")) for b in ALL if b.fragment]
    stale = [
        f"{b.name} (examples/{m['file']})"
        for b, m in quoted
        if m is not None
        and b.text not in (ROOT / "docs" / "examples" / m["file"]).read_text(encoding="utf-8")
    ]
    assert any(m for _, m in quoted)
    assert not stale, f"these blocks differ from the examples they quote: {stale}"


# python -------------------------------------------------------------------------------------------


def offline_env() -> dict[str, str]:
    """The environment of a reader's program: no provider keys, no way off the machine."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENT_", "OPENAI_", "ANTHROPIC_"))
        and k.lower() not in {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
    }
    nowhere = "http://127.0.0.1:9"  # the discard port: a request off the machine fails at once
    env.update(
        HTTP_PROXY=nowhere, HTTPS_PROXY=nowhere, ALL_PROXY=nowhere, NO_PROXY="127.0.0.1,localhost"
    )
    return env


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(tmp_path_factory.mktemp("demo-server"), {})
    try:
        yield server
    finally:
        server.stop()


PROGRAMS = [b for b in checked("python") if b.text not in CAPABILITY_BLOCKS]


@pytest.mark.parametrize("block", params(PROGRAMS))
def test_a_python_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    source = block.text
    if DOCS_ADDRESS.search(source):
        server: Server = request.getfixturevalue("demo_server")
        source = DOCS_ADDRESS.sub(f"127.0.0.1:{server.port}", source)
    program = tmp_path / "block.py"
    program.write_text(source, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{block.name} failed:\n{done.stderr}"


def test_the_capability_examples_run_elsewhere() -> None:
    # tests/test_docs_capabilities.py runs these against the fake upstream; if it stopped
    # seeing one, this test would have to run it
    page = [b for b in checked("python") if b.page == "docs/capabilities.md"]
    assert page and all(b.text in CAPABILITY_BLOCKS for b in page)


# data ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", params(checked("json")))
def test_a_json_block_parses(block: Block) -> None:
    try:
        json.loads(block.text)
    except json.JSONDecodeError:
        for line in filter(None, (line.strip() for line in block.text.splitlines())):
            json.loads(line)  # JSON lines: one document each


@pytest.mark.parametrize("block", params(checked("yaml")))
def test_a_yaml_block_parses(block: Block) -> None:
    assert list(yaml.safe_load_all(block.text))


@pytest.mark.parametrize("block", params(checked("toml")))
def test_a_toml_block_parses_and_its_agents_load(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.agents.build import load_config

    data = tomllib.loads(block.text)
    if "agents" not in data:
        return
    if LOCAL_MODELS_MISSING is not None and re.search(r'protocol\s*=\s*"local"', block.text):
        pytest.skip(LOCAL_MODELS_MISSING)  # loading checks an in-process model is installed
    # a whole file of docs/examples is loaded where it lies, so its relative paths resolve
    whole = [
        p for p in (ROOT / "docs" / "examples").glob("*.toml") if p.read_text("utf-8") == block.text
    ]
    path = whole[0] if whole else tmp_path / "agents.toml"
    if not whole:
        path.write_text(block.text, encoding="utf-8")
    monkeypatch.setenv("SEARCH_MCP_TOKEN", "placeholder")  # the reference file's one secret
    config = load_config(str(path))
    assert set(data["agents"]) <= set(config.agents)


# transcripts --------------------------------------------------------------------------------------

_IDS = re.compile(r"\b(run|mcall|call)_[0-9a-f]{16,}\b")
_TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
_DATE = re.compile(r"^date: .*$", re.MULTILINE)


@dataclass
class Names:
    """The ids of one transcript, named by kind and order of first appearance."""

    label_of: dict[str, str] = field(default_factory=dict)
    id_of: dict[str, str] = field(default_factory=dict)

    def normalize(self, text: str) -> str:
        def name(match: re.Match[str]) -> str:
            found = match.group(0)
            if found not in self.label_of:
                kind = match.group(1)
                count = sum(label.startswith(f"<{kind} ") for label in self.id_of)
                label = f"<{kind} {count + 1}>"
                self.label_of[found], self.id_of[label] = label, found
            return self.label_of[found]

        text = _DATE.sub("date: <date>", _TIMES.sub("<time>", _IDS.sub(name, text)))
        try:  # a JSON answer the page wraps over lines for reading is the same answer
            return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


@dataclass(frozen=True)
class Step:
    command: str
    output: str


def steps_of(block: Block) -> list[Step]:
    """A transcript's ``$`` commands (``\\`` continues one) with the output shown after each."""
    steps: list[Step] = []
    lines = block.text.splitlines()
    index = 0
    while index < len(lines):
        assert lines[index].startswith("$ "), f"{block.name}: a transcript starts with '$ '"
        command = [lines[index][2:]]
        while command[-1].endswith("\\"):
            index += 1
            command.append(lines[index])
        index += 1
        output: list[str] = []
        while index < len(lines) and not lines[index].startswith("$ "):
            output.append(lines[index])
            index += 1
        steps.append(Step("\n".join(command), "\n".join(output)))
    return steps


def _reads_only(command: str) -> bool:
    return " -d " not in command and " -X " not in command


def replay(page: str, server: Server) -> list[tuple[Step, str]]:
    """Run a page's transcripts in order; every step with the server's raw answer.

    A command that only reads is asked again for up to 10 s until its answer matches: the run it
    reads may not have reached the state the page shows yet.
    """
    shown, actual = Names(), Names()
    answers: list[tuple[Step, str]] = []
    for block in [b for b in checked("console") if b.page == page]:
        for step in steps_of(block):
            command = DOCS_ADDRESS.sub(f"127.0.0.1:{server.port}", step.command)
            for found in {match.group(0) for match in _IDS.finditer(command)}:
                # an id the page showed earlier stands for the one the server made
                command = command.replace(found, actual.id_of[shown.label_of[found]])
            expected = shown.normalize(step.output)
            deadline = time.monotonic() + 10
            while True:
                done = subprocess.run(
                    ["bash", "-c", command],
                    env=offline_env(),
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                attempt = copy.deepcopy(actual)
                got = attempt.normalize(done.stdout)
                if got == expected or not _reads_only(step.command) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            actual = attempt
            answers.append((step, done.stdout))
            assert got == expected, (
                f"{block.name}: `{step.command}` answers otherwise:\n"
                + "\n".join(
                    difflib.unified_diff(
                        expected.splitlines(), got.splitlines(), "page", "server", lineterm=""
                    )
                )
                + f"\n\nthe server's answer:\n{done.stdout}"
            )
    return answers


TRANSCRIPT_PAGES = sorted({b.page for b in checked("console")})


@pytest.mark.e2e
@pytest.mark.parametrize("page", TRANSCRIPT_PAGES)
def test_a_transcript_is_what_the_server_answers(page: str, tmp_path: Path) -> None:
    # the defaults of `uv run agent-server`, which the test servers otherwise speed up
    server = launch(tmp_path, {"AGENT_DEMO_TOKEN_DELAY": "0.02", "AGENT_DEMO_SLOW_SECONDS": "5"})
    try:
        assert replay(page, server)
    finally:
        server.stop()
