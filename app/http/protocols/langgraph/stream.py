"""A run's log as a LangGraph stream: ``metadata`` first, then the parts of the requested
stream modes, each frame carrying the log's ``seq`` as its SSE ``id`` (so a client that
reconnects with ``Last-Event-ID`` reads on from there, on any worker).

The stream ends where LangGraph's does: at the run's end, or at an interrupt (the run waits
for its answer, which a later ``command: {"resume": ...}`` brings).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from app.bus.base import WireEvent
from app.http.protocols.common import dumps, event_document
from app.http.protocols.langgraph.fold import RunFold

__all__ = ["STREAM_MODES", "LangGraphEncoder", "stream_modes"]

STREAM_MODES: Final = frozenset(
    {"values", "messages", "messages-tuple", "updates", "events", "custom", "debug"}
)
"""The stream modes a run may ask for (``events`` and ``debug`` carry nothing here)."""


def stream_modes(value: str | Sequence[str] | None) -> frozenset[str]:
    """The requested stream modes (``values`` when none); ``messages`` means the tuples."""
    modes = [value] if isinstance(value, str) else list(value or ["values"])
    unknown = [m for m in modes if m not in STREAM_MODES]
    if unknown:
        raise ValueError(f"unknown stream mode {unknown[0]!r}")
    return frozenset("messages" if m == "messages-tuple" else m for m in modes)


class LangGraphEncoder:
    """Our wire events → LangGraph SSE frames, for one response (a ``PausingEncoder``)."""

    def __init__(self, fold: RunFold, modes: Iterable[str], *, metadata: bool = True) -> None:
        self._fold = fold
        self._modes = frozenset(modes)
        self._metadata = metadata
        self._opened = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def paused(self) -> bool:
        return bool(self._fold.interrupts) and not self._fold.ended

    def pause(self) -> bytes:
        self._done = True
        return b""

    def opening(self) -> bytes:
        self._opened = True
        if not self._metadata:
            return b""
        return _frame("metadata", {"run_id": self._fold.run_id, "attempt": 1}, None)

    def encode(self, events: Sequence[WireEvent]) -> bytes:
        out: list[bytes] = [] if self._opened else [self.opening()]
        for event in events:
            if self._done:
                break
            for name, data in self._fold.feed(event_document(event)):
                if name == "error" or name in self._modes:
                    out.append(_frame(name, data, event.seq))
            if self._fold.ended:
                self._done = True
        return b"".join(out)


def _frame(event: str, data: Any, seq: int | None) -> bytes:
    head = f"event: {event}\ndata: ".encode()
    tail = b"\n\n" if seq is None else f"\nid: {seq}\n\n".encode()
    return head + dumps(data).encode() + tail
