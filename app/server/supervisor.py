"""The worker supervisor of ``agent-server --workers N``: uvicorn's, with a listening socket of
its own for each worker, and saying why it replaced a worker.

**One socket per worker.** With one listening socket shared by every worker, whichever worker
is awake when connections arrive accepts them all (an event loop accepts every pending
connection at once): ten keep-alive clients, or a reverse proxy's pool of upstream
connections, all land on one worker while the others idle. On Linux each worker gets a socket
of its own, all bound to the same address with ``SO_REUSEPORT``, and the kernel spreads new
connections over the sockets that listen, by a hash of each connection's addresses. A socket
listens once its worker is serving and is gone with its worker (the supervisor keeps no copy):
a worker still starting, or one that died, is given no connection, and a replacement binds a
socket of its own. Elsewhere (and for a Unix socket or an inherited file descriptor) the
workers share uvicorn's socket. An address that cannot be bound (a port already in use) is a
``ListenError`` before any worker starts, which ``agent-server`` reports as its one start-error
line.

**Why a worker was replaced.** uvicorn's own supervisor logs a replaced worker as "Child
process [pid] died" whatever happened. An operator needs to tell a worker that crashed (its
exit status), one the kernel killed (a signal: SIGKILL is what the OOM killer sends) and one
that stopped answering the supervisor's health check (a blocked event loop, or a machine too
loaded to import the app in time) apart: each has a different fix.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from app.server.listen import listen_error

__all__ = ["Listeners", "Supervisor", "replacement_reason"]

logger = logging.getLogger("app.server.supervisor")


def replacement_reason(exitcode: int | None, *, answered: bool, timeout: float) -> str:
    """Why a worker was replaced, from its exit status (negative: the signal that ended it)
    and whether it had stopped on its own before the supervisor looked (``answered`` False:
    it was running, but did not answer the health check, and was killed for it)."""
    if not answered:
        return f"it did not answer the supervisor's health check within {timeout:g} s (killed)"
    if exitcode is None:
        return "it stopped for an unknown reason"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (what the kernel's out-of-memory killer sends)" if name == "SIGKILL" else ""
        return f"it was killed by {name}{hint}"
    return f"it exited with status {exitcode}"


def _spreads(config: Config) -> bool:
    """Whether the kernel can spread connections over one socket per worker here."""
    return (
        sys.platform == "linux"
        and hasattr(socket, "SO_REUSEPORT")
        and config.uds is None
        and config.fd is None
    )


class Listeners:
    """The listening sockets of the workers: a new one for each worker (``SO_REUSEPORT``,
    Linux), or uvicorn's one socket for all of them."""

    def __init__(self, config: Config) -> None:
        """Bind (or probe) the address; ``ListenError`` when it cannot be bound."""
        self._shared: socket.socket | None = None
        if not _spreads(config):
            self._shared = config.bind_socket()
            return
        host = config.host or "127.0.0.1"
        self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # A socket without SO_REUSEPORT first: if anything listens on the address already
        # (another agent-server started by mistake, say), this bind fails as it would without
        # the option, instead of joining that server's group and splitting its traffic.
        try:
            with socket.socket(self._family) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, config.port))
                self._address: tuple[str, int] = (host, probe.getsockname()[1])
        except OSError as exc:
            raise listen_error(host, config.port, exc) from exc
        scheme = "https" if config.is_ssl else "http"
        where = f"[{host}]" if self._family == socket.AF_INET6 else host
        logger.info(
            "serving on %s://%s:%d, a listening socket per worker (SO_REUSEPORT)",
            scheme,
            where,
            self._address[1],
        )

    @property
    def address(self) -> tuple[str, int]:
        """The host and port the workers listen on."""
        if self._shared is not None:
            host, port = self._shared.getsockname()[:2]
            return str(host), int(port)
        return self._address

    @contextlib.contextmanager
    def for_worker(self) -> Iterator[list[socket.socket]]:
        """The sockets of a worker being started: the shared one, or one bound for it, which
        this process closes once the worker is started (the worker holds a duplicate).
        ``OSError`` when the address cannot be bound."""
        if self._shared is not None:
            yield [self._shared]
            return
        sock = self._bind()
        try:
            yield [sock]
        finally:
            sock.close()

    def _bind(self) -> socket.socket:
        sock = socket.socket(self._family)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(self._address)
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(True)
        return sock


class Supervisor(Multiprocess):
    """uvicorn's multiprocess supervisor, each worker on a socket of its own (``Listeners``),
    logging the reason of every replacement."""

    def __init__(self, config: Config, listeners: Listeners) -> None:
        super().__init__(config, sockets=[])
        self.listeners = listeners

    def _start(self) -> Process:
        """A worker started on its socket; ``OSError`` when none can be bound."""
        with self.listeners.for_worker() as sockets:
            process = Process(self.config, sockets)
            process.start()
        return process

    def init_processes(self) -> None:
        """Start the workers; ``ListenError`` (the workers started stopped again) when one
        cannot be given a socket (the address was taken since ``Listeners`` probed it)."""
        self.processes = []
        try:
            for _ in range(self.processes_num):
                self.processes.append(self._start())
        except OSError as exc:
            self.terminate_all()
            self.join_all()
            host, port = self.listeners.address
            raise listen_error(host, port, exc) from exc

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        timeout = self.config.timeout_worker_healthcheck
        for slot, worker in enumerate(self.processes):
            ended = worker.process.exitcode  # None while running
            if worker.is_alive(timeout=timeout):
                continue
            worker.kill()  # hung: it did not answer the ping
            worker.join()
            if worker.exitcode == STARTUP_FAILURE:
                # it failed before serving: the app or its configuration is broken and every
                # replacement would fail the same way
                logger.error("a worker failed to start; stopping", extra={"pid": worker.pid})
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            try:
                replacement = self._start()
            except OSError as exc:
                # tried again at the next check; the other workers serve meanwhile
                logger.error("cannot listen for a replacement worker: %s", exc)
                continue
            self.processes[slot] = replacement
            logger.warning(
                "worker replaced",
                extra={
                    "pid": worker.pid,
                    "replacement_pid": replacement.pid,
                    "reason": replacement_reason(
                        ended if ended is not None else worker.exitcode,
                        answered=ended is not None,
                        timeout=timeout,
                    ),
                },
            )

    def restart_all(self) -> None:
        """SIGHUP: each worker's replacement serves before the old one is stopped."""
        for slot, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            try:
                new = self._start()
            except OSError as exc:
                logger.error("cannot listen for a new worker; the restart stops: %s", exc)
                return
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    logger.error(
                        "a new worker was not ready in time; the restart stops there",
                        extra={"pid": new.pid, "kept_pid": old.pid},
                    )
                return
            old.terminate()
            old.join()
            self.processes[slot] = new

    def handle_ttin(self) -> None:
        logger.info("SIGTTIN: one more worker")
        try:
            self.processes.append(self._start())
        except OSError as exc:
            logger.error("cannot listen for one more worker: %s", exc)
            return
        self.processes_num += 1

    def handle_ttou(self) -> None:
        if self.processes_num <= 1:
            logger.info("SIGTTOU: already one worker")
            return
        logger.info("SIGTTOU: one worker fewer")
        self.processes_num -= 1
        worker = self.processes.pop()
        worker.terminate()
        worker.join()
