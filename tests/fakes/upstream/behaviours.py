"""What a test scripts: the behaviours the fake upstream renders on either wire.

A behaviour answers one request: a streamed answer (``Text``, ``ToolCalls``), a failure
(``Status``, ``Drop``, ``Stall``, ``Endless``, ``StreamError``, ``Malformed``), a choice made
from the request itself (``Respond``), or a capability job held at a gate (``Hold``).

An answer may reason first (``reasoning``: ``Reasoning`` items, rendered as each wire has it)
and report more than its token counts (``details``: ``UsageDetails``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..capability_wire import Hold
from .gates import Gate
from .recording import RecordedRequest

__all__ = [
    "WORDS",
    "Behaviour",
    "Drop",
    "Endless",
    "FakeToolCall",
    "Malformed",
    "Reasoning",
    "Respond",
    "Stall",
    "Status",
    "StreamError",
    "Text",
    "ToolCalls",
    "UsageDetails",
    "status",
]

# one streamed chunk per word (with its trailing space)
WORDS = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True)
class Reasoning:
    """The model's reasoning before its answer, streamed one word per delta.

    Each wire renders it its own way: Anthropic a ``thinking`` block (``thinking_delta``s, then
    a ``signature_delta``), or a ``redacted_thinking`` block when ``redacted`` gives its
    ``data``; the Responses API a ``reasoning`` item (summary deltas, and ``encrypted_content``
    in the item's ``output_item.done``); Chat Completions ``reasoning_content`` deltas (as
    DeepSeek and vLLM send). ``signature``, ``encrypted`` and ``id`` default to values derived
    from the text, so a test can predict them.
    """

    text: str = ""
    signature: str | None = None
    redacted: str | None = None
    encrypted: str | None = None
    id: str | None = None

    def _digest(self) -> str:
        return hashlib.sha256(f"{self.text}|{self.redacted}".encode()).hexdigest()[:16]

    @property
    def signature_value(self) -> str:
        """The Anthropic signature sent for this block."""
        return self.signature if self.signature is not None else f"sig-{self._digest()}"

    @property
    def encrypted_value(self) -> str:
        """The Responses ``encrypted_content`` sent for this item."""
        return self.encrypted if self.encrypted is not None else f"enc-{self._digest()}"

    @property
    def item_id(self) -> str:
        """The Responses item id."""
        return self.id if self.id is not None else f"rs_{self._digest()}"

    def pieces(self) -> list[str]:
        return WORDS.findall(self.text)


@dataclass(frozen=True)
class UsageDetails:
    """Token counts beyond ``(input, output)``, each sent in the wire's own field as given.

    ``cached``: Anthropic ``cache_read_input_tokens``, OpenAI ``cached_tokens``;
    ``cache_write``: Anthropic ``cache_creation_input_tokens``, OpenAI ``cache_write_tokens``
    (Chat: only beside ``cached``); ``reasoning``: OpenAI ``reasoning_tokens``, Anthropic
    ``output_tokens_details.thinking_tokens``. The scripted ``usage`` is sent as each wire
    means it: Anthropic's ``input_tokens`` are the uncached ones, OpenAI's include the cached.
    """

    cached: int | None = None
    cache_write: int | None = None
    reasoning: int | None = None


@dataclass(frozen=True)
class Text:
    """A streamed text answer. ``chunks`` defaults to one chunk per word.

    ``hold`` parks the stream after its first chunk until the gate opens; ``delay`` is the
    pause between chunks. ``usage`` is ``(input_tokens, output_tokens)``; ``details`` adds
    cache and reasoning counts. ``reasoning`` comes before the text.
    """

    text: str
    chunks: Sequence[str] | None = None
    usage: tuple[int, int] | None = None
    hold: Gate | None = None
    delay: float = 0.0
    reasoning: Sequence[Reasoning] = ()
    details: UsageDetails | None = None

    def pieces(self) -> list[str]:
        return list(self.chunks) if self.chunks is not None else WORDS.findall(self.text)


@dataclass(frozen=True)
class FakeToolCall:
    """One tool call; its JSON arguments are streamed in ``fragments`` pieces."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None
    fragments: int = 3

    def argument_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))

    def argument_pieces(self) -> list[str]:
        raw = self.argument_text()
        count = max(1, min(self.fragments, len(raw) or 1))
        size = -(-len(raw) // count) if raw else 1
        return [raw[i : i + size] for i in range(0, len(raw), size)] or [""]


@dataclass(frozen=True)
class ToolCalls:
    """A streamed answer that calls tools, optionally after some text (and reasoning)."""

    calls: Sequence[FakeToolCall]
    text: str = ""
    usage: tuple[int, int] | None = None
    hold: Gate | None = None
    reasoning: Sequence[Reasoning] = ()
    details: UsageDetails | None = None


@dataclass(frozen=True)
class Status:
    """An error status with the protocol's JSON error body (and extra headers)."""

    status: int
    message: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    error_type: str | None = None


@dataclass(frozen=True)
class Drop:
    """Close the connection: before any response by default; with ``send_headers`` after the
    stream's headers and preamble; with ``after_chunks=N`` after N content chunks of ``text``.
    ``reset`` aborts with a TCP RST instead of a clean close. ``clean`` ends the HTTP body
    properly (its last chunk, connection kept) but without the protocol's end of the answer
    (OpenAI's ``finish_reason`` and ``[DONE]``, Anthropic's ``message_delta`` and
    ``message_stop``), as a proxy cutting an answer short may do."""

    after_chunks: int = 0
    text: str = "partial answer that never ends"
    send_headers: bool = False
    reset: bool = False
    clean: bool = False


@dataclass(frozen=True)
class Stall:
    """Read the request and never answer (until the client gives up or the server stops)."""


@dataclass(frozen=True)
class Endless:
    """Start a stream, send ``after_chunks`` chunks of ``text``, then never finish it.

    With ``ping_interval`` a keep-alive keeps the connection busy (so no read timeout fires):
    an SSE comment on the OpenAI wire, a ``ping`` event on the Anthropic one (as Anthropic sends).
    """

    text: str = "this stream never ends"
    after_chunks: int = 1
    ping_interval: float | None = None


@dataclass(frozen=True)
class StreamError:
    """A 200 stream that reports an error event after ``after_chunks`` chunks of ``text``."""

    error_type: str = "overloaded_error"
    message: str = "the upstream is overloaded"
    after_chunks: int = 0
    text: str = "partial answer"


@dataclass(frozen=True)
class Malformed:
    """A 200 whose body is not the protocol's JSON or SSE, as a broken proxy or aimock's
    ``malformed`` chaos sends: ``body`` with ``content_type``, the same for a streamed request
    and a whole one. ``sse=True`` sends it as one SSE ``data:`` event of a
    ``text/event-stream`` instead (an event whose data is not JSON)."""

    body: bytes = b"{malformed json: <<<chaos>>>"
    content_type: str = "application/json"
    sse: bool = False


@dataclass(frozen=True)
class Respond:
    """Choose the behaviour from the request itself (echo servers, routing by content)."""

    choose: Callable[[RecordedRequest], Behaviour]


Behaviour: TypeAlias = (
    Text | ToolCalls | Status | Drop | Stall | Endless | StreamError | Malformed | Respond | Hold
)


def status(
    code: int,
    message: str = "",
    *,
    retry_after: float | None = None,
    retry_after_ms: float | None = None,
    headers: Mapping[str, str] | None = None,
    error_type: str | None = None,
) -> Status:
    """A ``Status`` with optional ``retry-after`` / ``retry-after-ms`` headers."""
    extra = dict(headers or {})
    if retry_after is not None:
        extra["retry-after"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        extra["retry-after-ms"] = f"{retry_after_ms:g}"
    return Status(code, message or f"fake upstream answered {code}", extra, error_type)
