"""The fake upstream's endpoints beyond chat: what OpenAI-compatible servers answer for them.

- ``POST /v1/embeddings``: one deterministic unit vector per input (a hash of the text, so the
  same text always gets the same vector), as floats or base64 float32 like the real API;
  ``dimensions`` sets the length (default ``FAKE_DIMENSIONS``).
- ``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``): the shape vLLM, Jina and Cohere serve;
  a document's score is the share of the query's words it contains.
- ``POST /v1/images/generations``: a small valid PNG per image (its colour from the prompt),
  base64, with ``revised_prompt`` and token usage.
- ``POST /v1/audio/speech``: a WAV file whose ``txt `` chunk carries the text it "speaks";
- ``POST /v1/audio/transcriptions`` (multipart): reads that chunk back, so speech round-trips.
- ``/v1/videos``: ``POST`` starts a job (multipart), ``GET /v1/videos/{id}`` advances it one step
  per poll (``queued`` → ``in_progress`` → ``completed``; a prompt containing ``fail`` fails),
  unless ``upstream.video_gate`` is set and closed, which holds every job ``in_progress``;
  ``GET .../content`` returns the bytes; ``DELETE`` removes it.

A POST takes the next scripted behaviour like a chat request: ``Status``, ``Drop``, ``Stall`` and
``Hold`` (answer once a gate opens) act on it; anything else, or nothing scripted, is the normal
answer above.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import secrets
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from .upstream import Behaviour, FakeUpstream, Gate, RecordedRequest

__all__ = [
    "FAKE_DIMENSIONS",
    "FakeVideo",
    "Hold",
    "answer",
    "capability_kind",
    "fake_vector",
    "multipart",
    "read_wav_text",
    "rerank_score",
    "wav_with_text",
]

FAKE_DIMENSIONS = 8
_RERANK = re.compile(r"^(/v\d)?/rerank$")
_VIDEO = re.compile(r"^/v1/videos(?:/([^/]+))?(/content)?$")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Hold:
    """Answer normally once ``gate`` opens (a client that leaves meanwhile ends the request)."""

    gate: Gate


@dataclass
class FakeVideo:
    """One video job of the fake."""

    id: str
    model: str
    prompt: str
    seconds: str
    size: str
    status: str = "queued"
    progress: int = 0
    polls: int = 0
    deleted: bool = False
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self) -> dict[str, Any]:
        error = (
            {"code": "generation_failed", "message": "the fake could not render this prompt"}
            if self.status == "failed"
            else None
        )
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": self.status,
            "progress": self.progress,
            "prompt": self.prompt,
            "seconds": self.seconds,
            "size": self.size,
            "created_at": self.created_at,
            "error": error,
        }

    def content(self) -> bytes:
        return b"\x00\x00\x00\x18ftypmp42" + self.prompt.encode()


def capability_kind(request: RecordedRequest) -> str | None:
    """Which capability endpoint ``request`` is for, or None (chat, or unknown)."""
    path = request.path
    if request.method == "POST":
        if path.endswith("/embeddings"):
            return "embeddings"
        if _RERANK.match(path):
            return "rerank"
        if path.endswith("/images/generations"):
            return "images"
        if path.endswith("/audio/speech"):
            return "speech"
        if path.endswith("/audio/transcriptions"):
            return "transcriptions"
    if _VIDEO.match(path) and request.method in ("POST", "GET", "DELETE"):
        return "videos"
    return None


# deterministic answers ---------------------------------------------------------------------------


def fake_vector(text: str, dimensions: int = FAKE_DIMENSIONS) -> list[float]:
    """The fake's embedding of ``text``: a unit vector derived from its hash, in float32
    precision (as a real server's vectors are, whichever encoding carries them)."""
    raw = [
        int.from_bytes(hashlib.sha256(f"{index}:{text}".encode()).digest()[:4], "little") / 2**31
        - 1.0
        for index in range(dimensions)
    ]
    norm = math.sqrt(sum(value * value for value in raw)) or 1.0
    unit = [value / norm for value in raw]
    return list(struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *unit)))


def rerank_score(query: str, document: str) -> float:
    """The share of the query's words that ``document`` contains."""
    words = {word.lower() for word in _WORD.findall(query)}
    found = {word.lower() for word in _WORD.findall(document)}
    return len(words & found) / len(words) if words else 0.0


def _png(prompt: str) -> bytes:
    """A valid 2x2 RGB PNG whose colour comes from the prompt."""
    red, green, blue = hashlib.sha256(prompt.encode()).digest()[:3]
    row = b"\x00" + bytes([red, green, blue]) * 2
    raw = row * 2

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def wav_with_text(text: str, *, samples: int = 800) -> bytes:
    """A mono 16-bit 8 kHz WAV of silence with a ``txt `` chunk holding ``text``."""
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    data = b"\x00\x00" * samples
    note = text.encode()
    if len(note) % 2:
        note += b"\x00"
    chunks = (
        b"fmt " + struct.pack("<I", len(fmt)) + fmt
        + b"txt " + struct.pack("<I", len(note)) + note
        + b"data" + struct.pack("<I", len(data)) + data
    )  # fmt: skip
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def read_wav_text(audio: bytes) -> str | None:
    """The ``txt `` chunk of a WAV made by ``wav_with_text`` (None if there is none)."""
    if audio[:4] != b"RIFF" or audio[8:12] != b"WAVE":
        return None
    position = 12
    while position + 8 <= len(audio):
        kind = audio[position : position + 4]
        (size,) = struct.unpack("<I", audio[position + 4 : position + 8])
        if kind == b"txt ":
            return audio[position + 8 : position + 8 + size].rstrip(b"\x00").decode()
        position += 8 + size + (size % 2)
    return None


def multipart(request: RecordedRequest) -> dict[str, bytes | str]:
    """The fields of a ``multipart/form-data`` body: text values as str, files as bytes."""
    content_type = request.headers.get("content-type", "")
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/form-data") or match is None:
        return {}
    boundary = b"--" + match.group(1).encode()
    fields: dict[str, bytes | str] = {}
    for part in request.body.split(boundary)[1:]:
        if part.startswith(b"--"):
            break
        head, _, value = part.lstrip(b"\r\n").partition(b"\r\n\r\n")
        value = value[:-2] if value.endswith(b"\r\n") else value
        disposition = head.decode("latin-1")
        name = re.search(r'name="([^"]*)"', disposition)
        if name is None:
            continue
        is_file = "filename=" in disposition
        fields[name.group(1)] = value if is_file else value.decode()
    return fields


# answering ---------------------------------------------------------------------------------------


async def answer(
    upstream: FakeUpstream,
    kind: str,
    request: RecordedRequest,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> bool:
    """Answer one capability request; False when the connection must not be reused."""
    from .upstream import Drop, Stall, Status

    behaviour: Behaviour | Hold | None = None
    if request.method == "POST" and not (kind == "videos" and request.path != "/v1/videos"):
        behaviour = upstream._next(request)
    if isinstance(behaviour, Hold):
        request.outcome = "held"
        upstream._changed()
        await upstream._hold(behaviour.gate, reader)
    elif isinstance(behaviour, Status):
        request.outcome = f"status {behaviour.status}"
        body = json.dumps(
            {
                "error": {
                    "message": behaviour.message,
                    "type": behaviour.error_type or "server_error",
                    "code": None,
                }
            }
        ).encode()
        headers = {"content-type": "application/json", **behaviour.headers}
        await upstream._send(writer, behaviour.status, headers, body)
        return True
    elif isinstance(behaviour, Stall):
        request.outcome = "stalled"
        upstream._changed()
        await upstream._until_disconnect(reader)
        return False
    elif isinstance(behaviour, Drop):
        request.outcome = "dropped"
        if behaviour.reset:
            writer.transport.abort()
        else:
            writer.close()
        return False
    handler = _HANDLERS[kind]
    code, headers, body = handler(upstream, request)
    request.outcome = "ok" if code < 400 else f"status {code}"
    await upstream._send(writer, code, headers, body)
    return True


_JSON = {"content-type": "application/json"}
Reply = tuple[int, dict[str, str], bytes]


def _json_answer(code: int, payload: Any) -> Reply:
    return code, dict(_JSON), json.dumps(payload).encode()


def _embeddings(upstream: FakeUpstream, request: RecordedRequest) -> Reply:
    body = request.json if isinstance(request.json, dict) else {}
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return _json_answer(400, {"error": {"message": "input must be a string or strings"}})
    dimensions = body.get("dimensions") or upstream.embedding_dimensions
    encoding = body.get("encoding_format", "float")
    data = []
    for index, text in enumerate(texts):
        vector = fake_vector(text, dimensions)
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = sum(len(_WORD.findall(text)) for text in texts)
    return _json_answer(
        200,
        {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
    )


def _rerank(upstream: FakeUpstream, request: RecordedRequest) -> Reply:
    body = request.json if isinstance(request.json, dict) else {}
    query = body.get("query")
    documents = body.get("documents")
    if not isinstance(query, str) or not isinstance(documents, list):
        return _json_answer(400, {"error": {"message": "query and documents are required"}})
    texts = [d if isinstance(d, str) else str(d.get("text", "")) for d in documents]
    order = sorted(range(len(texts)), key=lambda i: (-rerank_score(query, texts[i]), i))
    top_n = body.get("top_n")
    if isinstance(top_n, int):
        order = order[:top_n]
    results = []
    for index in order:
        row: dict[str, Any] = {"index": index, "relevance_score": rerank_score(query, texts[index])}
        if body.get("return_documents"):
            row["document"] = {"text": texts[index]}
        results.append(row)
    tokens = len(_WORD.findall(query)) + sum(len(_WORD.findall(t)) for t in texts)
    return _json_answer(
        200,
        {
            "id": f"rerank-{secrets.token_hex(4)}",
            "model": body.get("model"),
            "results": results,
            "usage": {"total_tokens": tokens},
        },
    )


def _images(upstream: FakeUpstream, request: RecordedRequest) -> Reply:
    body = request.json if isinstance(request.json, dict) else {}
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        return _json_answer(400, {"error": {"message": "prompt is required"}})
    count = int(body.get("n") or 1)
    data = [
        {
            "b64_json": base64.b64encode(_png(f"{prompt}#{index}")).decode(),
            "revised_prompt": f"{prompt} (as drawn by the fake)",
        }
        for index in range(count)
    ]
    words = len(_WORD.findall(prompt))
    return _json_answer(
        200,
        {
            "created": int(time.time()),
            "data": data,
            "usage": {
                "input_tokens": words,
                "output_tokens": 272 * count,
                "total_tokens": words + 272 * count,
                "input_tokens_details": {"image_tokens": 0, "text_tokens": words},
            },
        },
    )


def _speech(upstream: FakeUpstream, request: RecordedRequest) -> Reply:
    body = request.json if isinstance(request.json, dict) else {}
    text = body.get("input")
    if not isinstance(text, str) or not text:
        return _json_answer(400, {"error": {"message": "input is required"}})
    media = {"wav": "audio/wav", "mp3": "audio/mpeg", "pcm": "audio/pcm"}
    content_type = media.get(str(body.get("response_format", "mp3")), "audio/mpeg")
    return 200, {"content-type": content_type}, wav_with_text(text)


def _transcriptions(upstream: FakeUpstream, request: RecordedRequest) -> Reply:
    fields = multipart(request)
    audio = fields.get("file")
    if not isinstance(audio, bytes) or not audio:
        return _json_answer(400, {"error": {"message": "file is required"}})
    text = read_wav_text(audio) or "(the fake heard no words)"
    response_format = fields.get("response_format", "json")
    if response_format == "text":
        return 200, {"content-type": "text/plain"}, text.encode()
    payload: dict[str, Any] = {"text": text}
    if response_format == "verbose_json":
        language = fields.get("language")
        payload.update(
            {"language": language if isinstance(language, str) else "english", "duration": 0.1}
        )
    return _json_answer(200, payload)


def _videos(upstream: FakeUpstream, request: RecordedRequest) -> Reply:
    match = _VIDEO.match(request.path)
    assert match is not None
    video_id, content = match.group(1), match.group(2)
    if request.method == "POST" and video_id is None:
        fields = multipart(request)
        if not fields and isinstance(request.json, dict):
            fields = {key: str(value) for key, value in request.json.items()}
        prompt = fields.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return _json_answer(400, {"error": {"message": "prompt is required"}})
        video = FakeVideo(
            id=f"video_{secrets.token_hex(6)}",
            model=str(fields.get("model") or "sora-2"),
            prompt=prompt,
            seconds=str(fields.get("seconds") or "4"),
            size=str(fields.get("size") or "720x1280"),
        )
        upstream.videos[video.id] = video
        return 200, {**_JSON, "openai-poll-after-ms": "10"}, json.dumps(video.body()).encode()
    found = upstream.videos.get(video_id or "")
    if found is None or found.deleted:
        return _json_answer(404, {"error": {"message": f"no video {video_id}"}})
    if request.method == "DELETE":
        found.deleted = True
        return _json_answer(200, {"id": found.id, "object": "video.deleted", "deleted": True})
    if content:
        if found.status != "completed":
            return _json_answer(409, {"error": {"message": "the video is not ready"}})
        return 200, {"content-type": "video/mp4"}, found.content()
    found.polls += 1
    held = upstream.video_gate is not None and not upstream.video_gate.is_open
    if "fail" in found.prompt:
        found.status, found.progress = "failed", 0
    elif held or found.polls < upstream.video_polls:
        found.status = "in_progress"
        found.progress = min(99, 100 * found.polls // (upstream.video_polls + 1))
    else:
        found.status, found.progress = "completed", 100
    return 200, {**_JSON, "openai-poll-after-ms": "10"}, json.dumps(found.body()).encode()


_HANDLERS = {
    "embeddings": _embeddings,
    "rerank": _rerank,
    "images": _images,
    "speech": _speech,
    "transcriptions": _transcriptions,
    "videos": _videos,
}
