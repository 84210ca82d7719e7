"""What an extension is told: lifecycle notices (``AgentExtension.on_event``) and the answers
addressed to a waiting run (``AgentExtension.accept``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ExtensionEvent", "ExternalEvent", "RunCancelledEvent"]


@dataclass(frozen=True, slots=True)
class ExtensionEvent:
    """Base class of the notices an extension receives in ``on_event``."""


@dataclass(frozen=True, slots=True)
class RunCancelledEvent(ExtensionEvent):
    """The run was cancelled; release everything held for it.

    Cancellation is not an error, so it never reaches ``on_error``. ``reason`` says why:
    ``consumer_closed`` (the stream was closed early), ``cancelled`` (the task running the run
    was cancelled), or the reason given to ``AgentCore.cancel_run`` (for example
    ``cancel_requested``, ``client_disconnected`` or ``shutdown``).
    """

    reason: str = "cancelled"


@dataclass(frozen=True, slots=True)
class ExternalEvent:
    """An answer addressed to a waiting run: a ``name`` and a JSON-like ``payload``.

    What the payload must hold is up to the extension that receives it. The payload is copied
    (shallowly) on construction, so later changes to the caller's dict do not reach it.
    """

    name: str
    payload: dict[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ExternalEvent.name must be a str, got {type(self.name).__name__}")
        if not self.name.strip():
            raise ValueError("ExternalEvent.name must not be empty or blank")
        if not isinstance(self.payload, dict):
            raise TypeError(
                f"ExternalEvent.payload must be a dict, got {type(self.payload).__name__}"
            )
        bad = [key for key in self.payload if not isinstance(key, str)]
        if bad:
            raise TypeError(f"ExternalEvent.payload keys must be strings; found {bad[0]!r}")
        object.__setattr__(self, "payload", dict(self.payload))
