"""Each protocol's media parts as the native run input's parts, and what each refuses.

The end-to-end suites send real images and documents with each protocol's official client;
these pin the mapping itself: which native part each protocol part becomes, that the order of
text and media is kept, and that whatever cannot be passed on is refused with the protocol's
own name of the field, never dropped.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pytest
from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format

from app.errors import ServiceError, UnsupportedMediaType
from app.http.protocols.a2a.endpoint import set_media_aside
from app.http.protocols.a2a.parts import history_parts, message_parts
from app.http.protocols.agui import AgUiMessage
from app.http.protocols.agui import user_parts as agui_parts
from app.http.protocols.ai_sdk import UIMessage
from app.http.protocols.ai_sdk import user_parts as ai_sdk_parts
from app.http.protocols.media import PartRefused, data_url_of_bytes, data_url_type, media_part
from app.http.protocols.openai.parts import chat_content, responses_content

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
PNG_B64 = base64.b64encode(PNG).decode()
PNG_URL = f"data:image/png;base64,{PNG_B64}"
PDF_URL = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4\n").decode()
HTTPS_PNG = "https://example.com/cat.png"


@dataclass
class Refusal:
    code: str
    param: str
    detail: str


def refused(call: Any, *args: Any) -> Refusal:
    """What ``call(*args)`` was refused with: a part's shape (``PartRefused``,
    ``validation_error``) or its media (``unsupported_media_type``), named by ``param``."""
    with pytest.raises(ServiceError) as caught:
        call(*args)
    exc = caught.value
    assert isinstance(exc, PartRefused | UnsupportedMediaType)
    return Refusal(exc.code, exc.extra["param"], exc.detail)


# --- the shared steps ----------------------------------------------------------------------


def test_data_url_type_reads_the_header_only() -> None:
    assert data_url_type(PNG_URL) == "image/png"
    assert data_url_type("DATA:Application/PDF;base64,AAAA") == "application/pdf"
    assert data_url_type("data:,hello") == ""
    assert data_url_type(HTTPS_PNG) is None


def test_media_part_needs_one_source_of_an_allowed_scheme() -> None:
    assert media_part("p", url=HTTPS_PNG) == {"where": "p", "type": "image", "url": HTTPS_PNG}
    assert media_part("p", file_id="file_1", kind="file", filename="a.pdf") == {
        "where": "p",
        "type": "file",
        "file_id": "file_1",
        "filename": "a.pdf",
    }
    assert "exactly one" in refused(lambda: media_part("p")).detail
    assert "exactly one" in refused(lambda: media_part("p", url=PNG_URL, file_id="f")).detail
    for url in ("http://example.com/a.png", "file:///etc/passwd", "ftp://x/a.png", "a.png"):
        exc = refused(lambda u=url: media_part("p", url=u, kind="image"))
        assert exc.param == "p"
        assert "https URL, a data: URL" in exc.detail
        assert exc.code == "validation_error"
    # nothing tells an https URL's kind: its media type is asked for, not guessed wrong
    assert "media type" in refused(lambda: media_part("p", url="https://x/blob")).detail


def test_a_declared_media_type_its_data_url_contradicts_is_refused() -> None:
    exc = refused(lambda: media_part("p", url=PDF_URL, media_type="image/png"))
    assert exc.code == "unsupported_media_type"
    assert (
        exc.detail == "p says its media type is image/png, but its data: URL says application/pdf"
    )
    # a top-level type only (the AI SDK allows "image") must match the data URL's
    assert media_part("p", url=PNG_URL, media_type="image")["type"] == "image"
    assert media_part("p", url=PNG_URL, media_type="image/*")["type"] == "image"
    refused(lambda: media_part("p", url=PDF_URL, media_type="image"))


# --- OpenAI Responses and Chat Completions -------------------------------------------------


def test_responses_parts() -> None:
    parts = responses_content(
        [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": PNG_URL, "detail": "high"},
            {"type": "input_image", "file_id": "file_img", "detail": "auto"},
            {"type": "input_file", "file_data": PDF_URL, "filename": "a.pdf"},
            {"type": "input_file", "file_url": "https://example.com/a.pdf"},
            {"type": "input_file", "file_id": "file_doc"},
        ],
        "input[0].content",
    )
    where = "input[0].content"
    assert parts == [
        {"type": "text", "text": "look"},
        {"where": f"{where}[1]", "type": "image", "url": PNG_URL, "media_type": "image/png"},
        {"where": f"{where}[2]", "type": "image", "file_id": "file_img"},
        {
            "where": f"{where}[3]",
            "type": "file",
            "url": PDF_URL,
            "media_type": "application/pdf",
            "filename": "a.pdf",
        },
        {"where": f"{where}[4]", "type": "file", "url": "https://example.com/a.pdf"},
        {"where": f"{where}[5]", "type": "file", "file_id": "file_doc"},
    ]
    assert responses_content("hi", "input") == [{"type": "text", "text": "hi"}]


@pytest.mark.parametrize(
    ("part", "param", "words"),
    [
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            "input[0].content[1]",
            "audio input is not supported",
        ),
        ({"type": "input_video"}, "input[0].content[1]", "'input_video' is not supported"),
        ({"type": "input_image"}, "input[0].content[1]", "exactly one"),
        (
            {"type": "input_image", "image_url": "http://example.com/a.png"},
            "input[0].content[1]",
            "http: URL",
        ),
        (
            {"type": "input_file", "file_data": "JVBERi0="},
            "input[0].content[1].file_data",
            "expected a data: URL",
        ),
        ({"type": "input_image", "image_url": 7}, "input[0].content[1].image_url", "string"),
    ],
)
def test_responses_refusals_name_the_part(part: dict[str, Any], param: str, words: str) -> None:
    exc = refused(
        responses_content, [{"type": "input_text", "text": "x"}, part], "input[0].content"
    )
    assert exc.param == param
    assert words in exc.detail


def test_chat_parts() -> None:
    parts = chat_content(
        [
            {"type": "text", "text": "what is it?"},
            {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
            {"type": "image_url", "image_url": {"url": HTTPS_PNG}},
            {"type": "file", "file": {"file_data": PDF_URL, "filename": "a.pdf"}},
            {"type": "file", "file": {"file_id": "file_doc"}},
        ],
        "messages[1].content",
    )
    where = "messages[1].content"
    assert parts == [
        {"type": "text", "text": "what is it?"},
        {"where": f"{where}[1]", "type": "image", "url": PNG_URL, "media_type": "image/png"},
        {"where": f"{where}[2]", "type": "image", "url": HTTPS_PNG},
        {
            "where": f"{where}[3]",
            "type": "file",
            "url": PDF_URL,
            "media_type": "application/pdf",
            "filename": "a.pdf",
        },
        {"where": f"{where}[4]", "type": "file", "file_id": "file_doc"},
    ]


def test_chat_refusals_name_the_part() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}
    exc = refused(chat_content, [audio], "messages[0].content")
    assert (exc.code, exc.param) == ("unsupported_media_type", "messages[0].content[0]")
    assert "audio input is not supported" in exc.detail
    bare = {"type": "file", "file": {"file_data": "JVBERi0=", "filename": "a.pdf"}}
    exc = refused(chat_content, [bare], "messages[0].content")
    assert exc.param == "messages[0].content[0].file.file_data"
    exc = refused(chat_content, [{"type": "file", "file": "x"}], "messages[0].content")
    assert exc.param == "messages[0].content[0].file"
    exc = refused(chat_content, [{"type": "refusal", "refusal": "no"}], "messages[0].content")
    assert "'refusal' is not supported" in exc.detail


# --- the AI SDK ----------------------------------------------------------------------------


def _ui(*parts: dict[str, Any]) -> UIMessage:
    return UIMessage.model_validate({"id": "u", "role": "user", "parts": list(parts)})


def test_ai_sdk_file_parts() -> None:
    message = _ui(
        {"type": "file", "mediaType": "image/png", "url": PNG_URL, "filename": "cat.png"},
        {"type": "text", "text": "and this"},
        {"type": "file", "mediaType": "application/pdf", "url": "https://example.com/a.pdf"},
    )
    assert ai_sdk_parts(message, "messages[0].parts") == [
        {
            "where": "messages[0].parts[0]",
            "type": "image",
            "url": PNG_URL,
            "media_type": "image/png",
            "filename": "cat.png",
        },
        {"type": "text", "text": "and this"},
        {
            "where": "messages[0].parts[2]",
            "type": "file",
            "url": "https://example.com/a.pdf",
            "media_type": "application/pdf",
        },
    ]


def test_ai_sdk_refusals() -> None:
    lying = _ui({"type": "file", "mediaType": "image/png", "url": PDF_URL})
    exc = refused(ai_sdk_parts, lying, "messages[0].parts")
    assert (exc.code, exc.param) == ("unsupported_media_type", "messages[0].parts[0]")
    assert "application/pdf" in exc.detail
    audio = _ui({"type": "file", "mediaType": "audio/mpeg", "url": "https://x/a.mp3"})
    exc = refused(ai_sdk_parts, audio, "messages[0].parts")
    assert (exc.code, exc.detail) == (
        "unsupported_media_type",
        "messages[0].parts[0]: audio input is not supported; send images and documents",
    )
    untyped = _ui({"type": "file", "url": PNG_URL})
    assert "mediaType" in refused(ai_sdk_parts, untyped, "messages[0].parts").detail
    data = _ui({"type": "text", "text": "x"}, {"type": "data-note", "data": {"a": 1}})
    exc = refused(ai_sdk_parts, data, "messages[0].parts")
    assert exc.param == "messages[0].parts[1]"
    assert "'data-note'" in exc.detail


# --- AG-UI ---------------------------------------------------------------------------------


def _agui(*content: dict[str, Any]) -> AgUiMessage:
    return AgUiMessage.model_validate({"id": "u", "role": "user", "content": list(content)})


def test_agui_image_and_document_parts() -> None:
    message = _agui(
        {"type": "text", "text": "compare"},
        {"type": "image", "source": {"type": "data", "value": PNG_B64, "mimeType": "image/png"}},
        {"type": "image", "source": {"type": "url", "value": HTTPS_PNG}},
        {
            "type": "document",
            "source": {"type": "file", "value": "file_doc", "mimeType": "application/pdf"},
            "metadata": {"filename": "a.pdf"},
        },
        {"type": "binary", "mimeType": "application/pdf", "url": PDF_URL, "filename": "b.pdf"},
        {"type": "binary", "mimeType": "image/png", "id": "file_img"},
    )
    where = "messages[0].content"
    assert agui_parts(message, where) == [
        {"type": "text", "text": "compare"},
        {"where": f"{where}[1]", "type": "image", "url": PNG_URL, "media_type": "image/png"},
        {"where": f"{where}[2]", "type": "image", "url": HTTPS_PNG},
        {
            "where": f"{where}[3]",
            "type": "file",
            "file_id": "file_doc",
            "media_type": "application/pdf",
            "filename": "a.pdf",
        },
        {
            "where": f"{where}[4]",
            "type": "file",
            "url": PDF_URL,
            "media_type": "application/pdf",
            "filename": "b.pdf",
        },
        {"where": f"{where}[5]", "type": "image", "file_id": "file_img", "media_type": "image/png"},
    ]


@pytest.mark.parametrize(
    ("part", "param", "words"),
    [
        (
            {"type": "audio", "source": {"type": "url", "value": "https://x/a.mp3"}},
            "messages[0].content[0]",
            "audio input is not supported",
        ),
        ({"type": "video", "source": {}}, "messages[0].content[0]", "video input"),
        (
            {"type": "image", "source": {"type": "data", "value": PNG_B64}},
            "messages[0].content[0].source",
            "mimeType",
        ),
        (
            {"type": "image", "source": {"type": "file", "value": "f", "provider": "openai"}},
            "messages[0].content[0].source",
            "'openai' cannot be read here",
        ),
        (
            {
                "type": "image",
                "source": {"type": "url", "value": PDF_URL, "mimeType": "image/png"},
            },
            "messages[0].content[0]",
            "says application/pdf",
        ),
        ({"type": "binary", "mimeType": "image/png"}, "messages[0].content[0]", "exactly one"),
        ({"type": "binary", "data": PNG_B64}, "messages[0].content[0]", "mimeType"),
        ({"type": "sticker"}, "messages[0].content[0]", "'sticker'"),
    ],
)
def test_agui_refusals(part: dict[str, Any], param: str, words: str) -> None:
    exc = refused(agui_parts, _agui(part), "messages[0].content")
    assert exc.param == param
    assert words in exc.detail


# --- A2A -----------------------------------------------------------------------------------


async def test_a2a_file_parts() -> None:
    message = pb.Message(
        parts=[
            pb.Part(text="what are these"),
            pb.Part(raw=PNG, media_type="image/png", filename="cat.png"),
            pb.Part(url="https://example.com/a.pdf", media_type="application/pdf"),
            pb.Part(url=HTTPS_PNG),
        ]
    )
    assert await message_parts(message) == [
        {"type": "text", "text": "what are these"},
        {
            "where": "message.parts[1]",
            "type": "image",
            "url": PNG_URL,
            "media_type": "image/png",
            "filename": "cat.png",
        },
        {
            "where": "message.parts[2]",
            "type": "file",
            "url": "https://example.com/a.pdf",
            "media_type": "application/pdf",
        },
        {"where": "message.parts[3]", "type": "image", "url": HTTPS_PNG},
    ]


async def test_a2a_refusals() -> None:
    untyped = pb.Message(parts=[pb.Part(raw=PNG)])
    with pytest.raises(PartRefused, match="mediaType"):
        await message_parts(untyped)
    data = pb.Message(parts=[pb.Part(text="x"), pb.Part()])
    data.parts[1].data.struct_value.update({"a": 1})
    with pytest.raises(PartRefused, match=r"message.parts\[1\]: a data part"):
        await message_parts(data)
    lying = pb.Message(parts=[pb.Part(url=PDF_URL, media_type="image/png")])
    with pytest.raises(UnsupportedMediaType, match="says application/pdf"):
        await message_parts(lying)


def test_a2a_history_shows_file_references() -> None:
    parts = history_parts(
        [
            {"type": "text", "text": "hi"},
            {"type": "image", "ref": "file_1", "media_type": "image/png", "filename": "a.png"},
            {"type": "document", "url": "https://example.com/a.pdf"},
        ],
        "http://127.0.0.1:8000",
    )
    assert parts[0].text == "hi"
    assert parts[1].url == "http://127.0.0.1:8000/v1/files/file_1/content"
    assert (parts[1].media_type, parts[1].filename) == ("image/png", "a.png")
    assert not parts[1].raw
    assert parts[2].url == "https://example.com/a.pdf"


@pytest.mark.parametrize("size", [0, 1, 2, 3, 192 * 1024, 192 * 1024 + 1, 1_000_003])
def test_bytes_encoded_piece_by_piece_are_the_whole_base64(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    expected = "data:image/png;base64," + base64.b64encode(data).decode()
    assert data_url_of_bytes("image/png", data) == expected


async def test_a2a_base64_is_set_aside_before_the_sdk_parses_it() -> None:
    """A large bytes field or data URL reaches the SDK's parser as a short placeholder and
    the intake as the base64 the client sent."""
    big = PNG + bytes(range(256)) * 2000
    encoded = base64.b64encode(big).decode()
    url = f"data:application/pdf;base64,{encoded}"
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": "m",
                "role": "ROLE_USER",
                "parts": [
                    {"text": "two files"},
                    {"raw": encoded, "mediaType": "image/png"},
                    {"url": url, "mediaType": "application/pdf", "metadata": {"raw": "kept"}},
                ],
            }
        },
    }
    body = json.dumps(request).encode()
    rest, media = set_media_aside(body)
    assert len(rest) < 1000 and len(media) == 2
    message = json_format.ParseDict(json.loads(rest)["params"], pb.SendMessageRequest()).message
    assert len(message.parts[1].raw) == 24  # the placeholder's bytes, not the image's
    assert message.parts[2].metadata["raw"] == "kept"  # a short string is left as it is
    parts = await message_parts(message, media)
    assert parts[1]["url"] == f"data:image/png;base64,{encoded}"
    assert parts[2]["url"] == url
    # without the guard's table, the same placeholder is only bytes
    assert (await message_parts(message))[1]["url"] != parts[1]["url"]
