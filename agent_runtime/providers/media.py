"""What the chat providers share to put images and documents on their wires.

``MediaReader`` reads a call's media parts for one provider: the bytes of a part (its own, its
stored reference's, or a ``data:`` URL's), as base64 or as text, and the error for a part the
wire cannot carry. Encoding and decoding a large part happens in a worker thread: a 20 MB
image is about 30 ms of base64 work, which on the loop would stall every other run.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import unquote_to_bytes

from ..content import ContentError, MediaPart
from ..errors import UnsupportedContentError
from ..input_kinds import unsupported
from ..model import ModelRequest

__all__ = ["OFF_LOOP_BYTES", "TEXT_DOCUMENT_TYPES", "MediaReader", "split_data_url"]

#: Parts larger than this are encoded and decoded in a worker thread, not on the loop.
OFF_LOOP_BYTES = 256 * 1024
#: Document media types sent as their text (every wire takes a PDF as a file of its own).
TEXT_DOCUMENT_TYPES = frozenset({"text/plain", "text/markdown", "text/csv"})

T = TypeVar("T")


def split_data_url(url: str) -> tuple[str | None, bool, str] | None:
    """``data:[<media type>][;base64],<payload>`` as (media type, is base64, payload), or None
    for a URL of another scheme."""
    if not url.startswith("data:"):
        return None
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise ContentError("a data: URL without a comma has no payload")
    params = head.split(";")
    is_base64 = params[-1].lower() == "base64"
    media_type = params[0].strip().lower() or None
    return media_type, is_base64, payload


async def _off_loop(size: int, work: Callable[[], T]) -> T:
    if size <= OFF_LOOP_BYTES:
        return work()
    return await asyncio.to_thread(work)


@dataclass(slots=True)
class MediaReader:
    """The media parts of one call, as the provider ``provider`` sends them to ``model``.

    ``carried`` counts the characters of media put on the wire so far: a body carrying more
    than ``OFF_LOOP_BYTES`` is worth encoding as JSON off the loop too.
    """

    request: ModelRequest
    model: str
    provider: str
    carried: int = 0

    @property
    def heavy(self) -> bool:
        """True once the call carries enough media to encode its body off the loop."""
        return self.carried > OFF_LOOP_BYTES

    def media_type(self, part: MediaPart) -> str | None:
        """The part's media type: declared, or named by its ``data:`` URL."""
        if part.media_type:
            return part.media_type.lower()
        if part.url is not None:
            with contextlib.suppress(ContentError):  # malformed: data() says so
                split = split_data_url(part.url)
                if split is not None:
                    return split[0]
        return None

    def remote_url(self, part: MediaPart) -> str | None:
        """The part's URL when it is one the provider fetches itself (not a ``data:`` URL)."""
        if part.url is not None and not part.url.startswith("data:"):
            return part.url
        return None

    async def data(self, part: MediaPart) -> bytes:
        """The part's bytes: its own, its reference's, or its ``data:`` URL's.

        Bytes that cannot be read (a reference the store lacks, a malformed ``data:`` URL)
        refuse the part: the call fails before anything is sent, never without the part.
        """
        try:
            return await self._data(part)
        except ContentError as exc:
            raise self.refuse(part, f"its bytes could not be read ({exc})") from exc

    async def _data(self, part: MediaPart) -> bytes:
        if part.url is not None:
            split = split_data_url(part.url)
            if split is None:
                raise ContentError(f"a {part.kind} given by URL has no bytes here")
            _, is_base64, payload = split
            if not is_base64:
                return unquote_to_bytes(payload)
            return await _off_loop(len(payload), lambda: _b64decode(payload))
        return await self.request.media_bytes(part)

    async def base64(self, part: MediaPart) -> str:
        """The part's bytes in base64 (a ``data:`` URL's payload as it is)."""
        encoded: str | None = None
        if part.url is not None:
            with contextlib.suppress(ContentError):  # malformed: data() says so
                split = split_data_url(part.url)
                if split is not None and split[1]:
                    encoded = split[2]
        if encoded is None:
            data = await self.data(part)
            encoded = await _off_loop(len(data), lambda: base64.b64encode(data).decode("ascii"))
        self.carried += len(encoded)
        return encoded

    async def data_url(self, part: MediaPart) -> str:
        """The part as a ``data:<media type>;base64,...`` URL."""
        if part.url is not None and part.url.startswith("data:"):
            self.carried += len(part.url)
            return part.url
        encoded = await self.base64(part)
        return f"data:{self.media_type(part) or 'application/octet-stream'};base64,{encoded}"

    async def text(self, part: MediaPart) -> str:
        """A text document's content (UTF-8; a byte that is not becomes U+FFFD)."""
        data = await self.data(part)
        self.carried += len(data)
        return await _off_loop(len(data), lambda: data.decode("utf-8", errors="replace"))

    def refuse(self, part: MediaPart, why: str | None = None) -> UnsupportedContentError:
        """The error for a part this wire or model cannot carry, raised before any request."""
        return unsupported(part, model=self.model, provider=self.provider, why=why)


def _b64decode(payload: str) -> bytes:
    try:
        return base64.b64decode(unquote_to_bytes(payload), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ContentError(f"a data: URL whose payload is not base64: {exc}") from None
