"""Rendering a behaviour on a wire: streamed, whole, or one of the failures a test scripts."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from typing import TYPE_CHECKING, TypeAlias

from . import http_wire
from .anthropic_wire import AnthropicWire
from .behaviours import (
    WORDS,
    Behaviour,
    Drop,
    Endless,
    Malformed,
    Stall,
    Status,
    StreamError,
    Text,
    ToolCalls,
)
from .frames import Frame, usage_or_default
from .openai_wire import OpenAIWire
from .recording import RecordedRequest
from .responses_wire import ResponsesWire

if TYPE_CHECKING:
    from .server import FakeUpstream

__all__ = ["Wire", "perform"]

Wire: TypeAlias = OpenAIWire | AnthropicWire | ResponsesWire


async def perform(
    upstream: FakeUpstream,
    behaviour: Behaviour,
    wire: Wire,
    request: RecordedRequest,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> bool:
    """Answer ``request`` with ``behaviour``; False when the connection must not be reused."""
    if isinstance(behaviour, Status):
        request.outcome = f"status {behaviour.status}"
        body = wire.error_body(behaviour.status, behaviour.message, behaviour.error_type)
        headers = {"content-type": "application/json", **behaviour.headers}
        await http_wire.send(writer, behaviour.status, headers, body)
        return True
    if isinstance(behaviour, Stall):
        request.outcome = "stalled"
        upstream._changed()
        await http_wire.until_disconnect(reader)
        return False
    if isinstance(behaviour, Drop):
        return await _drop(behaviour, wire, request, writer)
    if isinstance(behaviour, Malformed):
        await _malformed(behaviour, wire, request, writer)
        return True
    if isinstance(behaviour, (Text, ToolCalls)):
        behaviour = _accounted(upstream, behaviour, request)
    if not request.stream:
        return await _whole(behaviour, wire, request, writer)
    await http_wire.start_stream(writer)
    if isinstance(wire, AnthropicWire) and isinstance(behaviour, (Text, ToolCalls)):
        wire.set_usage(
            usage_or_default(behaviour.usage, 0, request.counted_input), behaviour.details
        )
    await http_wire.write_frames(writer, wire.preamble())
    if isinstance(behaviour, Text):
        await _stream_text(upstream, behaviour, wire, request, reader, writer)
        return True
    if isinstance(behaviour, ToolCalls):
        await _stream_tool_calls(upstream, behaviour, wire, request, reader, writer)
        return True
    if isinstance(behaviour, StreamError):
        await _stream_error(behaviour, wire, request, writer)
        return True
    if isinstance(behaviour, Endless):
        await _endless(upstream, behaviour, wire, request, reader, writer)
        return False
    raise TypeError(f"not a behaviour: {behaviour!r}")  # pragma: no cover


def _accounted(
    upstream: FakeUpstream, behaviour: Text | ToolCalls, request: RecordedRequest
) -> Text | ToolCalls:
    """The behaviour with the server's prompt cache accounting, where it scripts no usage."""
    cache = upstream.prompt_cache
    body = request.json
    protocol = request.protocol
    if cache is None or behaviour.usage is not None or behaviour.details is not None:
        return behaviour
    if protocol is None or not isinstance(body, dict):
        return behaviour
    request.counted_input, details = cache.account(protocol, body)
    return dataclasses.replace(behaviour, details=details)


async def _malformed(
    behaviour: Malformed, wire: Wire, request: RecordedRequest, writer: asyncio.StreamWriter
) -> None:
    request.outcome = "malformed"
    if behaviour.sse:
        await http_wire.start_stream(writer)
        # Anthropic's SDK skips an event without a name: name it as its first
        named = b"event: message_start\n" if isinstance(wire, AnthropicWire) else b""
        await http_wire.write_chunk(writer, named + b"data: " + behaviour.body + b"\n\n")
        await http_wire.end_stream(writer)
    else:
        headers = {"content-type": behaviour.content_type}
        await http_wire.send(writer, 200, headers, behaviour.body)


async def _stream_text(
    upstream: FakeUpstream,
    behaviour: Text,
    wire: Wire,
    request: RecordedRequest,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    for item in behaviour.reasoning:
        await http_wire.write_frames(writer, wire.reasoning(item))
    pieces = behaviour.pieces()
    for index, piece in enumerate(pieces):
        if index and behaviour.delay:
            await asyncio.sleep(behaviour.delay)
        await http_wire.write_frames(writer, _as_list(wire.text(piece)))
        if index == 0 and behaviour.hold is not None:
            request.outcome = "held"
            upstream._changed()
            await upstream._hold(behaviour.hold, reader)
    usage = usage_or_default(behaviour.usage, len(pieces), request.counted_input)
    finish = wire.finish(_stop(wire, tools=False), usage, behaviour.details)
    await http_wire.write_frames(writer, finish)
    await http_wire.end_stream(writer)
    request.outcome = "ok"


async def _stream_tool_calls(
    upstream: FakeUpstream,
    behaviour: ToolCalls,
    wire: Wire,
    request: RecordedRequest,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    produced = 0
    for item in behaviour.reasoning:
        await http_wire.write_frames(writer, wire.reasoning(item))
    for piece in WORDS.findall(behaviour.text):
        await http_wire.write_frames(writer, _as_list(wire.text(piece)))
        produced += 1
    for index, call in enumerate(behaviour.calls):
        call_id = call.id or _call_id(wire)
        if isinstance(wire, OpenAIWire):
            frames = wire.tool_call(index, call, call_id)
        else:
            frames = wire.tool_call(call, call_id)
        await http_wire.write_frames(writer, frames)
        produced += len(call.argument_pieces())
        if index == 0 and behaviour.hold is not None:
            request.outcome = "held"
            upstream._changed()
            await upstream._hold(behaviour.hold, reader)
    usage = usage_or_default(behaviour.usage, produced, request.counted_input)
    finish = wire.finish(_stop(wire, tools=True), usage, behaviour.details)
    await http_wire.write_frames(writer, finish)
    await http_wire.end_stream(writer)
    request.outcome = "ok"


async def _stream_error(
    behaviour: StreamError, wire: Wire, request: RecordedRequest, writer: asyncio.StreamWriter
) -> None:
    for piece in WORDS.findall(behaviour.text)[: behaviour.after_chunks]:
        await http_wire.write_frames(writer, _as_list(wire.text(piece)))
    await http_wire.write_frames(
        writer, [wire.error_event(behaviour.error_type, behaviour.message)]
    )
    await http_wire.end_stream(writer)
    request.outcome = f"stream error {behaviour.error_type}"


async def _endless(
    upstream: FakeUpstream,
    behaviour: Endless,
    wire: Wire,
    request: RecordedRequest,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    for piece in WORDS.findall(behaviour.text)[: behaviour.after_chunks]:
        await http_wire.write_frames(writer, _as_list(wire.text(piece)))
    request.outcome = "endless"
    upstream._changed()
    if behaviour.ping_interval is None:
        await http_wire.until_disconnect(reader)
    else:
        while True:
            await asyncio.sleep(behaviour.ping_interval)
            await http_wire.write_frames(writer, [wire.keepalive()])


async def _drop(
    behaviour: Drop, wire: Wire, request: RecordedRequest, writer: asyncio.StreamWriter
) -> bool:
    if behaviour.send_headers or behaviour.after_chunks or behaviour.clean:
        await http_wire.start_stream(writer)
        await http_wire.write_frames(writer, wire.preamble())
        for piece in WORDS.findall(behaviour.text)[: behaviour.after_chunks]:
            await http_wire.write_frames(writer, _as_list(wire.text(piece)))
    request.outcome = f"dropped after {behaviour.after_chunks} chunk(s)"
    if behaviour.clean:
        await http_wire.end_stream(writer)
        return True  # the connection stays usable
    if behaviour.reset:
        writer.transport.abort()
    else:
        writer.close()
    return False


async def _whole(
    behaviour: Behaviour, wire: Wire, request: RecordedRequest, writer: asyncio.StreamWriter
) -> bool:
    if isinstance(behaviour, Text):
        usage = usage_or_default(behaviour.usage, 1, request.counted_input)
        payload = wire.whole(behaviour.text, [], usage, behaviour.reasoning, behaviour.details)
    elif isinstance(behaviour, ToolCalls):
        calls = [(call, call.id or _call_id(wire)) for call in behaviour.calls]
        usage = usage_or_default(behaviour.usage, 1, request.counted_input)
        payload = wire.whole(behaviour.text, calls, usage, behaviour.reasoning, behaviour.details)
    else:
        request.outcome = "unsupported"
        body = wire.error_body(
            400, f"fake upstream: {type(behaviour).__name__} needs a stream", None
        )
        await http_wire.send(writer, 400, {"content-type": "application/json"}, body)
        return True
    request.outcome = "ok"
    await http_wire.send_json(writer, 200, payload)
    return True


def _as_list(frames: Frame | list[Frame]) -> list[Frame]:
    return frames if isinstance(frames, list) else [frames]


def _stop(wire: Wire, *, tools: bool) -> str:
    if isinstance(wire, AnthropicWire):
        return "tool_use" if tools else "end_turn"
    return "tool_calls" if tools else "stop"


def _call_id(wire: Wire) -> str:
    prefix = "toolu_" if isinstance(wire, AnthropicWire) else "call_"
    return prefix + secrets.token_hex(8)
