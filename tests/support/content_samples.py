"""Small, valid media for tests of content parts: a PNG, a PDF, and an image of any size."""

from __future__ import annotations

import struct
import zlib

__all__ = ["PDF", "PNG", "big_png", "png"]


def png(width: int = 1, height: int = 1) -> bytes:
    """A real RGB PNG of ``width`` x ``height`` black pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x00\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def big_png(size: int) -> bytes:
    """``size`` bytes that begin as a PNG does, the rest a pattern no compressor would keep
    small: what a test of where bytes go needs, not a picture to look at."""
    head = png()
    filler = bytes((i * 7919 + (i >> 8)) & 0xFF for i in range(4096))
    body = (filler * (size // len(filler) + 1))[: size - len(head)]
    return head + body


#: A 1x1 PNG.
PNG = png()
#: A minimal one-page PDF.
PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 72 72]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)
