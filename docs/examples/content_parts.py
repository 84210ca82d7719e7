"""An image and a PDF sent to the offline demo model, which says what it received.

The run stores the bytes in the agent's content store; the conversation holds references. A
binding narrowed to text refuses the same prompt before any call is made.
"""

import asyncio
import json
import struct
import zlib

from agent_runtime import AgentCore, ModelBinding
from agent_runtime.content import ContentPart, DocumentPart, ImagePart, TextPart
from agent_runtime.errors import UnsupportedContentError
from agent_runtime.messages import message_to_dict
from agent_runtime.providers import DemoModel


def one_pixel_png() -> bytes:
    """A real 1x1 black PNG, built here so that the example needs no file."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x00\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PDF = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"

PROMPT: list[ContentPart] = [
    TextPart("What are these?"),
    ImagePart(media_type="image/png", data=one_pixel_png()),
    DocumentPart(media_type="application/pdf", data=PDF, filename="hello.pdf"),
]


async def main() -> None:
    async with AgentCore.open(DemoModel(token_delay=0)) as agent:
        response = await agent.chat(PROMPT)
        print(response.content)
        # the conversation keeps the image by reference; its bytes are in the content store
        stored = message_to_dict(response.messages[0])["content"][1]
        print("stored as:", json.dumps(stored))
        print("bytes kept:", len(await agent.content_store.get(stored["ref"])))

    text_only = ModelBinding.llm(provider=DemoModel(token_delay=0), input_kinds={"text"})
    async with AgentCore.open(text_only) as agent:
        try:
            await agent.chat(PROMPT)
        except UnsupportedContentError as error:
            print(f"text-only binding: {error.code}: {error}")


if __name__ == "__main__":
    asyncio.run(main())
