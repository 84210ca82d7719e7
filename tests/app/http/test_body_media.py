"""Base64 media in JSON bodies (app.http.body_media): measured and parsed around, exactly as a
JSON parser reads the body, without reading the media strings whole."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from app.http import body_media

URL = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 400).decode()
SMALL = "data:image/png;base64,iVBORw0KGgo="


@pytest.mark.parametrize(
    "value",
    [
        {"input": [{"type": "text", "text": "hi"}, {"type": "image", "url": URL}]},
        {"input": [{"type": "image", "url": URL}, {"type": "file", "url": URL}], "metadata": {}},
        {"input": 'he said "data:image/png;base64,AAAA" and \\', "x": [URL, SMALL, "data:"]},
        {"nested": [[{"a": URL}], {"b": [URL]}], "data:": "data:image/png;base64"},
        [URL, "a", {"k": URL}],
        URL,
        {"input": "no media at all", "n": [1, 2.5, None, True]},
    ],
)
def test_loads_reads_what_json_reads(value: Any) -> None:
    for body in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=2)):
        assert body_media.loads(body.encode()) == value
    # an encoder that escapes "/" (PHP's, by default) is read the same
    assert body_media.loads(json.dumps(value).replace("/", "\\/").encode()) == value


@pytest.mark.parametrize(
    "body",
    [
        b'{"u": "' + URL.encode() + b'"',  # not closed
        b'{"u": "' + URL.encode() + b'" "v": 1}',  # no comma
        b'{"u": "' + URL.encode() + b'", }',
        b'["' + URL.encode() + b'\\x"]',  # a bad escape inside it
    ],
)
def test_loads_refuses_what_json_refuses(body: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(body)
    with pytest.raises(ValueError):
        body_media.loads(body)


def test_a_large_data_url_is_cut_out_of_what_the_parser_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[int] = []
    loads = json.loads

    def counting(text: bytes, **kwargs: Any) -> Any:
        read.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    body = json.dumps({"input": [{"type": "image", "url": URL}]}).encode()
    assert body_media.loads(body)["input"][0]["url"] == URL
    assert len(body) > 100_000 and read == [pytest.approx(90, abs=40)]


def test_media_size_counts_base64_strings_only() -> None:
    text = json.dumps({"input": "x" * 5000, "metadata": {"data": "y" * 100}}).encode()
    assert body_media.media_size(text) == 0
    # the protocols' raw base64 fields count where asked
    assert body_media.media_size(text, raw_keys=True) == 102
    body = json.dumps({"input": [{"type": "image", "url": URL}], "t": "x" * 10}).encode()
    assert body_media.media_size(body) == len(URL) + 2
    # a text that merely mentions a data URL is text
    quoted = json.dumps({"input": f'see "{URL}"'}).encode()
    assert body_media.media_size(quoted) == 0


def test_a_body_still_arriving_counts_its_open_media_string() -> None:
    body = json.dumps({"input": [{"type": "image", "url": URL}]}).encode()
    cut = body[: len(body) // 2]
    assert body_media.media_size(cut) == 0
    assert body_media.media_size(cut, partial=True) == len(cut) - cut.index(b'"data:')
    # but text still arriving is text
    assert body_media.media_size(b'{"input": "' + b"x" * 1000, partial=True) == 0


def test_the_scan_is_bounded() -> None:
    # a body that names media at every turn is looked at so far, then counted as it is
    body = b"[" + b'"data:x;base64,A",' * 5000 + b'"x"]'
    assert 0 < body_media.media_size(body) < len(body) // 2
    assert body_media.loads(body) == json.loads(body)


RAW = base64.b64encode(bytes(range(256)) * 400).decode()


@pytest.mark.parametrize(
    "value",
    [
        # AG-UI 1.0's data source, and the draft's binary part
        {"messages": [{"content": [{"type": "image", "source": {"type": "data", "value": RAW}}]}]},
        {"messages": [{"content": [{"type": "binary", "mimeType": "image/png", "data": RAW}]}]},
        # A2A's raw bytes (1.0) and FileWithBytes (0.3), and a data URL beside them
        {"message": {"parts": [{"raw": RAW}, {"file": {"bytes": RAW}}, {"url": URL}]}},
        {"value": "short", "data": {"value": RAW}, "raw": ["not", "a", "string"]},
    ],
)
def test_loads_with_raw_keys_reads_what_json_reads(value: Any) -> None:
    for body in (json.dumps(value), json.dumps(value, indent=2)):
        assert body_media.loads(body.encode(), raw_keys=True) == value


def test_raw_base64_strings_are_cut_out_of_what_the_parser_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[int] = []
    loads = json.loads

    def counting(text: bytes, **kwargs: Any) -> Any:
        read.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    source = {"type": "data", "value": RAW, "mimeType": "image/png"}
    body = json.dumps({"messages": [{"content": [{"type": "image", "source": source}]}]})
    assert body_media.loads(body.encode(), raw_keys=True)["messages"][0]["content"][0] == {
        "type": "image",
        "source": source,
    }
    assert len(body) > 100_000 and read == [pytest.approx(130, abs=50)]
    # AG-UI's "value" counts as media on the protocols' paths
    assert body_media.media_size(body.encode(), raw_keys=True) == len(RAW) + 2


def test_strings_are_told_apart_from_what_is_inside_them() -> None:
    # a quote escaped inside a string does not end it: what looks like media there is text
    tricky = {"text": f'a \\" then "{URL}" and "data": "{RAW}"', "data": RAW, "k": URL}
    body = json.dumps(tricky).encode()
    assert body_media.loads(body, raw_keys=True) == tricky
    assert body_media.media_size(body, raw_keys=True) == len(RAW) + 2 + len(URL) + 2
    # a key with blanks around its colon names its value all the same
    spaced = b'{"value" :\n "' + RAW.encode() + b'"}'
    assert body_media.media_size(spaced, raw_keys=True) == len(RAW) + 2
    assert body_media.loads(spaced, raw_keys=True) == {"value": RAW}
    # a raw key's value still arriving counts as media so far
    arriving = b'{"source": {"type": "data", "value": "' + RAW[:5000].encode()
    assert body_media.media_size(arriving, raw_keys=True, partial=True) == 5001


def test_a_body_of_tiny_strings_is_walked_within_bounds() -> None:
    body = b"[" + b'"",' * 300_000 + b'""]'
    assert body_media.media_size(body, raw_keys=True) == 0
    assert body_media.loads(body, raw_keys=True) == json.loads(body)
