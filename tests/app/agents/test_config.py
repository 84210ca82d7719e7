"""Settings from the environment, API keys, the agents file, wire encoding, logs."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import ValidationError

from agent_runtime.compaction import LlmCompactor
from agent_runtime.errors import ConfigurationError
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.providers.demo import delete_file
from agent_runtime.tools.base import Tool, ToolPolicy
from app import cli
from app.agents.build import DEFAULT_AGENT, ConfigError, build_agents, load_config, model_binding
from app.agents.config import PROMPT_CACHING
from app.auth.keys import ANONYMOUS, Authenticator
from app.bus.wire import WireEncoder, iso_ms
from app.errors import Unauthorized
from app.http.api.errors import ProblemError
from app.settings import Settings, parse_api_keys
from app.telemetry.logs import JsonFormatter
from tests.support.local_models import needs_local_models
from tests.support.served import MakeSettings, Serve, Served
from tests.support.waiting import wait_until


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
    assert settings.resume_runs is True
    assert settings.max_resumes == 3
    assert not settings.debug_endpoints


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MAX_CONCURRENT_RUNS", "3")
    monkeypatch.setenv("AGENT_FALLBACK_MODELS", "openai:a, anthropic:b")
    monkeypatch.setenv("AGENT_CORS_ORIGINS", "https://a.example,https://b.example")
    monkeypatch.setenv("AGENT_API_KEYS", "k1=alice,k2=bob")
    monkeypatch.setenv("AGENT_REDIS_URL", "")
    monkeypatch.setenv("AGENT_DATABASE_URL", " ")
    monkeypatch.setenv("AGENT_DEBUG_ENDPOINTS", "1")
    settings = Settings()
    assert settings.max_concurrent_runs == 3
    assert settings.fallback_model_list == ["openai:a", "anthropic:b"]
    assert settings.cors_origin_list == ["https://a.example", "https://b.example"]
    assert settings.api_key_map == {"k1": "alice", "k2": "bob"}
    assert settings.redis_url is None
    assert settings.database_url == "sqlite:///./var/agent.db"  # empty: the default
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
        with pytest.raises(Unauthorized) as refused:
            auth.principal(header)
        problem = ProblemError.of(refused.value)
        assert problem.status == 401
        assert "WWW-Authenticate" in problem.headers


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


# --- AGENT_CONFIG -------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "agents.toml"
TOOL_CALLER = "python:tests.fakes.config_models:tool_caller"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "agents.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_without_a_file_there_is_the_default_agent_from_the_environment() -> None:
    config = load_config(None)
    assert list(config.agents) == [DEFAULT_AGENT]
    default = config.agents[DEFAULT_AGENT]
    assert default.model is None and default.fallbacks is None  # AGENT_MODEL and fallbacks
    assert [t.name for t in default.tools] == ["current_time", "delete_file"]
    assert default.policies == {"current_time": "allow", "delete_file": "ask"}
    assert default.run_options() == {"agent_name": DEFAULT_AGENT}
    assert config.mcp_servers == {}


@pytest.fixture
def example_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the example file reads from the environment (placeholders: nothing is called)."""
    monkeypatch.setenv("SEARCH_MCP_TOKEN", "token-1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-placeholder")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-placeholder")
    for name in ("FILES_ROOT", "SEARCH_MCP_URL", "TICKETS_MCP_URL"):
        monkeypatch.delenv(name, raising=False)


@needs_local_models  # the example's [embeddings.minilm] is in-process
@pytest.mark.usefixtures("example_env")
def test_the_documented_example_file_loads() -> None:
    config = load_config(str(EXAMPLE))
    assert config.path == str(EXAMPLE)
    assert list(config.agents) == ["default", "research", "support"]
    assert config.policies == {"*__delete_*": "deny"}

    files, search, tickets = (config.mcp_servers[n] for n in ("files", "search", "tickets"))
    assert files.transport == "stdio" and files.command == "npx"
    assert files.args[-1] == "/srv/data"  # ${FILES_ROOT:-/srv/data}
    assert files.cwd == str(EXAMPLE.parent)  # relative to the file
    assert files.session_pool_size == 2 and files.timeout == 20
    assert files.allowed_tools is not None and "write_file" in files.allowed_tools
    assert "read_text_file" in files.idempotent_tools and "write_file" not in files.idempotent_tools
    assert search.transport == "streamable_http"
    assert search.url == "https://search.internal.example/mcp"
    assert search.headers == {"Authorization": "Bearer token-1"}
    assert "token-1" not in repr(search)
    assert tickets.url == "http://127.0.0.1:9100/mcp" and tickets.session_pool_size == 2

    research = config.agents["research"]
    assert research.model == "openai:gpt-4o-mini"
    assert research.description == "Searches, reads and cites."
    assert research.skills == (str(EXAMPLE.parent / "skills"),)
    assert research.system_one == "openai:gpt-4o-mini"
    assert research.fallbacks == ("anthropic:claude-3-5-haiku-latest",)
    assert research.system_prompt is not None and "research assistant" in research.system_prompt
    assert research.run_timeout == 180 and research.max_iterations == 12
    assert research.parallel_tool_calls and research.tool_timeout == 45
    assert [t.name for t in research.tools] == ["current_time", "word_count"]
    assert research.mcp_servers == ("search", "files")
    assert research.model_params == {"temperature": 0.2}
    assert research.max_history_messages == 120
    # the agent's own policies first, then the file's
    assert list(research.policies.items()) == [
        ("files__*", "allow"),
        ("files__write_file", "ask"),
        ("*__delete_*", "deny"),
    ]
    compaction = research.compaction
    assert compaction is not None
    assert (compaction.model, compaction.keep_last, compaction.trigger_messages) == (
        "openai:gpt-4o-mini",
        12,
        60,
    )
    assert compaction.summary_role == "user" and compaction.max_chars_per_message == 2000
    assert compaction.instructions is not None

    support = config.agents["support"]
    assert support.default_policy == "ask"
    assert [t.name for t in support.tools] == ["shout"]  # a plain function, wrapped
    assert support.mcp_servers == ("search", "tickets")


@needs_local_models
@pytest.mark.usefixtures("example_env")
async def test_the_example_builds_and_passes_preflight(make_settings: MakeSettings) -> None:
    config = load_config(str(EXAMPLE))
    agents = await build_agents(make_settings(), config)
    try:
        await agents.preflight()  # every binding built, no network call
        assert set(agents.cores) == {"default", "research", "support"}
        assert set(agents.clients) == {"files", "search", "tickets"}
        research = agents.cores["research"]
        assert [b.model for b in research.bindings.llm] == [
            "gpt-4o-mini",
            "claude-3-5-haiku-latest",
        ]
        assert research.system_prompt is not None and research.run_timeout == 180
        assert research.max_iterations == 12 and research.parallel_tool_calls
        assert research.max_history_messages == 120
        assert isinstance(research.context_compactor, LlmCompactor)
        assert research.policy_for("files__write_file") is ToolPolicy.ASK
        assert research.policy_for("files__read_text_file") is ToolPolicy.ALLOW
        assert research.policy_for("search__delete_index") is ToolPolicy.DENY
        assert research.policy_for("search__search") is ToolPolicy.ALLOW
        support = agents.cores["support"]
        assert support.policy_for("shout", support.registry.get("shout")) is ToolPolicy.ASK
        assert support.policy_for("tickets__get_ticket") is ToolPolicy.ALLOW
        assert support.policy_for("tickets__close_ticket") is ToolPolicy.DENY
        # every core has its own confirmation extension
        extensions = [core.extensions[0] for core in agents.cores.values()]
        assert len({id(e) for e in extensions}) == 3
        assert all(isinstance(e, ConfirmationExtension) for e in extensions)
    finally:
        await agents.aclose()
        await agents.close_mcp()  # never started: nothing to do


def test_the_configuration_page_shows_the_whole_example() -> None:
    page = (EXAMPLE.parents[1] / "configuration.md").read_text(encoding="utf-8")
    assert f"```toml\n{EXAMPLE.read_text(encoding='utf-8')}```\n" in page


async def test_a_policy_for_no_tool_is_a_warning(
    tmp_path: Path, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path,
        '[policies]\n"*__delete_*" = "deny"\ndelete_file = "ask"\n'
        '[agents.x]\nmodel = "demo"\ntools = ["current_time"]\n'
        '[agents.x.policies]\ncurent_time = "deny"\n',
    )
    agents = await build_agents(make_settings(), load_config(path))
    try:
        with caplog.at_level(logging.WARNING, logger="app.agents.build"):
            await agents.start_mcp()
            await agents.start_mcp()
    finally:
        await agents.aclose()
    warned = [getattr(r, "tool", None) for r in caplog.records]
    assert warned == ["curent_time"]  # once; patterns and another agent's tools are fine


def test_the_examples_own_tools_work() -> None:
    """(``tests/test_docs_examples.py`` runs ``custom_tools.py``, which loads the file.)"""
    from docs.examples import custom_tools

    assert custom_tools.word_count("a b c") == 3


def test_a_file_without_default_gets_the_environments_default(tmp_path: Path) -> None:
    path = write(tmp_path, '[policies]\ndelete_file = "deny"\n[agents.x]\nmodel = "demo"\n')
    config = load_config(path)
    assert list(config.agents) == ["x", DEFAULT_AGENT]
    x = config.agents["x"]
    assert x.tools == () and x.mcp_servers == () and x.fallbacks is None
    default = config.agents[DEFAULT_AGENT]
    assert default.policies["delete_file"] == "deny"  # the file's policy has the last word
    assert all(t.policy is None for t in default.tools)


async def test_policies_in_the_file_override_a_tools_own(
    tmp_path: Path, make_settings: MakeSettings
) -> None:
    path = write(
        tmp_path,
        '[agents.x]\nmodel = "demo"\ntools = ["delete_file", "current_time"]\n'
        '[agents.x.policies]\n"delete_*" = "allow"\n',
    )
    agents = await build_agents(make_settings(), load_config(path))
    try:
        core = agents.cores["x"]
        delete = core.registry.get("delete_file")
        assert core.policy_for("delete_file", delete) is ToolPolicy.ALLOW
        current = core.registry.get("current_time")
        assert core.policy_for("current_time", current) is ToolPolicy.ALLOW  # its own
        assert delete_file.policy is ToolPolicy.ASK  # the shared builtin is untouched
    finally:
        await agents.aclose()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[agents.research]\nmax_iterations = 0\n",
            "agents.research.max_iterations: expected a positive integer, got 0",
        ),
        ("[agents.x]\nunknown = 1\n", "agents.x.unknown: unknown key; expected one of: model,"),
        ("colour = 1\n", "colour: unknown key; expected one of: agents, mcp_servers, policies"),
        ("agents = 1\n", "agents: expected a table, got 1"),
        (
            "[agents.x]\nrun_timeout = -1\n",
            "agents.x.run_timeout: expected a positive number of seconds",
        ),
        ("[agents.x]\ntool_timeout = true\n", "agents.x.tool_timeout: expected a positive number"),
        (
            "[agents.x]\nparallel_tool_calls = 'yes'\n",
            "agents.x.parallel_tool_calls: expected true or false",
        ),
        ("[agents.x]\nsystem_prompt = 3\n", "agents.x.system_prompt: expected a non-empty string"),
        (
            "[agents.x]\nmax_history_messages = 0\n",
            "agents.x.max_history_messages: expected a positive integer",
        ),
        ("[agents.x]\nmodel_params = 1\n", "agents.x.model_params: expected a table"),
        ("[agents.x]\nprompt_caching = 'no'\n", "agents.x.prompt_caching: expected true or false"),
        (
            "[agents.x]\nprompt_caching = true\nmodel_params = { prompt_caching = false }\n",
            "agents.x.prompt_caching: set it here or in model_params, not in both",
        ),
        (
            "[agents.x]\ndefault_policy = 'maybe'\n",
            "agents.x.default_policy: expected one of allow, ask, deny, got 'maybe'",
        ),
        (
            '[agents.x.policies]\n"fs__*" = "maybe"\n',
            'agents.x.policies."fs__*": expected one of allow, ask, deny',
        ),
        (
            '[policies]\ndelete_file = "never"\n',
            "policies.delete_file: expected one of allow, ask, deny",
        ),
        ('[agents."bad name"]\n', 'agents."bad name": an agent name is 1 to 64 letters'),
        ("[agents.x]\ntools = 'current_time'\n", "agents.x.tools: expected an array of strings"),
        (
            "[agents.x]\ntools = ['nope']\n",
            "agents.x.tools[0]: unknown tool 'nope': builtin tools are current_time, delete_file",
        ),
        (
            "[agents.x]\ntools = ['no_such_module_q:f']\n",
            "agents.x.tools[0]: cannot import module 'no_such_module_q'",
        ),
        (
            "[agents.x]\ntools = ['docs.examples.custom_tools:missing']\n",
            "agents.x.tools[0]: module 'docs.examples.custom_tools' has no attribute 'missing'",
        ),
        (
            "[agents.x]\ntools = ['docs.examples.custom_tools:EXAMPLE_NOT_HERE']\n",
            "has no attribute",
        ),
        (
            "[agents.x]\ntools = ['current_time', 'delete_file', 'current_time']\n",
            "agents.x.tools[2]: duplicate tool name 'current_time' (also tools[0])",
        ),
        (
            "[agents.x]\nmcp_servers = ['ghost']\n",
            "agents.x.mcp_servers[0]: unknown MCP server 'ghost'; defined under [mcp_servers]: "
            "none",
        ),
        (
            "[mcp_servers.s]\ncommand = 'no-such-mcp-server-xyz'\n",
            "mcp_servers.s.command: command 'no-such-mcp-server-xyz' is not on PATH",
        ),
        (
            "[mcp_servers.s]\ncommand = './missing/server'\n",
            "mcp_servers.s.command: command './missing/server' does not exist",
        ),
        (
            "[mcp_servers.s]\ncommand = 'true'\n[agents.x]\nmcp_servers = ['s', 's']\n",
            "agents.x.mcp_servers[1]: MCP server 's' is listed twice",
        ),
        (
            "[mcp_servers.s]\ncommand = 'true'\n"
            "[agents.x]\nmcp_servers = [{ name = 's', command = 'y' }]\n",
            "agents.x.mcp_servers[0].name: an MCP server named 's' is already defined",
        ),
        (
            "[agents.x]\nmcp_servers = [{ command = 'y' }]\n",
            "agents.x.mcp_servers[0].name: an inline MCP server needs a name",
        ),
        (
            "[agents.x]\nmcp_servers = [{ name = 'i', command = 'y', port = 1 }]\n",
            "agents.x.mcp_servers[0].port: unknown key",
        ),
        (
            "[mcp_servers.s]\nurl = 'ftp://example'\n",
            "mcp_servers.s: MCP server 's': streamable_http needs an http(s) url",
        ),
        (
            "[mcp_servers.s]\ncommand = 'true'\nurl = 'http://a'\ntransport = 'stdio'\n",
            "mcp_servers.s: MCP server 's': url and headers belong to streamable_http",
        ),
        ("[mcp_servers.s]\ncommand = 'true'\nbogus = 1\n", "mcp_servers.s.bogus: unknown key"),
        (
            "[mcp_servers.s]\nname = 's'\ncommand = 'true'\n",
            "mcp_servers.s.name: the server's name is its table's key",
        ),
        (
            "[mcp_servers.s]\ncommand = 'true'\nargs = [1]\n",
            "mcp_servers.s.args[0]: expected a non-empty string",
        ),
        (
            "[mcp_servers.s]\ncommand = 'true'\nenv = { A = 1 }\n",
            "mcp_servers.s.env.A: expected a string, got 1",
        ),
        (
            "[mcp_servers.s]\ncommand = 'true'\nsession_pool_size = -1\n",
            "mcp_servers.s.session_pool_size: expected an integer >= 0",
        ),
        (
            "[mcp_servers.s]\ncommand = '${UNSET_VARIABLE_FOR_TEST}'\n",
            "mcp_servers.s.command: environment variable UNSET_VARIABLE_FOR_TEST is not set",
        ),
        (
            "[mcp_servers.bad__name]\ncommand = 'true'\n",
            "mcp_servers.bad__name: MCP server name 'bad__name' must start",
        ),
        (
            "[mcp_servers.word]\ncommand = 'true'\n[agents.x]\n"
            "tools = ['tests.fakes.config_models:clashing']\nmcp_servers = ['word']\n",
            "agents.x.tools[0]: tool name 'word__count' takes the prefix of the agent's MCP server",
        ),
        (
            "[agents.x]\nmodel = 'nonsense-provider'\n",
            "agents.x.model: unknown model setting 'nonsense-provider'",
        ),
        (
            "[agents.x]\nmodel = 'python:no_such_module_q:f'\n",
            "agents.x.model: cannot import module 'no_such_module_q'",
        ),
        (
            "[agents.x]\nmodel = 'python:app.agents.build:DEFAULT_AGENT'\n",
            "agents.x.model: 'python:app.agents.build:DEFAULT_AGENT' does not name a callable "
            "factory",
        ),
        (
            "[agents.x]\nmodel = 'demo'\nfallbacks = ['demo', 'bogus:']\n",
            "agents.x.fallbacks[1]: unknown model setting",
        ),
        ("[agents.x]\nfallbacks = ['demo']\n", "agents.x.fallbacks: set model too"),
        (
            "[agents.x.compaction]\nkeep_last = 10\ntrigger_messages = 10\n",
            "agents.x.compaction.trigger_messages: must be larger than keep_last (10), got 10",
        ),
        (
            "[agents.x.compaction]\nsummary_role = 'tool'\n",
            "agents.x.compaction.summary_role: expected 'user' or 'system'",
        ),
        (
            "[agents.x.compaction]\nmodel = 'nope'\n",
            "agents.x.compaction.model: unknown model setting",
        ),
        ("[agents.x.compaction]\nevery = 3\n", "agents.x.compaction.every: unknown key"),
        ("[agents.x]\ncompaction = 1\n", "agents.x.compaction: expected a table"),
        (
            "[agents.x]\nskills = ['no/such/dir']\n",
            "agents.x.skills[0]: 'no/such/dir' is not a folder",
        ),
        ("[agents.x]\nskills = 'one'\n", "agents.x.skills: expected an array of strings"),
        ("[agents.x]\nsystem_one = 'bogus:'\n", "agents.x.system_one: unknown model setting"),
        ("[agents.x]\ndescription = 3\n", "agents.x.description: expected a non-empty string"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_a_bad_file_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: "), str(raised.value)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)  # agent-server turns it into exit status 2


def test_an_unreadable_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="AGENT_CONFIG cannot be read") as raised:
        load_config(missing)
    assert raised.value.file == missing


def test_agent_server_refuses_a_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[agents.research]\nmax_iterations = 0\n")
    monkeypatch.setenv("AGENT_CONFIG", path)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert f"{path}: agents.research.max_iterations: expected a positive integer" in err


async def test_openai_responses_specs_go_wherever_openai_specs_go(
    tmp_path: Path, make_settings: MakeSettings
) -> None:
    spec = "openai-responses:o4-mini"
    path = write(
        tmp_path,
        f'[agents.r]\nmodel = "{spec}"\nfallbacks = ["{spec}"]\nsystem_one = "{spec}"\n'
        f'[agents.r.compaction]\nmodel = "{spec}"\n',
    )
    agent = load_config(path).agents["r"]
    assert (agent.model, agent.fallbacks, agent.system_one) == (spec, (spec,), spec)
    assert agent.compaction is not None and agent.compaction.model == spec
    settings = make_settings(model=spec, fallback_models=spec)
    bindings = [model_binding(s, settings) for s in (settings.model, *settings.fallback_model_list)]
    assert {(b.model, b.protocol) for b in bindings} == {("o4-mini", "openai-responses")}


def test_python_model_specs(make_settings: MakeSettings) -> None:
    settings = make_settings()
    binding = model_binding(TOOL_CALLER, settings)
    assert binding.model == "tool-caller"
    demo = model_binding("demo", settings)
    assert demo.model == "demo"
    with pytest.raises(ConfigurationError, match="not a model"):
        model_binding("python:tests.fakes.config_models:not_a_model", settings)


async def test_preflight_names_the_agent(
    tmp_path: Path, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = write(tmp_path, "[agents.research]\nmodel = 'openai:gpt-4o-mini'\n")
    agents = await build_agents(make_settings(), load_config(path))
    try:
        with pytest.raises(ConfigurationError, match=rf"^{path}: agents.research: "):
            await agents.preflight()
    finally:
        await agents.aclose()


# --- configured agents served in-process -----------------------------------------------------

AGENTS = f"""
[agents.default]
model = "demo"

[agents.ops]
model = "demo"
system_prompt = "You run operations."
tools = ["delete_file"]

[agents.ops.policies]
delete_file = "ask"

[agents.echo]
model = "{TOOL_CALLER}"
system_prompt = "You are the echo agent."
max_iterations = 3

[agents.short]
model = "{TOOL_CALLER}"
max_history_messages = 3

[agents.summing]
model = "{TOOL_CALLER}"

[agents.summing.compaction]
model = "python:tests.fakes.config_models:summarizer"
keep_last = 2
trigger_messages = 3
"""


async def answer(served: Served, session: str, text: str, agent: str) -> dict[str, Any]:
    response = await served.client.post(
        f"/v1/sessions/{session}/runs", json={"input": text, "stream": False, "agent": agent}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_each_agent_runs_on_its_own_core(serve: Serve, tmp_path: Path) -> None:
    async with serve(config=write(tmp_path, AGENTS)) as served:
        assert set(served.services.agents.cores) == {"default", "ops", "echo", "short", "summing"}
        echo = await answer(served, "s-echo", "system", "echo")
        assert echo["output"] == {"content": "You are the echo agent."}
        run = (await served.client.get(f"/v1/runs/{echo['run_id']}")).json()
        assert run["agent"] == "echo"
        default = await answer(served, "s-default", "hello", "default")
        assert default["output"] == {"content": "You said: hello"}
        # the demo model asks for current_time; the ops agent has no such tool
        ops = await answer(served, "s-ops", "what time is it", "ops")
        assert ops["status"] == "completed"
        unknown = await served.client.post(
            "/v1/sessions/s/runs", json={"input": "x", "agent": "nope"}
        )
        assert unknown.status_code == 404
        assert unknown.json()["code"] == "not_found"
        assert "nope" in unknown.json()["detail"]
        await served.wait_idle()


@pytest.mark.parametrize("by_run", [True, False], ids=["by-run", "by-session"])
async def test_a_confirmation_reaches_the_agent_holding_the_run(
    serve: Serve, tmp_path: Path, by_run: bool
) -> None:
    async with serve(config=write(tmp_path, AGENTS)) as served:
        client = served.client
        started = await client.post(
            "/v1/sessions/s-ops/runs",
            json={"input": "delete notes.txt", "background": True, "agent": "ops"},
        )
        run_id = started.json()["run_id"]

        async def status() -> str:
            return str((await client.get(f"/v1/runs/{run_id}")).json()["status"])

        async def waiting() -> bool:
            return await status() == "waiting"

        await wait_until(waiting)
        assert run_id in served.services.agents.cores["ops"].active_runs
        assert not served.services.agent.active_runs  # not on the default core
        subscription = await served.services.bus.events.subscribe(run_id)
        logged = await subscription.next()
        await subscription.aclose()
        request = next(e for e in logged if e.type == "custom").document["data"]["payload"]
        assert request["tool"] == "delete_file"
        accepted = await client.post(
            "/external-events",
            json={
                "session_id": "s-ops",
                "run_id": run_id if by_run else None,
                "name": "confirmation_response",
                "payload": {"tool_call_id": request["tool_call_id"], "approved": True},
            },
        )
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"accepted_by": ["ConfirmationExtension"]}

        async def completed() -> bool:
            return await status() == "completed"

        await wait_until(completed)
        result = (await client.get(f"/v1/runs/{run_id}")).json()
        assert "Deleted notes.txt" in result["output"]["content"]
        await served.wait_idle()


async def test_history_bound_and_compaction_from_the_file(serve: Serve, tmp_path: Path) -> None:
    async with serve(config=write(tmp_path, AGENTS)) as served:
        for agent in ("short", "summing"):
            session = f"s-{agent}"
            assert (await answer(served, session, "one", agent))["output"]["content"] == "OK"
            assert (await answer(served, session, "two", agent))["output"]["content"] == "OK"
            seen = await answer(served, session, "history", agent)
            if agent == "short":
                # 5 messages; the bound drops the oldest whole turn
                assert seen["output"]["content"] == "history 3"
            else:
                # more than 3: all but the last 2 became one summary message
                assert seen["output"]["content"] == "history 3 summary"
        await served.wait_idle()


def test_agent_server_hands_its_timeouts_to_uvicorn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}

    def run(self: uvicorn.Server, sockets: Any = None) -> None:
        # what agent-server configured, without serving
        served.update(vars(self.config))
        self.started = True

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite:///{tmp_path}/a.db")
    monkeypatch.setenv("AGENT_KEEP_ALIVE_TIMEOUT", "75")
    monkeypatch.setenv("AGENT_DRAIN_TIMEOUT", "20")
    monkeypatch.setenv("AGENT_SEND_TIMEOUT", "5")
    assert cli.main(["--port", "0"]) == 0
    assert served["app"] == "app.main:create_app"
    assert served["timeout_keep_alive"] == 75
    # the drain, then a stream's last write, then a margin
    assert served["timeout_graceful_shutdown"] > 25
    assert served["timeout_worker_healthcheck"] == 60


def test_agent_server_refuses_unshared_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[int] = []

    def run(self: uvicorn.Server, sockets: Any = None) -> None:
        served.append(self.config.workers)
        self.started = True

    class Supervisor:  # uvicorn's, for several workers: records instead of serving
        def __init__(self, config: uvicorn.Config, listeners: Any) -> None:
            self.config = config

        def run(self) -> None:
            served.append(self.config.workers)

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setattr(cli, "Supervisor", Supervisor)
    monkeypatch.setattr(cli, "Listeners", lambda config: None)
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite:///{tmp_path}/a.db")
    monkeypatch.delenv("AGENT_REDIS_URL", raising=False)
    monkeypatch.delenv("AGENT_ALLOW_UNSHARED_WORKERS", raising=False)
    # cli.main tells the workers their number through AGENT_WORKERS: restored afterwards
    monkeypatch.setenv("AGENT_WORKERS", "1")
    assert cli.main(["--port", "0", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "cannot start: --workers 2 needs a shared bus" in err
    assert "AGENT_REDIS_URL" in err and "AGENT_ALLOW_UNSHARED_WORKERS=1" in err
    assert served == []
    # one worker needs nothing shared
    assert cli.main(["--port", "0", "--workers", "1"]) == 0
    # the explicit allowance starts them, with a warning
    monkeypatch.setenv("AGENT_ALLOW_UNSHARED_WORKERS", "1")
    assert cli.main(["--port", "0", "--workers", "2"]) == 0
    assert "warning: --workers > 1 without AGENT_REDIS_URL" in capsys.readouterr().err
    assert served == [1, 2]


def test_an_agent_is_required_unless_the_file_says_otherwise(tmp_path: Path) -> None:
    path = write(tmp_path, "[agents.a]\n[agents.b]\nrequired = false\n")
    config = load_config(path)
    assert [config.agents[name].required for name in ("default", "a", "b")] == [True, True, False]
    bad = write(tmp_path, '[agents.a]\nrequired = "no"\n')
    with pytest.raises(ConfigError, match=r"agents\.a\.required"):
        load_config(bad)


def test_prompt_caching_is_on_unless_an_agent_turns_it_off(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[agents.a]\n[agents.b]\nprompt_caching = true\nmodel_params = { temperature = 0 }\n"
        "[agents.c]\nprompt_caching = false\nmodel_params = { temperature = 0 }\n",
    )
    agents = load_config(path).agents
    assert agents["a"].model_params == {}
    assert agents["b"].model_params == {"temperature": 0}
    assert agents["c"].model_params == {"temperature": 0, PROMPT_CACHING: False}


_HAS_IDEMPOTENT = "idempotent" in {f.name for f in dataclasses.fields(Tool)}


@pytest.mark.skipif(not _HAS_IDEMPOTENT, reason="the runtime's Tool has no idempotent flag yet")
def test_idempotent_tools_mark_the_named_tools(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            '[agents.default]\ntools = ["current_time", "delete_file"]\n'
            'idempotent_tools = ["current_time"]\n',
        )
    )
    tools = {t.name: t for t in config.agents[DEFAULT_AGENT].tools}
    flags = {name: getattr(t, "idempotent", None) for name, t in tools.items()}
    assert flags == {"current_time": True, "delete_file": False}


def test_idempotent_tools_must_be_the_agent_s_tools(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[agents.default]\ntools = ["current_time"]\nidempotent_tools = ["nope"]\n'
    )
    with pytest.raises(ConfigError, match=r"idempotent_tools\[0\].*'nope' is not one of"):
        load_config(path)


def test_an_mcp_server_names_its_idempotent_tools(tmp_path: Path) -> None:
    server = '[mcp_servers.web]\nurl = "http://127.0.0.1:9/mcp"\n'
    agent = '[agents.default]\nmcp_servers = ["web"]\n'
    config = load_config(write(tmp_path, server + 'idempotent_tools = ["add"]\n' + agent))
    assert config.mcp_servers["web"].idempotent_tools == ("add",)
    # named by its advertised name in the agent's list: where it belongs is said
    path = write(tmp_path, server + agent + 'idempotent_tools = ["web__add"]\n')
    with pytest.raises(ConfigError, match=r"MCP server 'web': name it as 'add' in that server"):
        load_config(path)
    stray = 'allowed_tools = ["echo"]\nidempotent_tools = ["add"]\n'
    with pytest.raises(ConfigError, match=r"idempotent_tools add are not among its allowed_tools"):
        load_config(write(tmp_path, server + stray + agent))


def test_editable_tools_mark_the_named_tools(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            '[agents.default]\ntools = ["current_time", "delete_file"]\n'
            'idempotent_tools = ["delete_file"]\neditable_tools = ["delete_file"]\n',
        )
    )
    tools = {t.name: t for t in config.agents[DEFAULT_AGENT].tools}
    assert {name: (t.editable, t.idempotent) for name, t in tools.items()} == {
        "current_time": (False, False),
        "delete_file": (True, True),
    }
    # the environment's own default agent edits nothing
    assert not any(t.editable for t in load_config(None).agents[DEFAULT_AGENT].tools)


def test_editable_tools_must_be_the_agent_s_own_tools(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[agents.default]\ntools = ["current_time"]\neditable_tools = ["nope"]\n'
    )
    with pytest.raises(ConfigError, match=r"editable_tools\[0\].*'nope' is not one of"):
        load_config(path)
    server = '[mcp_servers.web]\nurl = "http://127.0.0.1:9/mcp"\n'
    agent = '[agents.default]\nmcp_servers = ["web"]\neditable_tools = ["web__add"]\n'
    with pytest.raises(ConfigError, match=r"an MCP tool's arguments cannot be edited"):
        load_config(write(tmp_path, server + agent))
