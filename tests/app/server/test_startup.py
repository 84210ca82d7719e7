"""Starting the service: unknown settings, the listening address, the warm-up switch and the
two log formats (the pure parts; ``tests/e2e/test_cli.py`` starts the real process)."""

from __future__ import annotations

import errno
import io
import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.agent import AgentCore
from agent_runtime.messages import AssistantMessage
from agent_runtime.model import ModelRequest
from agent_runtime.testing import FunctionModel
from app.agents.build import ConfiguredAgents
from app.agents.config import default_config, environment_references
from app.agents.health import AgentStates
from app.server.listen import ListenError, bind_sockets, listen_error
from app.settings import Settings, known_variables, unknown_variables
from app.telemetry.logs import (
    JsonFormatter,
    TextFormatter,
    logging_config,
    make_formatter,
    resolve_format,
)

# --- unknown settings ---------------------------------------------------------------------------


def test_every_setting_is_known_by_its_variable() -> None:
    known = known_variables()
    assert {"AGENT_MAX_CONCURRENT_RUNS", "AGENT_WARMUP", "AGENT_LOG_FORMAT"} <= known
    assert "AGENT_WORKERS" in known  # set by agent-server for its workers
    assert len(known) == len(Settings.model_fields)


def test_an_unknown_setting_gets_the_closest_known_name() -> None:
    environ = {
        "AGENT_MAX_CONCURENT_RUNS": "5",
        "AGENT_MODEL": "demo",
        "agent_redis_ulr": "redis://x",  # read whatever its case, so checked whatever its case
        "AGENT_ZQXJ": "1",
        "PATH": "/bin",
        "MY_AGENT_THING": "1",
    }
    assert unknown_variables(environ) == [
        ("AGENT_MAX_CONCURENT_RUNS", "AGENT_MAX_CONCURRENT_RUNS"),
        ("AGENT_ZQXJ", None),
        ("agent_redis_ulr", "AGENT_REDIS_URL"),
    ]
    assert unknown_variables({"agent_model": "demo"}) == []


def test_variables_the_agents_file_refers_to_are_known(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(
        '[mcp_servers.s]\nurl = "${AGENT_SEARCH_URL}"\n'
        'headers = {Authorization = "Bearer ${AGENT_SEARCH_TOKEN:-none}"}\n',
        encoding="utf-8",
    )
    refs = environment_references(str(path))
    assert refs == {"AGENT_SEARCH_URL", "AGENT_SEARCH_TOKEN"}
    environ = {"AGENT_SEARCH_URL": "u", "AGENT_SEARCH_TOKEN": "t", "AGENT_SEARCH_TOKNE": "t"}
    assert unknown_variables(environ, refs) == [("AGENT_SEARCH_TOKNE", "AGENT_SEARCH_TOKEN")]
    assert environment_references(None) == frozenset()
    assert environment_references(str(tmp_path / "missing.toml")) == frozenset()


# --- the listening address ----------------------------------------------------------------------


def test_a_port_in_use_is_named_with_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as caught:
            bind_sockets("127.0.0.1", port)
    assert str(caught.value) == (
        f"127.0.0.1:{port} is already in use (another process listens on it: stop that one, "
        "or choose another --port)"
    )
    # nothing stayed bound: the port is free again once its holder closed
    for sock in bind_sockets("127.0.0.1", port):
        sock.close()


def test_other_bind_failures_name_the_address() -> None:
    denied = listen_error("0.0.0.0", 80, OSError(errno.EACCES, "Permission denied"))
    assert str(denied) == (
        "cannot listen on 0.0.0.0:80 (Permission denied: ports below 1024 need privileges; "
        "choose another --port)"
    )
    foreign = listen_error("::1", 8000, OSError(errno.EADDRNOTAVAIL, "Cannot assign"))
    assert str(foreign).startswith("cannot listen on [::1]:8000 (Cannot assign: --host must")
    # an address of another machine (TEST-NET-1): refused by the kernel, no name looked up
    with pytest.raises(ListenError, match=r"^cannot listen on 192\.0\.2\.1:8000 \(.*--host must"):
        bind_sockets("192.0.2.1", 8000)


def test_bound_sockets_listen_on_the_port_asked() -> None:
    sockets = bind_sockets("127.0.0.1", 0)
    try:
        assert [s.family for s in sockets] == [socket.AF_INET]
        assert sockets[0].getsockname()[0] == "127.0.0.1"
        assert sockets[0].get_inheritable()
    finally:
        for sock in sockets:
            sock.close()


# --- the warm-up switch -------------------------------------------------------------------------


def test_a_configured_agent_takes_runs_like_a_ready_one() -> None:
    states = AgentStates([("default", True), ("extra", False)])
    states.mark_configured("default")
    assert (states.ready, states.all_ready, states.problem) == (True, False, "")
    states.mark_configured("extra")
    assert (states.ready, states.all_ready) == (True, True)
    assert states.to_dict()["default"] == {"status": "configured", "required": True}
    assert states.unavailable("default") is None


async def test_without_the_model_call_the_warm_up_makes_none() -> None:
    def answer(request: ModelRequest) -> AssistantMessage:
        return AssistantMessage(content="OK")

    model = FunctionModel(answer)
    core = AgentCore(model)
    agents = ConfiguredAgents(default_config(), {"default": core}, {})
    try:
        assert await agents.warm_up("Reply with OK.", call_model=False)
        assert model.requests == []
        assert agents.states.to_dict() == {"default": {"status": "configured", "required": True}}
        assert agents.warm == {"default"}
        # the same agents with the call: one request
        again = ConfiguredAgents(default_config(), {"default": core}, {})
        assert await again.warm_up("Reply with OK.")
        assert len(model.requests) == 1
        assert again.states.to_dict() == {"default": {"status": "ready", "required": True}}
    finally:
        await agents.aclose()


# --- the log formats ----------------------------------------------------------------------------


def record(**extra: Any) -> logging.LogRecord:
    entry = logging.LogRecord(
        "app.server.lifespan", logging.WARNING, __file__, 1, "warm-up %s", ("failed",), None
    )
    entry.__dict__.update(extra)
    return entry


def test_the_text_form_carries_every_field_of_the_json_form() -> None:
    fields: dict[str, Any] = {
        "run_id": "run_1",
        "retry_in": 0.5,
        "error": 'said "no" = refused',
        "empty": "",
        "count": 3,
        "flags": {"a": True},
        "link": "/v1/runs/r/events?token=secret-value",
        "color_message": "uvicorn's own: never written",
    }
    entry = record(**fields)
    as_json = json.loads(JsonFormatter().format(entry))
    line = TextFormatter().format(entry)
    ts, level, logger, rest = line.split(" ", 3)
    assert (ts, level, logger) == (as_json["ts"], "WARNING", "app.server.lifespan")
    assert rest.lstrip() == (
        'warm-up failed run_id=run_1 retry_in=0.5 error="said \\"no\\" = refused" empty="" '
        'count=3 flags={"a": true} link="/v1/runs/r/events?token=[redacted]"'
    )
    # the same fields in both forms, in the same order
    assert list(as_json)[4:] == [k for k in fields if k != "color_message"]
    assert "color_message" not in line and "secret-value" not in line


def test_the_text_form_shows_a_traceback_below_the_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record()
        failed.exc_info = sys.exc_info()
    text = TextFormatter().format(failed)
    first, *rest = text.splitlines()
    assert first.endswith("app.server.lifespan warm-up failed")
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "RuntimeError: boom"
    assert json.loads(JsonFormatter().format(failed))["exc"] == "\n".join(rest)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    assert resolve_format("auto", Terminal()) == "text"
    assert resolve_format("auto", io.StringIO()) == "json"
    closed = io.StringIO()
    closed.close()
    assert resolve_format("auto", closed) == "json"
    assert resolve_format("json", Terminal()) == "json"
    assert resolve_format("text", io.StringIO()) == "text"
    assert isinstance(make_formatter("text"), TextFormatter)
    assert isinstance(make_formatter("json"), JsonFormatter)


def test_uvicorn_logs_through_the_service_formatter() -> None:
    config = logging_config("info", "text")
    assert config["formatters"]["agent"] == {
        "()": "app.telemetry.logs.make_formatter",
        "log_format": "text",
    }
    for name in ("app", "agent_runtime", "uvicorn", "uvicorn.access"):
        assert config["loggers"][name]["handlers"] == ["stderr"]
    assert config["handlers"]["stderr"]["formatter"] == "agent"
