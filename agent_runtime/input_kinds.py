"""What a model takes as input (text, images, documents), and the check made before a call.

A model declares ``input_kinds``, a frozenset of ``"text"``, ``"image"`` and ``"document"``.
A model that declares nothing takes text only: a custom model says that it reads images or
documents (``input_kinds = ALL_INPUT_KINDS``), because one that ignored a part it was given
would drop it without a word. A binding may narrow what its model takes
(``ModelBinding.llm(..., input_kinds={"text"})``), for a model that its wire would let receive
more than it can read.

Before a call is sent, the conversation is fitted to what the model takes (``fit_messages``):

- an image or a document in a user message that the model cannot take fails the call with
  ``UnsupportedContentError``, naming the kind, the media type and the model: what a person
  sent is never dropped, and nothing is sent;
- an image or a document a tool returned that the model cannot take is replaced by a line of
  the tool result's text that says so: the model learns that the tool gave one and that it
  could not see it, and the run goes on (a tool's picture should not end a text model's run).

The runtime does this for each binding it tries (a failover may reach a binding that takes
the part); each provider does it again for its own kinds, so a provider used on its own checks
too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .content import MediaPart, TextPart
from .errors import ConfigurationError, UnsupportedContentError
from .messages import Message, ToolMessage, UserMessage

__all__ = [
    "ALL_INPUT_KINDS",
    "TEXT_ONLY",
    "as_input_kinds",
    "declared_input_kinds",
    "fit_messages",
    "unsupported",
]

#: Every kind of input a message can hold.
ALL_INPUT_KINDS: frozenset[str] = frozenset({"text", "image", "document"})
#: What a model that declares nothing takes.
TEXT_ONLY: frozenset[str] = frozenset({"text"})


def as_input_kinds(kinds: Iterable[str]) -> frozenset[str]:
    """``kinds`` checked: known kinds, ``text`` among them; ConfigurationError otherwise."""
    if isinstance(kinds, str | bytes):
        raise ConfigurationError(
            f"input_kinds is a set of kinds such as {{'text', 'image'}}, not the string {kinds!r}"
        )
    chosen = frozenset(kinds)
    unknown = sorted(str(k) for k in chosen - ALL_INPUT_KINDS)
    if unknown:
        raise ConfigurationError(
            f"unknown input kind(s) {', '.join(unknown)}: choose among "
            f"{', '.join(sorted(ALL_INPUT_KINDS))}"
        )
    if "text" not in chosen:
        raise ConfigurationError("input_kinds must include 'text': every model takes text")
    return chosen


def declared_input_kinds(model: object) -> frozenset[str]:
    """What ``model`` says it takes: its ``input_kinds``, or text only when it says nothing."""
    declared = getattr(model, "input_kinds", None)
    if declared is None:
        return TEXT_ONLY
    return frozenset(declared) | TEXT_ONLY


def unsupported(
    part: MediaPart, *, model: str, provider: str | None, why: str | None = None
) -> UnsupportedContentError:
    """The error for a ``part`` that ``model`` cannot take (``why``: the reason, if not the
    model's kinds)."""
    article = "an" if part.kind == "image" else "a"
    media_type = part.media_type or "of an unknown media type"
    reason = why or f"it takes no {part.kind}s"
    return UnsupportedContentError(
        f"model {model!r} cannot take {article} {part.kind} ({media_type}): {reason}. "
        f"Remove the {part.kind}, or use a model that takes it",
        kind=part.kind,
        media_type=part.media_type,
        provider=provider,
    )


def fit_messages(
    messages: Sequence[Message], kinds: frozenset[str], *, model: str, provider: str | None
) -> Sequence[Message]:
    """``messages`` as a model taking ``kinds`` can read them (see the module docstring).

    The same sequence when nothing changes; UnsupportedContentError for a user's part the
    model cannot take.
    """
    if kinds >= ALL_INPUT_KINDS:
        return messages
    fitted: list[Message] | None = None
    for index, message in enumerate(messages):
        if isinstance(message, UserMessage) and not isinstance(message.content, str):
            for part in message.content:
                if not isinstance(part, TextPart) and part.kind not in kinds:
                    raise unsupported(part, model=model, provider=provider)
        elif isinstance(message, ToolMessage) and message.parts:
            if all(p.kind in kinds for p in message.parts):
                continue
            if fitted is None:
                fitted = list(messages)
            fitted[index] = _without_parts(message, kinds, model)
    return messages if fitted is None else fitted


def _without_parts(message: ToolMessage, kinds: frozenset[str], model: str) -> ToolMessage:
    kept = [p for p in message.parts if p.kind in kinds]
    notes = [
        f"[the tool returned {'an' if p.kind == 'image' else 'a'} {p.kind} "
        f"({p.media_type or 'unknown type'}) that model {model!r} cannot be shown]"
        for p in message.parts
        if p.kind not in kinds
    ]
    content = "\n".join([message.content, *notes]) if message.content else "\n".join(notes)
    return ToolMessage(
        message.tool_call_id,
        message.name,
        content,
        message.is_error,
        approval=message.approval,
        parts=kept,
    )
