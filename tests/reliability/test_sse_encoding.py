"""The SSE framing round-trips through a real SSE client, whatever the text.

Frames come from the service's own encoder (``app.bus.wire``); they are read back by httpx-sse's
``EventSource`` over an httpx response whose body arrives in arbitrary pieces (cut inside
multibyte characters, between ``\\r`` and ``\\n``, mid-line), with ``: ping`` comments between
events, and compared with what was encoded: type, id, and the JSON object of every event.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from httpx_sse import EventSource
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.bus.base import WireEvent
from app.bus.wire import PING_FRAME, WireEncoder, delta_json, iso_ms
from app.http.api.openapi import EVENT_TYPES

# the characters that break naive SSE or JSON handling, mixed into arbitrary text
_AWKWARD = [
    "\n",
    "\r",
    "\r\n",
    "\n\n",
    "\x00",
    "\x85",
    "\u2028",
    "\u2029",
    "\ufeff",
    '"',
    "\\",
    ":",
    "data: x",
    "id: 9",
    "event: run.completed",
    "\U0001f600",
    "\U0010ffff",
    "\U00020000",
    "é",
]
text = st.lists(
    st.one_of(st.sampled_from(_AWKWARD), st.characters(codec="utf-8")), max_size=40
).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)


_DELTAS = ("text.delta", "reasoning.delta")  # encoded by the hot path's delta_json


@st.composite
def wire_events(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, float, Any]]]:
    """A run (its ids, arbitrary text) and its events: (type, ts, data or delta)."""
    run_id = draw(text)
    session_id = draw(text)
    events: list[tuple[str, float, Any]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        kind = draw(st.sampled_from(EVENT_TYPES))
        ts = draw(st.floats(min_value=0, max_value=4e9))
        payload: Any = (
            draw(text) if kind in _DELTAS else draw(st.dictionaries(text, json_values, max_size=5))
        )
        events.append((kind, ts, payload))
    return run_id, session_id, events


def encode(
    run_id: str, session_id: str, events: Sequence[tuple[str, float, Any]]
) -> list[WireEvent]:
    encoder = WireEncoder(run_id, session_id)
    frames = []
    for seq, (kind, ts, payload) in enumerate(events, start=1):
        if kind in _DELTAS:
            frames.append(encoder.encode_json(seq, kind, ts, delta_json(payload)))
        else:
            frames.append(encoder.encode(seq, kind, ts, payload))
    return frames


def expected(
    run_id: str, session_id: str, events: Sequence[tuple[str, float, Any]]
) -> list[dict[str, Any]]:
    return [
        {
            "type": kind,
            "seq": seq,
            "run_id": run_id,
            "session_id": session_id,
            "ts": iso_ms(ts),
            "data": {"delta": payload} if kind in _DELTAS else payload,
        }
        for seq, (kind, ts, payload) in enumerate(events, start=1)
    ]


def pieces(body: bytes, cuts: Sequence[int]) -> Iterator[bytes]:
    """``body`` cut at ``cuts`` (offsets, any order, duplicates ignored)."""
    start = 0
    for cut in sorted({c % (len(body) + 1) for c in cuts}):
        if cut > start:
            yield body[start:cut]
            start = cut
    if start < len(body):
        yield body[start:]


def decode(chunks: Iterator[bytes]) -> list[tuple[str, str, Any]]:
    """(event, id, JSON of data) of every event httpx-sse reads from the chunks."""
    response = httpx.Response(
        200, headers={"content-type": "text/event-stream; charset=utf-8"}, content=chunks
    )
    return [(sse.event, sse.id, json.loads(sse.data)) for sse in EventSource(response).iter_sse()]


def roundtrip(frames: Sequence[WireEvent], cuts: Sequence[int]) -> list[tuple[str, str, Any]]:
    body = PING_FRAME + PING_FRAME.join(frame.frame for frame in frames)
    return decode(pieces(body, cuts))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=wire_events(), cuts=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=12))
def test_events_round_trip_through_httpx_sse(
    run: tuple[str, str, list[tuple[str, float, Any]]], cuts: list[int]
) -> None:
    run_id, session_id, events = run
    frames = encode(run_id, session_id, events)
    for frame in frames:
        frame.frame.decode("utf-8")  # strict: every frame is valid UTF-8
        head, _, rest = frame.frame.partition(b"\ndata: ")
        # one data line per event: nothing inside it can end the line or the event
        assert rest.endswith(b"\n\n") and b"\n" not in rest[:-2] and b"\r" not in rest
        assert b"\n" in head
    decoded = roundtrip(frames, cuts)
    wanted = expected(run_id, session_id, events)
    assert [(e, i) for e, i, _ in decoded] == [(w["type"], str(w["seq"])) for w in wanted]
    assert [data for _, _, data in decoded] == wanted


@pytest.mark.parametrize(
    "alphabet",
    [
        'abc \n\r\t"\\\u2028\U0001f600é\x00',  # everything awkward, mixed
        "\n",  # a megabyte of newlines (doubled by JSON escaping)
        "\r",
        "\U0001f600\U00020000\U0010ffff",  # four-byte characters only
    ],
    ids=["mixed", "newlines", "carriage-returns", "astral"],
)
@pytest.mark.parametrize("kind", ["text.delta", "tool.call.completed"])
def test_one_megabyte_payloads_round_trip(alphabet: str, kind: str) -> None:
    rng = random.Random(f"{alphabet}{kind}")
    size = 1 << 20  # characters; up to 4 MB of UTF-8
    payload = "".join(rng.choice(alphabet) for _ in range(size))
    data: Any = payload if kind == "text.delta" else {"result": payload, "is_error": False}
    events = [("run.started", 1.0, {"agent": "a", "model": "m"}), (kind, 2.5, data)]
    frames = encode("run_big", "s", events)
    cuts = [rng.randrange(1 << 23) for _ in range(64)]
    assert [d for _, _, d in roundtrip(frames, cuts)] == expected("run_big", "s", events)


@pytest.mark.parametrize("payload", ["", {}, {"": ""}, {"delta": None}])
def test_empty_payloads_round_trip(payload: Any) -> None:
    kind = "text.delta" if isinstance(payload, str) else "custom"
    events = [(kind, 0.0, payload)]
    frames = encode("", "", events)
    assert [d for _, _, d in roundtrip(frames, [])] == expected("", "", events)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(st.characters(categories=["Cs"]), st.sampled_from(["a", "\n", "\U0001f600"])),
        min_size=1,
        max_size=12,
    ).map("".join)
)
def test_lone_surrogates_are_escaped_not_fatal(value: str) -> None:
    # a model or a tool can produce text with a lone UTF-16 surrogate (JSON allows "\ud800"):
    # the frame must still be valid UTF-8, and decode back to the same string (as UTF-16, where
    # a high surrogate followed by a low one is the one character they encode)
    frames = encode("r", "s", [("text.delta", 0.0, value), ("custom", 0.0, {value: [value]})])
    for frame in frames:
        frame.frame.decode("utf-8")
    decoded = [d for _, _, d in roundtrip(frames, [3, 70, 71])]
    same = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    assert decoded[0]["data"] == {"delta": same}
    assert decoded[1]["data"] == {same: [same]}


def test_non_finite_numbers_become_null() -> None:
    frames = encode("r", "s", [("tool.call.completed", 0.0, {"result": [float("nan"), 1.5]})])
    [(_, _, data)] = roundtrip(frames, [])
    assert data["data"] == {"result": [None, 1.5]}
