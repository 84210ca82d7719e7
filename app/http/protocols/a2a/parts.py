"""Which A2A message parts the service's agents take, and the refusal of the others.

The agent's input is text (``text`` parts, of a ``text/*`` media type or none); ``data`` parts
(JSON) answer a confirmation. A part of any other kind or media type cannot be passed on: the
message is refused with ``ContentTypeNotSupportedError`` (-32005; HTTP+JSON 400), never
answered as if the part had not been sent.
"""

from __future__ import annotations

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError

__all__ = ["INPUT_MODES", "refuse_unsupported_parts"]

INPUT_MODES = ("text/plain", "application/json")
"""The media types the agent card declares as input."""


def _accepted(part: pb.Part) -> bool:
    kind = part.WhichOneof("content")
    media = part.media_type.lower()
    if kind == "text":
        return not media or media.startswith("text/")
    if kind == "data":
        return not media or media == "application/json"
    return False


def refuse_unsupported_parts(message: pb.Message) -> None:
    """``ContentTypeNotSupportedError`` for the first part the agent cannot take."""
    for index, part in enumerate(message.parts):
        if not _accepted(part):
            kind = part.WhichOneof("content") or "empty"
            media = part.media_type or "no media type"
            raise ContentTypeNotSupportedError(
                f"message.parts[{index}]: a {kind} part ({media}) is not an input this agent "
                f"takes; it takes {', '.join(INPUT_MODES)} (text parts, and data parts that "
                "answer a confirmation)"
            )
