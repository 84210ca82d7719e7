"""``agent-server``: serve the app with uvicorn.

Flags: ``--host`` (127.0.0.1), ``--port`` (8000), ``--workers`` (1). Everything else comes
from ``AGENT_*`` environment variables (see ``app.settings``); one the service does not know
is named in a warning, with the closest known name.

Before a worker starts, the settings, the agents' configuration, the backends and the
listening address are checked; a failure is one line on stderr, ``agent-server: cannot
start: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn
from pydantic import ValidationError
from uvicorn.config import STARTUP_FAILURE

from app.agents.config import environment_references
from app.bus.base import BusError
from app.server.lifespan import check_configuration
from app.server.listen import ListenError, Server, bind_sockets
from app.server.supervisor import Listeners, Supervisor
from app.settings import Settings, unknown_variables
from app.storage import PostgresStore, StorageError, database_kind
from app.telemetry.logs import configure_logging, logging_config

__all__ = ["main"]

# after the drain, uvicorn waits this much longer for streams to send their terminal events
_SHUTDOWN_MARGIN = 5.0
# seconds the start-up check gives PostgreSQL to answer
_CHECK_TIMEOUT = 10.0
# With --workers > 1, uvicorn's supervisor replaces a worker that has not answered its health
# ping within this many seconds. Its default (5 s) is shorter than a worker's start on a
# loaded host (importing the app alone took 17-20 s at a load average of 9 on 2 cores), so
# workers were killed in a loop, "Child process died" and nothing else in the log.
_WORKER_HEALTHCHECK_TIMEOUT = 60


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-server",
        description="Serve the agent over HTTP and Server-Sent Events. Configuration comes "
        "from AGENT_* environment variables.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (1); more than one needs AGENT_REDIS_URL (a shared bus)",
    )
    return parser


async def _check_backends(settings: Settings) -> None:
    """Raise unless PostgreSQL (AGENT_DATABASE_URL) and Redis (AGENT_REDIS_URL), when
    configured, answer: a worker is never started against a backend it cannot reach."""
    kind = database_kind(settings.database_url)
    if settings.redis_url is not None:
        from app.bus.redis import check_redis

        await check_redis(settings.redis_url)
    if kind == "postgresql":
        # also applies the migrations once, before the workers race for them
        store = await PostgresStore.connect(
            settings.database_url, min_size=1, max_size=1, operation_timeout=_CHECK_TIMEOUT
        )
        await store.close()


def _warn_unknown_variables(settings: Settings) -> None:
    """Name each ``AGENT_*`` variable no setting reads, with the closest known name.

    A warning, not a refusal: the ``AGENT_`` prefix is not ours alone (a wrapper script, a
    sidecar or another program may use it), ``AGENT_CONFIG`` may refer to variables of its
    own, and a rolling deploy runs versions that know different settings side by side; a
    refusal would turn any of these into an outage. The misspelt setting keeps its default,
    which the warning makes visible.
    """
    logger = logging.getLogger("app.settings")
    for name, close in unknown_variables(os.environ, environment_references(settings.config)):
        if close is not None:
            logger.warning(
                "unknown setting %s (did you mean %s?)",
                name,
                close,
                extra={"variable": name, "suggestion": close},
            )
        else:
            logger.warning(
                "unknown setting %s (no setting has a similar name; docs/api.md lists them)",
                name,
                extra={"variable": name},
            )


def _stopped(signum: int, frame: FrameType | None) -> None:
    """SIGTERM after uvicorn's shutdown: nothing more to do."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until it is stopped; the exit status."""
    args = _parser().parse_args(argv)
    settings = _prepare(args)
    if settings is None or not _startable(settings):
        return 2
    # uvicorn raises the signal that stopped it again once it is done, to die of it (exit
    # status 143 for SIGTERM). A drained, orderly shutdown is a success: the handler it
    # restores and raises into is this one, which lets ``main`` return 0. (A second SIGTERM
    # during the drain still forces uvicorn's own fast exit; SIGINT keeps its status.)
    signal.signal(signal.SIGTERM, _stopped)
    return _serve(args, _uvicorn_config(args, settings))


def _prepare(args: argparse.Namespace) -> Settings | None:
    """The settings, with logging configured; None (said why) when they cannot serve."""
    if args.workers < 1:
        print("agent-server: --workers must be at least 1", file=sys.stderr)
        return None
    # the workers read their settings from the environment; tell them how many they are
    os.environ["AGENT_WORKERS"] = str(args.workers)
    # In-process embedding models (numpy) run one call per worker thread, many at once: BLAS
    # threads of their own per call oversubscribe the cores, 20 to 50 times slower on a busy
    # machine (docs/benchmarks.md). Set before numpy loads; an explicit value wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"agent-server: invalid configuration:\n{exc}", file=sys.stderr)
        return None
    configure_logging(settings.log_level, settings.log_format)
    # here, in the one process that reads the command line: once per start, not per worker
    _warn_unknown_variables(settings)
    if args.workers > 1 and settings.redis_url is None and not _unshared_workers(args, settings):
        return None
    return settings


def _unshared_workers(args: argparse.Namespace, settings: Settings) -> bool:
    """Whether several workers may run without a shared bus (a warning if so)."""
    if not settings.allow_unshared_workers:
        # Each worker would keep its own runs, event logs and session locks: a run's
        # events answer 404 on every other worker and two workers each accept a turn
        # of one session. That is never what a deployment means.
        print(
            f"agent-server: cannot start: --workers {args.workers} needs a shared bus: "
            "set AGENT_REDIS_URL (e.g. redis://127.0.0.1:6379/0), or run --workers 1, "
            "or set AGENT_ALLOW_UNSHARED_WORKERS=1 to run independent workers anyway",
            file=sys.stderr,
        )
        return False
    print(
        "agent-server: warning: --workers > 1 without AGENT_REDIS_URL "
        "(AGENT_ALLOW_UNSHARED_WORKERS=1): each worker has its own runs, event logs and "
        "session locks; a run's events, cancellation and answers reach only the worker "
        "running it",
        file=sys.stderr,
    )
    return True


def _startable(settings: Settings) -> bool:
    """Whether the configuration and the backends pass their checks (said why if not)."""
    try:
        asyncio.run(check_configuration(settings))
    except (ValueError, RuntimeError) as exc:
        print(f"agent-server: cannot start: {exc}", file=sys.stderr)
        return False
    try:
        asyncio.run(_check_backends(settings))
    except (StorageError, BusError, ValueError) as exc:
        # one line: the deployment's logs (and its restart policy) say what to fix
        print(f"agent-server: cannot start: {' '.join(str(exc).split())}", file=sys.stderr)
        return False
    return True


def _uvicorn_config(args: argparse.Namespace, settings: Settings) -> uvicorn.Config:
    graceful = settings.drain_timeout + settings.send_timeout + _SHUTDOWN_MARGIN
    return uvicorn.Config(
        "app.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_config=logging_config(settings.log_level, settings.log_format),
        access_log=settings.debug,
        timeout_graceful_shutdown=math.ceil(graceful),
        timeout_keep_alive=math.ceil(settings.keep_alive_timeout),
        timeout_worker_healthcheck=_WORKER_HEALTHCHECK_TIMEOUT,
        lifespan="on",
        # uvicorn's httptools protocol with a cap and a deadline on request heads and a cap
        # on connections (app.server.http_protocol)
        http="app.server.http_protocol:GuardedHttpToolsProtocol",
    )


def _serve(args: argparse.Namespace, config: uvicorn.Config) -> int:
    """Listen and serve until stopped: one worker in this process, or a supervisor's."""
    try:
        if args.workers == 1:
            # bound before the app starts: uvicorn would bind only after the lifespan (and
            # its warm-up's model calls), and fail with a log line and status 3
            sockets = bind_sockets(args.host, args.port)
        else:
            listeners = Listeners(config)
    except ListenError as exc:
        print(f"agent-server: cannot start: {exc}", file=sys.stderr)
        return 2
    if args.workers == 1:
        server = Server(config)
        try:
            server.run(sockets=sockets)
        finally:
            for sock in sockets:
                sock.close()
        if not server.started:
            return STARTUP_FAILURE
        return 0
    try:
        # uvicorn's supervisor, a listening socket per worker, saying why it replaces one
        Supervisor(config, listeners).run()
    except ListenError as exc:
        print(f"agent-server: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
