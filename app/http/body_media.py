"""Base64 media inside a JSON request body: found, measured and set aside without parsing it.

A run start may carry images and documents as base64 (``data:`` URLs; the protocols also
name raw base64 ``data``, ``bytes`` or ``raw``): tens of megabytes of one JSON string. Every
C routine that reads such a string whole (``json.loads``, ``re``, ``base64``) holds the GIL
while it does, so even in a thread it stops the event loop for a tenth of a second or more.
``bytes.find`` does not: it runs at memory speed. So these strings are located with it:

- ``media_size`` tells the body limit how much of a body is media (the rest must stay within
  ``AGENT_MAX_BODY_BYTES``);
- ``loads`` parses a body with its large data URLs cut out and put back, so that the JSON
  parser only reads the small remainder.

Only string literals that need no unescaping are taken (a ``\\/``, which some encoders write
for ``/``, is the one escape allowed); anything else is left to the JSON parser as it is.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["LARGE_STRING", "loads", "media_size"]

LARGE_STRING: Final = 64 * 1024
"""A data URL longer than this is set aside by ``loads`` (a shorter one costs the parser
next to nothing)."""

_MAX_CANDIDATES: Final = 1024
# a run takes 64 parts at most: a body that names media more often than this is not one (the
# rest of it counts as what it is, not media), and its scan stays bounded
_DATA_URL: Final = b'"data:'
_RAW_KEYS: Final = (b'"data"', b'"bytes"', b'"raw"')
_BLANK: Final = b" \t\r\n"
_HEADER_CHARS: Final = 256


def media_size(body: bytes, *, raw_keys: bool = False, partial: bool = False) -> int:
    """How many bytes of ``body`` are base64 media: its base64 ``data:`` URL strings and,
    with ``raw_keys``, the strings named ``data``, ``bytes`` or ``raw`` (quotes included).

    ``partial``: ``body`` is the start of a body still arriving, and a media string it ends
    in the middle of counts as media so far."""
    spans = list(_data_urls(body, partial))
    if raw_keys:
        spans.extend(_raw_strings(body, partial))
    return sum(end - start for start, end in _merged(spans))


def loads(body: bytes) -> Any:
    """``json.loads(body)``, with the data URLs longer than ``LARGE_STRING`` read around the
    parser: the same value, without the parser holding the GIL over them."""
    cut: list[str] = []
    kept: list[bytes] = []
    at = 0
    # a placeholder no client can know, so none can be confused with a client's own string
    mark = f"\x00media-{secrets.token_hex(8)}-"
    for start, end in _data_urls(body):
        if end - start <= LARGE_STRING:
            continue
        try:
            text = body[start + 1 : end - 1].decode("ascii")
        except UnicodeDecodeError:
            continue  # not base64: the parser reads it (and the run refuses it)
        kept.append(body[at:start])
        kept.append(json.dumps(f"{mark}{len(cut)}").encode())
        cut.append(text.replace("\\/", "/") if "\\" in text else text)
        at = end
    if not cut:
        return json.loads(body)
    kept.append(body[at:])
    value = json.loads(b"".join(kept))
    return _put_back(value, mark, cut)


def _put_back(value: Any, mark: str, cut: list[str]) -> Any:
    """``value`` with each placeholder string replaced by the data URL it stands for."""
    pending: list[Any] = [value]
    if isinstance(value, str):
        return _original(value, mark, cut)
    while pending:
        item = pending.pop()
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, member in list(pairs):
            if isinstance(member, str):
                if member.startswith(mark):
                    item[key] = _original(member, mark, cut)
            elif isinstance(member, dict | list):
                pending.append(member)
    return value


def _original(text: str, mark: str, cut: list[str]) -> str:
    return cut[int(text[len(mark) :])] if text.startswith(mark) else text


def _data_urls(body: bytes, partial: bool = False) -> Iterator[tuple[int, int]]:
    """The spans (quotes included) of the base64 data URL strings of ``body``."""
    at = 0
    for _ in range(_MAX_CANDIDATES):
        start = body.find(_DATA_URL, at)
        if start < 0:
            return
        end = _string_end(body, start, partial)
        if end is None:
            at = start + 1
            continue
        comma = body.find(b",", start, min(end, start + _HEADER_CHARS))
        if comma > 0 and body[start:comma].endswith(b";base64"):
            yield start, end
        elif partial and end == len(body) and comma < 0 and end - start < _HEADER_CHARS:
            yield start, end  # its header is still arriving
        at = end


def _raw_strings(body: bytes, partial: bool = False) -> Iterator[tuple[int, int]]:
    """The spans of the strings named ``data``, ``bytes`` or ``raw`` in ``body``."""
    for key in _RAW_KEYS:
        at = 0
        for _ in range(_MAX_CANDIDATES):
            found = body.find(key, at)
            if found < 0:
                break
            at = found + len(key)
            colon = _skip_blank(body, at)
            if colon >= len(body) or body[colon] != ord(":"):
                continue
            start = _skip_blank(body, colon + 1)
            if start < len(body) and body[start] == ord('"'):
                end = _string_end(body, start, partial)
                if end is not None:
                    yield start, end
                    at = end


def _skip_blank(body: bytes, at: int) -> int:
    while at < len(body) and body[at] in _BLANK:
        at += 1
    return at


def _string_end(body: bytes, start: int, partial: bool = False) -> int | None:
    """The end (past the closing quote) of the string literal whose opening quote is at
    ``start``, if it is one needing no unescaping but ``\\/``; else None. ``partial``: a
    string not closed yet ends with ``body``."""
    if _escaped(body, start):
        return None  # a quote inside another string
    close = body.find(b'"', start + 1)
    if close < 0:
        if not partial:
            return None
        close = len(body) - 1  # as if its quote came next
    slashes = body.count(b"\\", start + 1, close)
    if slashes and slashes != body.count(b"\\/", start + 1, close):
        return None  # other escapes (or an escaped quote): the parser's to read
    return close + 1


def _escaped(body: bytes, at: int) -> bool:
    """Whether the character at ``at`` is escaped (an odd run of backslashes before it)."""
    count = 0
    while at - count - 1 >= 0 and body[at - count - 1] == ord("\\"):
        count += 1
    return count % 2 == 1


def _merged(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """``spans`` sorted, overlaps merged."""
    current: tuple[int, int] | None = None
    for start, end in sorted(spans):
        if current is not None and start < current[1]:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current
