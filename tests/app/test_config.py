"""Settings from the environment, API keys, the agents file, wire encoding, logs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.agents import DEFAULT_AGENT, load_config
from app.api.errors import ProblemError
from app.auth import ANONYMOUS, Authenticator
from app.logs import JsonFormatter
from app.settings import Settings, parse_api_keys
from app.wire import WireEncoder, iso_ms


def test_defaults_match_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("AGENT_"):
            monkeypatch.delenv(name)
    settings = Settings()
    assert settings.model == "demo"
    assert settings.fallback_model_list == []
    assert settings.max_concurrent_runs == 64
    assert settings.max_queued_runs == 64
    assert settings.queue_timeout == 10
    assert settings.run_timeout == 300
    assert settings.drain_timeout == 30
    assert settings.database_url == "sqlite:///./var/agent.db"
    assert settings.redis_url is None
    assert settings.api_keys is None
    assert settings.config is None
    assert settings.max_body_bytes == 1048576
    assert settings.cors_origin_list == []
    assert settings.demo_token_delay == 0.02
    assert settings.demo_slow_seconds == 5
    assert settings.confirmation_timeout == 300
    assert settings.lease_seconds == 15
    assert settings.event_log_ttl == 600
    assert settings.sse_ping == 15
    assert not settings.debug_endpoints


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MAX_CONCURRENT_RUNS", "3")
    monkeypatch.setenv("AGENT_FALLBACK_MODELS", "openai:a, anthropic:b")
    monkeypatch.setenv("AGENT_CORS_ORIGINS", "https://a.example,https://b.example")
    monkeypatch.setenv("AGENT_API_KEYS", "k1=alice,k2=bob")
    monkeypatch.setenv("AGENT_REDIS_URL", "")
    monkeypatch.setenv("AGENT_DEBUG_ENDPOINTS", "1")
    settings = Settings()
    assert settings.max_concurrent_runs == 3
    assert settings.fallback_model_list == ["openai:a", "anthropic:b"]
    assert settings.cors_origin_list == ["https://a.example", "https://b.example"]
    assert settings.api_key_map == {"k1": "alice", "k2": "bob"}
    assert settings.redis_url is None
    assert settings.debug_endpoints
    assert "k1" not in repr(settings)


def test_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_API_KEYS", "ok=alice,secret-without-principal")
    settings = Settings()
    with pytest.raises(ValueError, match="entry 2") as invalid:
        settings.api_key_map  # noqa: B018
    assert "secret" not in str(invalid.value)
    assert "secret" not in repr(settings)
    monkeypatch.delenv("AGENT_API_KEYS")
    monkeypatch.setenv("AGENT_MAX_CONCURRENT_RUNS", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_parse_api_keys() -> None:
    assert parse_api_keys(" a=x , b = y ,") == {"a": "x", "b": "y"}
    with pytest.raises(ValueError, match="entry 2"):
        parse_api_keys("a=x,b")
    with pytest.raises(ValueError, match="repeats"):
        parse_api_keys("a=x,a=y")


def test_authenticator() -> None:
    assert Authenticator({}).principal(None) == ANONYMOUS
    auth = Authenticator({"k1": "alice"})
    assert "k1" not in repr(auth)
    assert auth.principal("Bearer k1") == "alice"
    assert auth.principal("bearer  k1 ") == "alice"
    for header in (None, "", "Bearer", "Bearer k2", "Token k1"):
        with pytest.raises(ProblemError) as refused:
            auth.principal(header)
        assert refused.value.status == 401
        assert "WWW-Authenticate" in refused.value.headers


def test_agents_file(tmp_path: Path) -> None:
    assert set(load_config(None).agents) == {DEFAULT_AGENT}
    path = tmp_path / "agents.toml"
    path.write_text(
        """
[policies]
current_time = "deny"

[agents.clock]
system_prompt = "Tell the time."
tools = ["current_time"]
run_timeout = 60
max_iterations = 3
""",
        encoding="utf-8",
    )
    config = load_config(str(path))
    assert set(config.agents) == {"clock", DEFAULT_AGENT}
    clock = config.agents["clock"]
    assert clock.run_timeout == 60 and clock.max_iterations == 3
    options = clock.run_options()
    assert options["agent_name"] == "clock"
    assert options["system_prompt"] == "Tell the time."
    assert config.policies == {"current_time": "deny"}
    path.write_text("[agents.x]\nmax_iterations = 0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="max_iterations"):
        load_config(str(path))
    path.write_text("[agents.x]\nunknown = 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown keys"):
        load_config(str(path))
    path.write_text("[policies]\nx = 'maybe'\n", encoding="utf-8")
    with pytest.raises(ValueError, match="policy"):
        load_config(str(path))
    path.write_text("not toml [", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(str(path))
    with pytest.raises(ValueError, match="cannot be read"):
        load_config(str(tmp_path / "missing.toml"))


def test_wire_encoding() -> None:
    assert iso_ms(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1.9999) == "1970-01-01T00:00:01.999Z"
    encoder = WireEncoder('run_"1', "s\n2")
    wire = encoder.encode(7, "text.delta", 1.5, {"delta": "Hel\nlo", "nan": float("nan")})
    text = wire.frame.decode()
    assert text.startswith("id: 7\nevent: text.delta\ndata: {")
    assert text.endswith("}\n\n")
    assert text.count("\n") == 4  # the data line carries no raw newline
    document = wire.document
    assert document == {
        "type": "text.delta",
        "seq": 7,
        "run_id": 'run_"1',
        "session_id": "s\n2",
        "ts": "1970-01-01T00:00:01.500Z",
        "data": {"delta": "Hel\nlo", "nan": None},
    }
    assert not wire.terminal
    assert encoder.encode(8, "run.cancelled", 2.0, {"reason": "shutdown"}).terminal
    odd = encoder.encode(9, "custom", 2.0, {"payload": {"value": object()}})
    assert isinstance(odd.document["data"]["payload"]["value"], str)


def test_json_logs() -> None:
    record = logging.LogRecord("app.runs", logging.INFO, __file__, 1, "run %s", ("done",), None)
    record.run_id = "run_1"
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "run done"
    assert line["run_id"] == "run_1"
    assert line["level"] == "info"
    assert line["ts"].endswith("Z")
