"""Small, well-formed samples of every media type the files take (and some they do not).

Each is built from its format's own structure (a PNG's chunks with their CRCs, a JPEG's
markers, a GIF's blocks, a WebP's RIFF header, a PDF's objects and trailer), so a test can cut
one short, or change one byte, and know what it made. ``pad`` makes a sample as large as a test
wants while keeping it whole.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(pad: int = 0, *, seed: int = 0) -> bytes:
    """A 1x1 grey PNG; ``pad`` bytes of a private ancillary chunk (``prVt``) make it larger,
    and ``seed`` makes samples of the same size differ."""
    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    pixels = zlib.compress(bytes([0, seed % 256]))
    pattern = bytes((seed + i) % 251 for i in range(251))
    extra = _png_chunk(b"prVt", (pattern * (pad // 251 + 1))[:pad]) if pad else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + extra
        + _png_chunk(b"IDAT", pixels)
        + _png_chunk(b"IEND", b"")
    )


def jpeg(pad: int = 0) -> bytes:
    """The markers of a baseline JPEG (SOI, APP0 JFIF, a comment of ``pad`` bytes, EOI)."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    body = b"\xff\xe0" + struct.pack(">H", len(app0) + 2) + app0
    comment = b"x" * min(pad, 65533)
    body += b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment
    return b"\xff\xd8" + body + b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00\x12\x34" + b"\xff\xd9"


def gif() -> bytes:
    """A 1x1 GIF89a."""
    return (
        b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff"
        b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    )


def webp() -> bytes:
    """A WebP's RIFF container around a (lossless) VP8L chunk."""
    chunk = b"VP8L" + struct.pack("<I", 10) + b"\x2f\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def pdf() -> bytes:
    """A one-page PDF."""
    return (
        b"%PDF-1.4\n1 0 obj <</Type /Catalog /Pages 2 0 R>> endobj\n"
        b"2 0 obj <</Type /Pages /Kids [3 0 R] /Count 1>> endobj\n"
        b"3 0 obj <</Type /Page /Parent 2 0 R /MediaBox [0 0 10 10]>> endobj\n"
        b"trailer <</Root 1 0 R>>\n%%EOF\n"
    )


def zip_archive() -> bytes:
    """A ZIP archive holding one text file (what a ``.docx`` or a disguised upload is)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("note.txt", "not a PDF")
    return buffer.getvalue()
