"""A fast fake OpenAI-compatible upstream for scenario 2, in a process of its own.

    python -m bench.fake_openai --port 9001 [--words 9] [--gap 0.01]

``POST /v1/chat/completions`` answers every request at once with the same short answer:
streamed (role chunk, one chunk per word, finish chunk, usage chunk if asked, ``[DONE]``) or
whole. The first word goes out at once and the rest ``--gap`` seconds later, as a real model
spaces its tokens: a client measuring the time to the first word is then not charged for
decoding the words after it. Raw asyncio streams and pre-encoded chunks keep its own cost
far below the service's, and the service and the direct SDK call meet the same upstream.
``GET /stats`` answers what it was sent: ``{"requests": n, "large_requests": n,
"largest_body": bytes}`` (a large request's body is 1 MB or more: one that carried an image).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

__all__ = ["main"]

LARGE_BODY = 1_000_000
_ANSWER = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


def _chunk(model: str, delta: dict[str, object], finish: str | None = None) -> bytes:
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    data = f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Upstream:
    def __init__(self, words: int, gap: float) -> None:
        self.gap = gap
        self.words = [w + " " for w in (_ANSWER * (1 + words // len(_ANSWER)))[:words]]
        self._cache: dict[tuple[str, bool], tuple[bytes, bytes]] = {}
        self.requests = 0
        self.large_requests = 0
        self.largest_body = 0

    def stream_bytes(self, model: str, usage: bool) -> tuple[bytes, bytes]:
        """(head and first content chunk, the rest) for ``model``."""
        key = (model, usage)
        if key not in self._cache:
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            first = _chunk(model, {"role": "assistant", "content": ""})
            first += _chunk(model, {"content": self.words[0]})
            rest = b"".join(_chunk(model, {"content": w}) for w in self.words[1:])
            rest += _chunk(model, {}, "stop")
            if usage:
                payload = {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 5,
                        "completion_tokens": len(self.words),
                        "total_tokens": 5 + len(self.words),
                    },
                }
                data = f"data: {json.dumps(payload)}\n\n".encode()
                rest += f"{len(data):x}\r\n".encode() + data + b"\r\n"
            done = b"data: [DONE]\n\n"
            rest += f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n"
            self._cache[key] = (head + first, rest)
        return self._cache[key]

    def whole_bytes(self, model: str) -> bytes:
        body = json.dumps(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(self.words)},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
            }
        ).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        return head.encode() + b"\r\n\r\n" + body

    def stats_bytes(self) -> bytes:
        body = json.dumps(
            {
                "requests": self.requests,
                "large_requests": self.large_requests,
                "largest_body": self.largest_body,
            }
        ).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        return head.encode() + b"\r\n\r\n" + body

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line.strip():
                    break
                length = 0
                while True:
                    raw = await reader.readline()
                    if raw in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = raw.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                raw_body = await reader.readexactly(length) if length else b""
                if line.startswith(b"GET /stats"):
                    writer.write(self.stats_bytes())
                    continue
                if b"/chat/completions" not in line:
                    missing = b'{"error":{"message":"not found"}}'
                    writer.write(
                        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                        + f"content-length: {len(missing)}\r\n\r\n".encode()
                        + missing
                    )
                    continue
                self.requests += 1
                if length >= LARGE_BODY:
                    self.large_requests += 1
                self.largest_body = max(self.largest_body, length)
                body = json.loads(raw_body) if raw_body else {}
                model = str(body.get("model", "bench"))
                if body.get("stream"):
                    usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    first, rest = self.stream_bytes(model, usage)
                    writer.write(first)
                    await writer.drain()
                    if self.gap:
                        await asyncio.sleep(self.gap)
                    writer.write(rest)
                else:
                    writer.write(self.whole_bytes(model))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _main(port: int, words: int, gap: float) -> None:
    upstream = Upstream(words, gap)
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", port)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="fake OpenAI upstream for the benchmarks")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--words", type=int, default=9)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds after the first word")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(_main(args.port, args.words, args.gap))
    except ImportError:  # pragma: no cover
        asyncio.run(_main(args.port, args.words, args.gap))


if __name__ == "__main__":
    main()
