"""Wire events: a run's AgentEvents as SSE frames, encoded once.

``{"type", "seq", "run_id", "session_id", "ts", "data"}`` in one ``data:`` line, with the
``id:`` (= seq) and ``event:`` (= type) lines before it. This is the hot path: the run and
session ids are JSON-encoded once per run, the timestamp's date part once per second, and
only each event's own ``data`` object goes through ``json.dumps``.
"""

from __future__ import annotations

import json
import math
import re
import time
from json.encoder import encode_basestring
from typing import Any

from app.bus.base import WireEvent

__all__ = ["PING_FRAME", "WireEncoder", "delta_json", "encode_data", "iso_ms"]

# a comment line alone, without the blank line that ends an event: some clients (httpx-sse)
# dispatch an empty event at a blank line once an id was seen, where the spec says not to
PING_FRAME = b": ping\n"

_dumps = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
).encode

_second = -1
_prefix = ""
_MILLIS = tuple(f".{millis:03d}Z" for millis in range(1000))


def iso_ms(ts: float) -> str:
    """A Unix time as ISO 8601 UTC with milliseconds: ``2026-11-30T12:00:00.000Z``."""
    global _second, _prefix
    second = int(ts)
    if second != _second:
        _prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second = second
    return _prefix + _MILLIS[int((ts - second) * 1000)]


def delta_json(delta: str | None) -> str:
    """The ``data`` object of a ``text.delta`` or ``reasoning.delta`` event, encoded (the most
    frequent events)."""
    return '{"delta":' + ("null" if delta is None else encode_basestring(delta)) + "}"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def encode_data(data: dict[str, Any]) -> str:
    """An event's ``data`` object as JSON; non-finite numbers become null."""
    try:
        return _dumps(data)
    except ValueError:  # NaN or infinity (a tool's result): JSON has no such numbers
        return _dumps(_finite(data))


class WireEncoder:
    """Encodes the events of one run."""

    __slots__ = ("_ids",)

    def __init__(self, run_id: str, session_id: str) -> None:
        self._ids = f'"run_id":{_dumps(run_id)},"session_id":{_dumps(session_id)}'

    def encode(self, seq: int, type_: str, ts: float, data: dict[str, Any]) -> WireEvent:
        """The wire event ``seq`` of type ``type_`` (an SSE event name: no escaping needed)."""
        return self.encode_json(seq, type_, ts, encode_data(data))

    def encode_json(self, seq: int, type_: str, ts: float, data_json: str) -> WireEvent:
        """``encode`` with the ``data`` object already encoded."""
        frame = (
            f'id: {seq}\nevent: {type_}\ndata: {{"type":"{type_}","seq":{seq},{self._ids},'
            f'"ts":"{iso_ms(ts)}","data":{data_json}}}\n\n'
        )
        return WireEvent(seq, type_, _utf8(frame))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(frame: str) -> bytes:
    try:
        return frame.encode()
    except UnicodeEncodeError:
        # a lone surrogate (a model's or a tool's text) has no UTF-8 form; it can only sit in a
        # JSON string, where its \uXXXX escape is valid and decodes back to the same string
        return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", frame).encode()
