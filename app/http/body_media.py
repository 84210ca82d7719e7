"""Base64 media inside a JSON request body: found, measured and set aside without parsing it.

A run start may carry images and documents as base64 (``data:`` URLs; the protocols also
name raw base64 ``data``, ``bytes``, ``raw`` or, AG-UI's data source, ``value``): tens of
megabytes of one JSON string. Every C routine that reads such a string whole
(``json.loads``, ``re``, ``base64``, and ``bytes.find`` of a pattern of several bytes, over
a hundred milliseconds for 28 MB of base64) holds the GIL while it does, so even in a thread
it stops the event loop for a tenth of a second or more. ``bytes.find`` of one byte does not:
it is ``memchr``, a few milliseconds for the same body. So the body's string literals are
walked from quote to quote with it (``_strings``), and the media strings among them are:

- measured by ``media_size``, which tells the body limit how much of a body is media (the
  rest must stay within ``AGENT_MAX_BODY_BYTES``);
- set aside by ``loads``, which parses a body with its large media strings cut out and put
  back, so that the JSON parser only reads the small remainder (``set_aside`` hands them
  apart to a reader whose library parses the body itself).

Only string literals that need no unescaping are taken (a ``\\/``, which some encoders write
for ``/``, is the one escape allowed); anything else is left to the JSON parser as it is.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any, Final

__all__ = ["LARGE_STRING", "loads", "media_size", "set_aside"]

LARGE_STRING: Final = 64 * 1024
"""A media string longer than this is set aside by ``loads`` (a shorter one costs the parser
next to nothing)."""

_MAX_CANDIDATES: Final = 1024
# a run takes 64 parts at most: a body that names media more often than this is not one (the
# rest of it counts as what it is, not media), and its scan stays bounded
_MAX_STRINGS: Final = 200_000
# the string literals walked at most (a body of nothing but empty strings stops there)
_DATA: Final = b"data:"
_RAW_KEYS: Final = frozenset({b"data", b"bytes", b"raw", b"value"})
_BLANK: Final = b" \t\r\n"
_HEADER_CHARS: Final = 256


def media_size(body: bytes, *, raw_keys: bool = False, partial: bool = False) -> int:
    """How many bytes of ``body`` are base64 media: its base64 ``data:`` URL strings and,
    with ``raw_keys``, the strings named ``data``, ``bytes``, ``raw`` or ``value`` (quotes
    included).

    ``partial``: ``body`` is the start of a body still arriving, and a media string it ends
    in the middle of counts as media so far."""
    return sum(end - start for start, end in _media(body, raw_keys=raw_keys, partial=partial))


def loads(body: bytes, *, raw_keys: bool = False) -> Any:
    """``json.loads(body)``, with the media strings ``media_size`` names longer than
    ``LARGE_STRING`` read around the parser: the same value, without the parser holding the
    GIL over them."""
    # a placeholder no client can know, so none can be confused with a client's own string
    mark = f"\x00media-{secrets.token_hex(8)}-"
    rest, cut = set_aside(body, lambda n, _: f"{mark}{n}", raw_keys=raw_keys)
    if not cut:
        return json.loads(body)
    return _put_back(json.loads(rest), mark, cut)


def set_aside(
    body: bytes,
    placeholder: Callable[[int, str], str],
    *,
    raw_keys: bool | frozenset[bytes] = False,
) -> tuple[bytes, list[str]]:
    """``body`` with each media string longer than ``LARGE_STRING`` replaced by the string
    ``placeholder(n, text)`` (the n-th one, and its text), and those texts (unescaped).
    ``raw_keys`` may name the raw base64 keys to take (the default ones for True).

    For a reader that parses the body itself (a library's), and is handed the texts apart.
    """
    cut: list[str] = []
    kept: list[bytes] = []
    at = 0
    for start, end in _media(body, raw_keys=raw_keys):
        if end - start <= LARGE_STRING:
            continue
        try:
            text = body[start + 1 : end - 1].decode("ascii")
        except UnicodeDecodeError:
            continue  # not base64: the parser reads it (and the run refuses it)
        text = text.replace("\\/", "/") if "\\" in text else text
        kept.append(body[at:start])
        kept.append(json.dumps(placeholder(len(cut), text)).encode())
        cut.append(text)
        at = end
    if not cut:
        return body, cut
    kept.append(body[at:])
    return b"".join(kept), cut


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


def _media(
    body: bytes, *, raw_keys: bool | frozenset[bytes], partial: bool = False
) -> Iterator[tuple[int, int]]:
    """The spans (quotes included) of the media strings of ``body``: base64 data URLs, and
    with ``raw_keys`` the strings under a raw base64 key (those it names, or the default
    ones); at most ``_MAX_CANDIDATES``."""
    names = raw_keys if isinstance(raw_keys, frozenset) else _RAW_KEYS if raw_keys else None
    found = 0
    key: bytes | None = None  # the key whose value starts at ``value_at``
    value_at = -1
    for start, end, plain, closed in _strings(body, partial):
        if found >= _MAX_CANDIDATES:
            return
        named = names is not None and start == value_at and key in names
        if plain and (named or _is_data_url(body, start, end, still_open=not closed)):
            found += 1
            yield start, end
        key, value_at = None, -1
        if closed and end - start <= 18:  # a short string followed by a colon is a key
            colon = _skip_blank(body, end)
            if colon < len(body) and body[colon] == ord(":"):
                key, value_at = body[start + 1 : end - 1], _skip_blank(body, colon + 1)


def _is_data_url(body: bytes, start: int, end: int, *, still_open: bool) -> bool:
    """Whether the string at ``start`` is a base64 data URL (one still arriving whose header
    is not whole yet counts as one)."""
    if not body.startswith(_DATA, start + 1):
        return False
    comma = body.find(b",", start, min(end, start + _HEADER_CHARS))
    if comma > 0:
        return body[start:comma].endswith(b";base64")
    return still_open and end - start < _HEADER_CHARS


def _strings(body: bytes, partial: bool) -> Iterator[tuple[int, int, bool, bool]]:
    """The string literals of ``body``, in order: ``(start, end, plain, closed)``, ``start``
    at the opening quote, ``end`` past the closing one, ``plain`` when it needs no unescaping
    but ``\\/``. Found quote by quote with ``memchr``; a quote preceded by an odd run of
    backslashes is inside a string. ``partial``: a string still open ends with ``body``
    (``closed`` False)."""
    at = 0
    for _ in range(_MAX_STRINGS):
        start = body.find(b'"', at)
        if start < 0:
            return
        close = body.find(b'"', start + 1)
        while close > 0 and _escaped(body, close):
            close = body.find(b'"', close + 1)
        if close < 0:
            if partial:
                yield start, len(body), _plain(body, start + 1, len(body)), False
            return
        yield start, close + 1, _plain(body, start + 1, close), True
        at = close + 1


def _plain(body: bytes, start: int, end: int) -> bool:
    """Whether ``body[start:end]`` holds no escape but ``\\/``."""
    if body.find(b"\\", start, end) < 0:
        return True
    return body.count(b"\\", start, end) == body.count(b"\\/", start, end)


def _skip_blank(body: bytes, at: int) -> int:
    while at < len(body) and body[at] in _BLANK:
        at += 1
    return at


def _escaped(body: bytes, at: int) -> bool:
    """Whether the character at ``at`` is escaped (an odd run of backslashes before it)."""
    count = 0
    while at - count - 1 >= 0 and body[at - count - 1] == ord("\\"):
        count += 1
    return count % 2 == 1
