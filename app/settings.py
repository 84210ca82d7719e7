"""The service's settings: ``AGENT_*`` environment variables, read once per worker.

The names and defaults of the public ones are part of the contract (CONTRACT.md, section 5);
the rest tune the service (demo model, SSE, drain, logs). Secrets (``AGENT_API_KEYS``) are
``SecretStr``: they never appear in ``repr`` or logs.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.admission.budgets import parse_budgets
from app.webhooks.signing import parse_endpoint_secrets, parse_secret

__all__ = ["Settings", "known_variables", "parse_api_keys", "unknown_variables"]

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "text", "json"]


def parse_api_keys(value: str) -> dict[str, str]:
    """``"key=principal,key2=principal2"`` as a dict; raises ValueError on a malformed pair.

    The message never contains a key.
    """
    keys: dict[str, str] = {}
    for index, item in enumerate(value.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        key, sep, principal = item.partition("=")
        key, principal = key.strip(), principal.strip()
        if not sep or not key or not principal:
            raise ValueError(
                f"AGENT_API_KEYS entry {index} is not of the form key=principal "
                "(entries are separated by commas)"
            )
        if key in keys:
            raise ValueError(f"AGENT_API_KEYS entry {index} repeats a key")
        keys[key] = principal
    return keys


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class Settings(BaseSettings):
    """Every ``AGENT_*`` variable. Build with ``Settings()`` (reads the environment)."""

    model_config = SettingsConfigDict(env_prefix="AGENT_", extra="ignore", frozen=True)

    # --- the contract's table ---------------------------------------------------------------
    model: str = "demo"
    """``demo``, ``openai:MODEL``, ``openai-responses:MODEL``, ``anthropic:MODEL`` or a preset
    name."""
    fallback_models: str = ""
    """Comma-separated model specs tried in order on retryable provider errors."""
    max_concurrent_runs: Annotated[int, Field(ge=1)] = 64
    max_queued_runs: Annotated[int, Field(ge=0)] = 64
    queue_timeout: Annotated[float, Field(ge=0)] = 10.0
    max_session_queue: Annotated[int, Field(ge=0)] = 8
    """Runs one session may hold queued (``multitask_strategy: enqueue``); beyond it 429."""
    run_timeout: Annotated[float, Field(gt=0)] = 300.0
    drain_timeout: Annotated[float, Field(ge=0)] = 30.0
    database_url: str = "sqlite:///./var/agent.db"
    redis_url: str | None = None
    api_keys: SecretStr | None = None
    config: str | None = None
    """Path of a TOML file defining agents (see docs/api.md, "Agents")."""
    max_body_bytes: Annotated[int, Field(ge=1)] = 1_048_576
    max_file_bytes: Annotated[int, Field(ge=1)] = 20_971_520
    """Bytes of one file at most (``POST /v1/files``, a ``data:`` URL in a run's input);
    ``POST /v1/files`` takes bodies of this plus the multipart framing."""
    cors_origins: str = ""
    allowed_hosts: str = "localhost,127.0.0.1,::1"
    """Host names (any port) requests may name in ``Host`` and their ``Origin``: the guard
    against DNS rebinding (``app.http.hosts``); ``*.example.com`` for subdomains, ``*`` for any.
    Others get 403 ``forbidden_host``."""
    idempotency_ttl: Annotated[float, Field(gt=0)] = 86_400.0
    """Seconds an ``Idempotency-Key`` of a run start is remembered."""
    disconnect_grace: Annotated[float, Field(ge=0)] = 2.0
    """Seconds after a client's disconnect before ``on_disconnect=cancel`` cancels its run,
    unless a reader re-attached meanwhile; 0 cancels at once."""
    sse_retry_ms: Annotated[int, Field(ge=0)] = 1000
    """The ``retry:`` field every event stream starts with (an EventSource's reconnect delay)."""
    stream_token_ttl: Annotated[float, Field(gt=0)] = 300.0
    """Seconds an ``events_url``'s token is valid (authentication on)."""
    stream_token_secret: SecretStr | None = Field(default=None, repr=False)
    """Key of the stream tokens' HMAC; unset: generated once per deployment (shared through
    Redis when there is one)."""
    frame_ancestors: str = ""
    """Origins allowed to frame the UI (CSP ``frame-ancestors`` sources, space- or
    comma-separated); empty: none may (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``)."""

    # --- service tuning ---------------------------------------------------------------------
    demo_token_delay: Annotated[float, Field(ge=0)] = 0.02
    demo_slow_seconds: Annotated[float, Field(ge=0)] = 5.0
    log_level: LogLevel = "info"
    log_format: LogFormat = "auto"
    """``text`` (readable lines), ``json`` (one object per line) or ``auto``: text when stderr
    is a terminal, JSON otherwise (``app.telemetry.logs``)."""
    warmup: bool = True
    """``AGENT_WARMUP=0``: no warm-up model call at start; an agent is then ready once it is
    configured (preflight passed, MCP tools discovered) rather than once its model answered."""
    confirmation_timeout: Annotated[float, Field(gt=0)] = 300.0
    per_principal_max_runs: Annotated[int | None, Field(ge=1)] = None
    """Runs (executing plus queued) one principal may have at once; unset = no own cap."""
    lease_seconds: Annotated[float, Field(gt=0)] = 15.0
    resume_runs: bool = True
    """Resume a run whose worker died, was fenced off or shut down from its last checkpoint
    (``run.resumed``); False: such runs end ``run.failed`` ``worker_lost``."""
    max_resumes: Annotated[int, Field(ge=0)] = 3
    """Hand-overs of one run before it fails ``worker_lost`` instead of resuming again."""
    event_log_ttl: Annotated[float, Field(ge=0)] = 600.0
    """Seconds a finished run's event log stays available for replay."""
    stateless_retention: Annotated[float, Field(gt=0)] = 3600.0
    """Seconds a stateless protocol call's session (a chat completion, a response without a
    conversation or with ``store: false``, an MCP call without ``session_id``) is kept after
    its last use; then it is deleted with its messages and runs (``app.runs.stateless``)."""
    file_retention: Annotated[float, Field(gt=0)] = 7 * 86400.0
    """Seconds an uploaded file that no stored conversation refers to is kept; then every
    worker's sweep deletes it (and its bytes, when no other file has the same)."""
    event_log_max_events: Annotated[int, Field(ge=16)] = 100_000
    """Events kept per run; beyond it the oldest are dropped (a replay from there has a gap)."""
    redis_max_connections: Annotated[int, Field(ge=2)] = 128
    """Connections a worker opens to Redis at most (its blocking read has one more): calls
    beyond them wait for a free one."""
    redis_prefix: Annotated[str, Field(min_length=1, max_length=64)] = "agent:"
    """Prefix of every Redis key and channel: services (or test runs) sharing one Redis
    each use their own."""
    sse_ping: Annotated[float, Field(gt=0)] = 15.0
    """Seconds of silence after which an SSE stream gets a ``: ping`` comment."""
    send_timeout: Annotated[float, Field(gt=0)] = 30.0
    """Seconds one write to a client may block before the client counts as gone."""
    keep_alive_timeout: Annotated[float, Field(gt=0)] = 5.0
    """Seconds an idle client connection is kept open. Behind a load balancer, set it above
    the balancer's own idle timeout, or the balancer may reuse a connection being closed."""
    max_header_bytes: Annotated[int, Field(ge=1024)] = 65_536
    """Bytes of a request line and headers at most; a larger head gets 431."""
    header_timeout: Annotated[float, Field(gt=0)] = 10.0
    """Seconds a connection may take to send a complete request head before it is closed."""
    max_connections: Annotated[int, Field(ge=1)] = 4096
    """Open client connections per worker (lowered to what the file limit holds); one beyond
    it is answered 503 at once and closed."""
    backend_timeout: Annotated[float, Field(gt=0)] = 5.0
    """Seconds one call to PostgreSQL or Redis may take (connecting and waiting for a pooled
    connection included) before it fails as unavailable (503)."""
    client_timeout: Annotated[float | None, Field(gt=0, allow_inf_nan=False)] = None
    """Seconds for every HTTP phase of a provider call (connect, each read...); unset keeps the
    SDK's own (600 s). A stalled upstream then fails the call and the next model takes over."""
    client_max_retries: Annotated[int | None, Field(ge=0)] = None
    """The provider SDK's own retries of one call; unset keeps its default (2)."""
    a2a_v03: bool = False
    """``AGENT_A2A_V03=1``: also speak A2A 0.3 (its JSON-RPC methods and REST paths) at
    ``/a2a/{agent}``, for clients that predate 1.0."""
    debug_endpoints: bool = False
    """Serve ``GET /debug/state`` (counts of live runs, tasks, locks, subscribers)."""
    workers: Annotated[int, Field(ge=1)] = 1
    """Set by ``agent-server --workers``; the app only reads it."""
    budgets: str = ""
    """Daily token budgets: ``principal:NAME=TOKENS`` and ``agent:NAME=TOKENS`` entries,
    comma-separated (``principal:*`` for every principal); see ``app.admission.budgets``."""
    budget_reserve_tokens: Annotated[int, Field(ge=0)] = 1000
    """Tokens a run reserves of its budgets when admitted, replaced by its use at its end."""
    trace_content: bool = False
    """``AGENT_TRACE_CONTENT=1``: traces (when ``OTEL_*`` turns them on) also record prompts,
    answers, system instructions and tool arguments and results."""
    scheduler_enabled: bool = True
    """``AGENT_SCHEDULER_ENABLED=0``: this worker fires no scheduled runs (the others do;
    the schedules' API still works)."""
    scheduler_poll_interval: Annotated[float, Field(gt=0, le=3600)] = 1.0
    """Seconds between a worker's looks for due schedules (and firings to take over)."""
    scheduler_lease_seconds: Annotated[float, Field(gt=0)] = 30.0
    """How long a claimed firing is its worker's; a firing whose worker died is taken over
    by another after this."""
    scheduler_misfire_grace: Annotated[float, Field(ge=0)] = 60.0
    """A due time found later than this (the service was down) is missed, and follows the
    schedule's ``misfire`` (``skip`` or ``run_once``)."""
    scheduler_max_attempts: Annotated[int, Field(ge=1)] = 20
    """Starts of one firing refused by admission (retried after their Retry-After) before
    the firing is recorded as failed."""
    scheduler_max_per_principal: Annotated[int, Field(ge=1)] = 100
    """Schedules one principal may have; one more is a 422 ``too_many_schedules``."""
    scheduler_min_interval: Annotated[float, Field(ge=0)] = 60.0
    """Seconds a cron expression must leave between two firings at least (``* * * * * *``
    fires every second); a shorter one is a 422 ``cron_too_frequent``."""
    allow_unshared_workers: bool = False
    """``AGENT_ALLOW_UNSHARED_WORKERS=1``: let ``agent-server --workers N`` (N > 1) start
    without ``AGENT_REDIS_URL``, each worker with its own runs, logs and session locks."""
    webhook_secret: SecretStr | None = Field(default=None, repr=False)
    """The Standard Webhooks signing secret (``whsec_`` and base64) of every webhook endpoint
    without its own in ``AGENT_WEBHOOK_SECRETS``; unset (and no per-endpoint one): a run's
    ``webhook_url`` is refused (422 ``webhook_url_refused``)."""
    webhook_secrets: SecretStr | None = Field(default=None, repr=False)
    """Per-endpoint secrets: ``ORIGIN=whsec_...`` pairs, comma-separated (``ORIGIN`` as in
    ``https://hooks.example.com`` or ``http://10.0.0.5:8080``)."""
    webhook_allow_private: bool = False
    """``AGENT_WEBHOOK_ALLOW_PRIVATE=1``: deliver to loopback, private, link-local and other
    non-public addresses too (tests, or receivers inside the deployment's own network)."""
    webhook_max_attempts: Annotated[int, Field(ge=1, le=100)] = 8
    """Attempts of one webhook message before it counts as failed."""
    webhook_backoff: Annotated[float, Field(gt=0)] = 5.0
    """Seconds before the first retry; each further one waits twice as long (with jitter)."""
    webhook_backoff_max: Annotated[float, Field(gt=0)] = 3600.0
    """The longest wait between two attempts, in seconds."""
    webhook_timeout: Annotated[float, Field(gt=0)] = 10.0
    """Seconds one delivery attempt may take (connect, send, the receiver's answer)."""
    webhook_retention: Annotated[float, Field(gt=0)] = 7 * 86400.0
    """Seconds a delivered or failed webhook message (and its attempts) is kept in the outbox
    before it is deleted; pending ones are kept until they settle."""
    webhook_poll_interval: Annotated[float, Field(gt=0)] = 2.0
    """Seconds between two looks at the outbox for due messages (a worker's own new ones
    go out at once)."""

    @field_validator("model")
    @classmethod
    def _model_not_empty(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError(
                "AGENT_MODEL is empty; use demo, openai:MODEL, openai-responses:MODEL, "
                "anthropic:MODEL"
            )
        return value

    @field_validator("frame_ancestors")
    @classmethod
    def _source_list(cls, value: str) -> str:
        sources = value.replace(",", " ").split()
        for source in sources:
            # a CSP source expression: printable ASCII without the directive separator
            if not source.isascii() or not source.isprintable() or ";" in source:
                raise ValueError(
                    f"AGENT_FRAME_ANCESTORS: {source!r} is not a CSP source (use origins like "
                    "https://portal.example.com, or 'self', separated by spaces)"
                )
        return " ".join(sources)

    @field_validator("budgets")
    @classmethod
    def _budget_entries(cls, value: str) -> str:
        parse_budgets(value)  # raises ValueError naming the entry
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        parse_secret(value.get_secret_value().strip())  # a ValueError never quotes it
        return SecretStr(value.get_secret_value().strip())

    @field_validator("webhook_secrets")
    @classmethod
    def _webhook_secrets(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        parse_endpoint_secrets(value.get_secret_value())
        return value

    @field_validator("redis_url", "config")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value if value and value.strip() else None

    @field_validator("database_url")
    @classmethod
    def _empty_is_the_default(cls, value: str) -> str:
        # ``AGENT_DATABASE_URL=`` (an env file's empty line) means the embedded default
        return value if value.strip() else str(cls.model_fields["database_url"].default)

    @field_validator("stream_token_secret")
    @classmethod
    def _blank_secret_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        return value

    @field_validator("api_keys")
    @classmethod
    def _blank_keys_are_unset(cls, value: SecretStr | None) -> SecretStr | None:
        # the pairs are checked by ``api_key_map``, whose errors never quote a key (a
        # validation error here would print the whole value)
        if value is None or not value.get_secret_value().strip():
            return None
        return value

    @field_validator(
        "queue_timeout",
        "run_timeout",
        "drain_timeout",
        "demo_token_delay",
        "demo_slow_seconds",
        "confirmation_timeout",
        "lease_seconds",
        "event_log_ttl",
        "sse_ping",
        "send_timeout",
        "keep_alive_timeout",
        "header_timeout",
        "backend_timeout",
        "idempotency_ttl",
        "disconnect_grace",
        "stream_token_ttl",
        "webhook_backoff",
        "webhook_backoff_max",
        "webhook_timeout",
        "webhook_poll_interval",
        "webhook_retention",
        "stateless_retention",
        "file_retention",
    )
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value

    # --- derived views ----------------------------------------------------------------------

    @property
    def fallback_model_list(self) -> list[str]:
        """``AGENT_FALLBACK_MODELS`` as a list."""
        return _split(self.fallback_models)

    @property
    def cors_origin_list(self) -> list[str]:
        """``AGENT_CORS_ORIGINS`` as a list."""
        return _split(self.cors_origins)

    @property
    def allowed_host_list(self) -> list[str]:
        """``AGENT_ALLOWED_HOSTS`` as a list."""
        return _split(self.allowed_hosts)

    @property
    def api_key_map(self) -> dict[str, str]:
        """Bearer key → principal; empty when authentication is off.

        Raises ValueError for a malformed ``AGENT_API_KEYS`` (without quoting any key).
        """
        if self.api_keys is None:
            return {}
        return parse_api_keys(self.api_keys.get_secret_value())

    @property
    def debug(self) -> bool:
        """True at ``AGENT_LOG_LEVEL=debug``: prompts and arguments may then be logged."""
        return self.log_level == "debug"


def known_variables() -> frozenset[str]:
    """Every ``AGENT_*`` variable the service reads: one per ``Settings`` field."""
    prefix = Settings.model_config.get("env_prefix", "")
    return frozenset(f"{prefix}{name}".upper() for name in Settings.model_fields)


def unknown_variables(
    environ: Mapping[str, str], also_known: Iterable[str] = ()
) -> list[tuple[str, str | None]]:
    """The ``AGENT_*`` names of ``environ`` that no setting reads (nor ``also_known``, such as
    the variables ``AGENT_CONFIG`` refers to), sorted, each with the closest known name (or
    None when none is close)."""
    known = sorted(known_variables() | set(also_known))
    unknown: list[tuple[str, str | None]] = []
    for name in sorted(environ):
        # pydantic-settings matches names whatever their case: so does this
        upper = name.upper()
        if upper.startswith("AGENT_") and upper not in known:
            close = difflib.get_close_matches(upper, known, n=1)
            unknown.append((name, close[0] if close else None))
    return unknown
