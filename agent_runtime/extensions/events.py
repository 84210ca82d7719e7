"""Lifecycle notices delivered to ``AgentExtension.on_event``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExtensionEvent", "RunCancelledEvent"]


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
