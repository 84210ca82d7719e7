"""``agent-server`` as a new user meets it, as a real process started from its console script:
its refusals, its warnings, its warm-up switch and its log format."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream, Text
from tests.support.server import AGENT_SERVER, START_TIMEOUT, launch
from tests.support.waiting import wait_for

UNKNOWN = "unknown setting AGENT_MAX_CONCURENT_RUNS (did you mean AGENT_MAX_CONCURRENT_RUNS?)"


def clean_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """This process's environment without its ``AGENT_*`` variables, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env["AGENT_DATABASE_URL"] = f"sqlite:///{tmp_path}/agent.db"
    env.update(variables)
    return env


def run_cli(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENT_SERVER), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextlib.contextmanager
def port_in_use() -> Iterator[int]:
    """A port another process's socket listens on (this test's)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_several_workers_without_a_shared_bus_are_refused(tmp_path: Path) -> None:
    # each would keep its own runs and session locks: events 404 on the other worker, two
    # turns of one session accepted at once
    done = run_cli(tmp_path, clean_env(tmp_path), "--port", "0", "--workers", "2")
    assert done.returncode == 2, done.stderr
    assert "cannot start: --workers 2 needs a shared bus: set AGENT_REDIS_URL" in done.stderr


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://u:secret@db/agent", "unsupported scheme 'mysql'"),
        ("sqlite://", "'sqlite://' names no SQLite file"),
    ],
)
def test_a_database_url_no_store_takes_is_one_line_and_status_2(
    tmp_path: Path, url: str, said: str
) -> None:
    done = run_cli(tmp_path, clean_env(tmp_path, AGENT_DATABASE_URL=url), "--port", "0")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("agent-server: cannot start: AGENT_DATABASE_URL "), lines
    assert said in lines[-1]
    assert "secret" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_is_one_line_and_status_2(tmp_path: Path, workers: int) -> None:
    env = clean_env(tmp_path, AGENT_ALLOW_UNSHARED_WORKERS="1")
    with port_in_use() as port:
        done = run_cli(tmp_path, env, "--port", str(port), "--workers", str(workers))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == (
        f"agent-server: cannot start: 127.0.0.1:{port} is already in use (another process "
        "listens on it: stop that one, or choose another --port)"
    )
    # said once, and nothing was started: no worker, no log line of uvicorn's
    assert sum("in use" in line for line in lines) == 1
    assert not [line for line in lines if line.startswith("{")], done.stderr


def test_an_unknown_setting_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    env = clean_env(
        tmp_path,
        AGENT_MAX_CONCURENT_RUNS="5",
        AGENT_ZQXJ="1",
        AGENT_LOG_FORMAT="json",
        # known: the agents file refers to it
        AGENT_SEARCH_TOKEN="t",
        AGENT_CONFIG=str(tmp_path / "agents.toml"),
    )
    (tmp_path / "agents.toml").write_text(
        '[agents.default]\nmodel = "demo"\ndescription = "${AGENT_SEARCH_TOKEN}"\n',
        encoding="utf-8",
    )
    with port_in_use() as port:  # the warnings come first; then the start stops, quickly
        done = run_cli(tmp_path, env, "--port", str(port))
    assert done.returncode == 2, done.stderr
    warnings = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [(w["level"], w["logger"], w["msg"]) for w in warnings] == [
        ("warning", "app.settings", UNKNOWN),
        (
            "warning",
            "app.settings",
            "unknown setting AGENT_ZQXJ (no setting has a similar name; docs/api.md lists them)",
        ),
    ]
    assert warnings[0]["variable"] == "AGENT_MAX_CONCURENT_RUNS"
    assert warnings[0]["suggestion"] == "AGENT_MAX_CONCURRENT_RUNS"


async def test_workers_warn_of_an_unknown_setting_once(tmp_path: Path) -> None:
    env = {
        "AGENT_ALLOW_UNSHARED_WORKERS": "1",
        "AGENT_MAX_CONCURENT_RUNS": "5",
        "AGENT_LOG_FORMAT": "json",
    }
    server = launch(tmp_path, env, workers=2)
    try:

        async def both_started() -> bool:
            return server.log().count("Application startup complete.") == 2

        await wait_for(both_started, within=START_TIMEOUT)
        entries = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        assert [e["msg"] for e in entries].count(UNKNOWN) == 1
    finally:
        server.stop()


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread(default=Text("OK")) as server:
        yield server


def model_env(upstream: FakeUpstream, **variables: str) -> dict[str, str]:
    return {
        "AGENT_MODEL": "openai:gpt-test",
        "OPENAI_BASE_URL": upstream.openai_url,
        "OPENAI_API_KEY": "sk-test-0123456789",
        "AGENT_CLIENT_MAX_RETRIES": "0",
        **variables,
    }


async def test_without_warm_up_no_model_call_is_made_and_ready_means_configured(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = launch(tmp_path, model_env(upstream, AGENT_WARMUP="0"))
    try:
        async with server.client() as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json() == {
                "status": "ready",
                "readiness": "configured",
                "agents": {"default": {"status": "configured", "required": True}},
            }
            assert upstream.requests == []
            listed = (await client.get("/v1/agents")).json()["agents"]
            assert [(a["name"], a["ready"]) for a in listed] == [("default", True)]
            # the first run is the first call: the model is reached, and counted
            run = await client.post("/v1/sessions/s1/runs", json={"input": "hi", "stream": False})
            assert run.json()["status"] == "completed", run.text
            assert len(upstream.requests) == 1
    finally:
        server.stop()
    ready_line = next(
        json.loads(line) for line in server.log().splitlines() if '"msg": "ready"' in line
    )
    assert ready_line["readiness"] == "configured"


async def test_the_warm_up_calls_the_model_once_and_ready_means_answered(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = launch(tmp_path, model_env(upstream))
    try:
        async with server.client() as client:
            ready = (await client.get("/readyz")).json()
            assert ready["readiness"] == "answered"
            assert ready["agents"] == {"default": {"status": "ready", "required": True}}
            assert len(upstream.requests) == 1
    finally:
        server.stop()


def read_until(fd: int, marker: bytes, process: subprocess.Popen[bytes]) -> bytes:
    """What ``fd`` (a terminal's master side) gives until ``marker`` appears."""
    seen = b""
    deadline = time.monotonic() + START_TIMEOUT
    while marker not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or process.poll() is not None:
            raise AssertionError(f"{marker!r} never came:\n{seen.decode(errors='replace')}")
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the other side closed
                break
    return seen


def start_on_a_terminal(tmp_path: Path, ready: bytes, **variables: str) -> str:
    """The log of a one-worker server whose stderr is a terminal, up to its serving and its
    line ``ready`` (the warm-up's end, logged in the background)."""
    master, child = pty.openpty()
    process = subprocess.Popen(
        [str(AGENT_SERVER), "--port", "0"],
        env=clean_env(tmp_path, **variables),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        start_new_session=True,
    )
    os.close(child)
    try:
        seen = read_until(master, b"Uvicorn running on", process)
        if ready not in seen:
            seen += read_until(master, ready, process)
        if not seen.endswith(b"\n"):
            seen += read_until(master, b"\n", process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        os.close(master)
    return seen.decode().replace("\r\n", "\n")


def test_logs_are_text_on_a_terminal(tmp_path: Path) -> None:
    log = start_on_a_terminal(tmp_path, b"app.server.lifespan ready", AGENT_MAX_CONCURENT_RUNS="5")
    lines = [line for line in log.splitlines() if line]
    assert lines and not [line for line in lines if line.startswith("{")], log
    # time, level, logger, message, then the fields as key=value
    warning = next(line for line in lines if "app.settings" in line)
    ts, level, logger, rest = warning.split(maxsplit=3)
    assert ts.endswith("Z") and "T" in ts
    assert (level, logger) == ("WARNING", "app.settings")
    assert rest == (
        f"{UNKNOWN} variable=AGENT_MAX_CONCURENT_RUNS suggestion=AGENT_MAX_CONCURRENT_RUNS"
    )
    # uvicorn's own loggers too
    serving = next(line for line in lines if "Uvicorn running on" in line)
    assert serving.split()[1:3] == ["INFO", "uvicorn.error"]
    assert any(line.split()[2:4] == ["app.server.lifespan", "ready"] for line in lines), log


def test_logs_are_json_on_a_terminal_when_asked(tmp_path: Path) -> None:
    log = start_on_a_terminal(tmp_path, b'"msg": "ready"', AGENT_LOG_FORMAT="json")
    entries = [json.loads(line) for line in log.splitlines() if line]
    assert any(e["logger"] == "uvicorn.error" for e in entries)


def test_logs_are_json_elsewhere_and_text_when_asked(tmp_path: Path) -> None:
    with port_in_use() as port:
        piped = run_cli(
            tmp_path, clean_env(tmp_path, AGENT_MAX_CONCURENT_RUNS="5"), "--port", str(port)
        )
        forced = run_cli(
            tmp_path,
            clean_env(tmp_path, AGENT_MAX_CONCURENT_RUNS="5", AGENT_LOG_FORMAT="text"),
            "--port",
            str(port),
        )
    assert json.loads(piped.stderr.splitlines()[0])["msg"] == UNKNOWN
    first = forced.stderr.splitlines()[0]
    assert first.split(maxsplit=3)[1:3] == ["WARNING", "app.settings"]
    assert f"{UNKNOWN} variable=AGENT_MAX_CONCURENT_RUNS" in first


def test_an_unreadable_setting_is_still_refused(tmp_path: Path) -> None:
    # a known setting with a value it cannot take stops the start, before any warning
    done = run_cli(tmp_path, clean_env(tmp_path, AGENT_LOG_FORMAT="colour"), "--port", "0")
    assert done.returncode == 2
    assert "agent-server: invalid configuration" in done.stderr
    assert "log_format" in done.stderr
