"""The worker supervisor of ``agent-server --workers N``: uvicorn's, saying why it replaced a
worker.

uvicorn's own supervisor logs a replaced worker as "Child process [pid] died" whatever
happened. An operator needs to tell a worker that crashed (its exit status), one the kernel
killed (a signal: SIGKILL is what the OOM killer sends) and one that stopped answering the
supervisor's health check (a blocked event loop, or a machine too loaded to import the app in
time) apart: each has a different fix.
"""

from __future__ import annotations

import logging
import signal

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

__all__ = ["Supervisor", "replacement_reason"]

logger = logging.getLogger("app.supervisor")


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


class Supervisor(Multiprocess):
    """uvicorn's multiprocess supervisor, logging the reason of every replacement."""

    def keep_subprocess_alive(self) -> None:
        before: list[Process] = list(self.processes)
        # None while running: a worker found already ended stopped on its own
        ended = [worker.process.exitcode for worker in before]
        super().keep_subprocess_alive()
        for worker, exitcode, now in zip(before, ended, self.processes, strict=True):
            if now is worker or exitcode == STARTUP_FAILURE:
                continue  # kept, or uvicorn's own "failed to start" (it stops the service)
            reason = replacement_reason(
                exitcode if exitcode is not None else worker.process.exitcode,
                answered=exitcode is not None,
                timeout=self.config.timeout_worker_healthcheck,
            )
            logger.warning(
                "worker replaced",
                extra={"pid": worker.pid, "replacement_pid": now.pid, "reason": reason},
            )
