"""The runtime's checkpoint seam (``agent_runtime.checkpoints``), as the service reaches it.

Looked up at import, not imported by name: a runtime without the seam (resume not built yet)
leaves ``AVAILABLE`` False, and the service then neither saves checkpoints nor resumes runs
(they end ``worker_lost`` as before) instead of failing to start.
"""

from __future__ import annotations

import importlib
from typing import Any

from agent_runtime.events import AgentEventType

__all__ = ["AVAILABLE", "RUN_RESUMED", "CheckpointError", "RunCheckpoint"]

RunCheckpoint: Any = None
CheckpointError: type[Exception] = ValueError
try:
    _checkpoints = importlib.import_module("agent_runtime.checkpoints")
    RunCheckpoint = _checkpoints.RunCheckpoint
    CheckpointError = _checkpoints.CheckpointError
except (ImportError, AttributeError):  # pragma: no cover - a runtime without the seam
    pass

RUN_RESUMED: Any = getattr(AgentEventType, "RUN_RESUMED", None)
AVAILABLE = RunCheckpoint is not None and RUN_RESUMED is not None
"""True when the runtime offers checkpoints and ``AgentCore.resume``."""
