"""What both wires share: the frame of a streamed answer and the error type of a status."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ERROR_TYPES", "Frame", "usage_or_default"]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass(slots=True)
class Frame:
    """One chunk of a streamed answer, as bytes on the wire."""

    data: bytes
    content: bool = False  # a chunk carrying answer content (text or argument fragment)


def usage_or_default(
    usage: tuple[int, int] | None, produced: int, counted_input: int | None = None
) -> tuple[int, int]:
    """The scripted ``(input_tokens, output_tokens)``, else the counted input (or 11) in and
    one per chunk out."""
    if usage is not None:
        return usage
    return (counted_input if counted_input is not None else 11, max(1, produced))
