"""Request and response bodies of the HTTP API (pydantic, at the edge only)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic.json_schema import SkipJsonSchema

__all__ = [
    "SESSION_CURSOR_PATTERN",
    "SESSION_ID_PATTERN",
    "SESSION_ID_RULE",
    "AcceptedBy",
    "BackgroundAccepted",
    "CancelAnswer",
    "ExternalEventRequest",
    "FileInputPart",
    "ImageInputPart",
    "InputPart",
    "MessagesView",
    "Problem",
    "RunRequest",
    "RunResult",
    "RunView",
    "SessionId",
    "SessionList",
    "SessionPatch",
    "SessionView",
    "ShownPart",
    "TextInputPart",
    "TurnRun",
    "is_session_id",
    "unicode_text",
]

SESSION_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
# the `next` of GET /v1/sessions: a session's updated_at (microseconds since the epoch, up to
# 17 digits so that every match is a valid time) and its id. Exact, so that every string the
# pattern admits is a cursor the server accepts (the schema-driven fuzzer holds it to that).
SESSION_CURSOR_PATTERN = r"^[0-9]{1,17}\.[A-Za-z0-9._:-]{1,128}$"

SESSION_ID_RULE = "1 to 128 characters of A-Z a-z 0-9 . _ : -"
# matched whole (fullmatch): the pattern's "$" would also take a newline before the end
_SESSION_ID = re.compile(SESSION_ID_PATTERN.removeprefix("^").removesuffix("$"))


def is_session_id(value: object) -> bool:
    """True if ``value`` is a string that keeps the session-id rule (``SESSION_ID_RULE``)."""
    return isinstance(value, str) and _SESSION_ID.fullmatch(value) is not None


SessionId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=128,
        pattern=SESSION_ID_PATTERN,
        description=SESSION_ID_RULE,
    ),
]


def unicode_text(data: Any, *, stored: bool = True, where: str = "body") -> Any:
    """``data`` if every database can store it exactly; a ValueError naming what cannot be.

    Refused, at the edge and the same on every backend, rather than stored on one and failing
    on another (``stored=False``: only what no encoder takes, the first point); ``where`` names
    ``data`` in the message (a protocol's own field name), and its members are named below it:

    - a lone UTF-16 surrogate (JSON may escape one, ``"\\ud800"``): no UTF-8 encoder (the
      database, the SSE stream) accepts it;
    - NUL (``"\\u0000"``) in a string or a key: PostgreSQL's text and jsonb cannot hold it;
    - a number out of range (``1e400``, read as infinity) or ``NaN``/``Infinity``: JSON has no
      such number, so it could be neither stored as JSON nor answered.

    Iterative, so a deeply nested body costs no recursion.
    """
    pending: list[tuple[str, Any]] = [(where, data)]
    while pending:
        name, value = pending.pop()
        if isinstance(value, str):
            try:
                # an ASCII string (a data URL's megabytes of base64) holds no surrogate, and
                # isascii is a flag the string keeps: no pass over it on the event loop
                if not value.isascii():
                    value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"{name} contains a lone UTF-16 surrogate, which is not text"
                ) from None
            if stored and "\x00" in value:
                raise ValueError(f"{name} contains NUL (U+0000), which cannot be stored")
        elif isinstance(value, float):
            if stored and not math.isfinite(value):
                raise ValueError(f"{name} is a number out of range (not a finite double)")
        elif isinstance(value, dict):
            # the top level's own fields are named; what a client put inside them (its keys
            # too) is never echoed
            for key, item in value.items():
                named = value is data and isinstance(key, str) and key.isidentifier()
                pending.append((f"a key of {name}", key))
                pending.append((f"{name}.{key}" if named else name, item))
        elif isinstance(value, list):
            pending.extend((name, item) for item in value)
    return data


class JsonSchemaFormat(BaseModel):
    """The ``json_schema`` of a ``response_format`` (the shape OpenAI's API uses)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(
        "output", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="A label."
    )
    description: str | None = Field(None, max_length=1024)
    json_schema: dict[str, Any] = Field(
        alias="schema", description="The JSON schema the answer must match."
    )
    strict: bool = Field(False, description="Ask the provider for strict schema adherence.")

    # JSON's own true and false only, as the schema says (pydantic would take 0 or "yes")
    @field_validator("strict", mode="before")
    @classmethod
    def _a_boolean(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value


class ResponseFormat(BaseModel):
    """``{"type": "json_schema", "json_schema": {...}}``: the answer must be JSON matching it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat

    def runtime_form(self) -> dict[str, Any]:
        """The runtime's ``response_format`` option."""
        return {
            "type": "json_schema",
            "json_schema": {
                "name": self.json_schema.name,
                "schema": self.json_schema.json_schema,
                "strict": self.json_schema.strict,
            },
        }


class TextInputPart(BaseModel):
    """A piece of the user's message as text."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str = Field(description="The text; not blank (422 `empty_input`).")


# no store holds a NUL exactly: refused by the schema, so the OpenAPI document says so
_NO_NUL = r"^[^\x00]*$"

_MEDIA_SOURCE: JsonDict = {"oneOf": [{"required": ["file_id"]}, {"required": ["url"]}]}

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""The media types an image part may declare (``agent_runtime.content.IMAGE_MEDIA_TYPES``)."""
FILE_TYPES = (*IMAGE_TYPES, "application/pdf", "text/plain", "text/markdown", "text/csv")
"""The media types a file part may declare (images, and ``DOCUMENT_MEDIA_TYPES``)."""


def _no_default(schema: JsonDict) -> None:
    # a member that may be left out but not null: its schema has no ``default: null``
    schema.pop("default", None)


def _optional(**kwargs: Any) -> Any:
    """A member that may be left out, but is a string when given (not null)."""
    kwargs.setdefault("json_schema_extra", _no_default)
    return Field(None, **kwargs)


def _no_nul_url(schema: JsonDict) -> None:
    _no_default(schema)
    schema["pattern"] = _NO_NUL


class _MediaInputPart(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_MEDIA_SOURCE)

    file_id: str | SkipJsonSchema[None] = _optional(
        min_length=1,
        max_length=128,
        pattern=_NO_NUL,
        description="One of the caller's files (`POST /v1/files`); another principal's file "
        "and a missing one alike are 404 `file_not_found`.",
    )
    url: str | SkipJsonSchema[None] = _optional(
        min_length=1,
        # the schema says it; the check is the request's own NUL check (unicode_text), which
        # costs nothing per byte of a megabyte data URL, where this pattern would scan it all
        json_schema_extra=_no_nul_url,
        description="A `data:` URL (the bytes, base64: stored as a file of the caller on "
        "arrival, its media type checked against its bytes) or an `https` URL (handed to the "
        "model's provider as it is, never fetched by the service). Other schemes: 422 "
        "`unsupported_url`.",
    )
    filename: str | SkipJsonSchema[None] = _optional(
        min_length=1,
        max_length=255,
        pattern=_NO_NUL,
        description="The file's name, shown to the model.",
    )

    @field_validator("file_id", "url", "filename", "media_type", mode="before", check_fields=False)
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("leave it out rather than null")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Any:
        if (self.file_id is None) == (self.url is None):
            raise ValueError("give exactly one of file_id and url")
        return self


class ImageInputPart(_MediaInputPart):
    """An image: PNG, JPEG, GIF or WebP."""

    type: Literal["image"]
    media_type: Literal[IMAGE_TYPES] | SkipJsonSchema[None] = _optional(  # type: ignore[valid-type]
        description="The image's media type, if the part says it: its bytes must be of it "
        "(415 `unsupported_media_type` otherwise)."
    )


class FileInputPart(_MediaInputPart):
    """A document (PDF, plain text, Markdown, CSV), or an image."""

    type: Literal["file"]
    media_type: Literal[FILE_TYPES] | SkipJsonSchema[None] = _optional(  # type: ignore[valid-type]
        description="The file's media type, if the part says it: its bytes must be of it "
        "(415 `unsupported_media_type` otherwise)."
    )


InputPart = Annotated[TextInputPart | ImageInputPart | FileInputPart, Field(discriminator="type")]


class RunRequest(BaseModel):
    """``POST /v1/sessions/{session_id}/runs``."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"not": {"required": ["replaces", "branch_from"]}}
    )

    input: str | list[InputPart] = Field(
        description="The user's message: a string, or content parts (text, images, "
        "documents), at most 64 (422 `too_many_parts`), whose images and documents come to "
        'AGENT_MAX_FILE_BYTES at most (413 `input_too_large`). See docs/api.md, "Run input '
        'parts".'
    )
    agent: str = Field("default", description="Name of a configured agent.")
    stream: bool = Field(True, description="Answer text/event-stream (else JSON when done).")
    background: bool = Field(False, description="Answer 202 at once; read events separately.")
    on_disconnect: Literal["cancel", "continue"] = Field(
        "cancel", description="What a streaming or blocking client's disconnect does to the run."
    )
    run_timeout: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Seconds for the whole run."
    )
    max_iterations: int | None = Field(None, ge=1, le=1000, description="Model calls at most.")
    metadata: dict[str, Any] | None = Field(None, description="Stored with the run.")
    skill: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="One of the agent's skills (GET /v1/agents), active from the run's start.",
    )
    response_format: ResponseFormat | None = Field(
        None,
        description="Structured output: the answer is validated against the schema (the model "
        "is given the error and retried, twice at most) and is `run.completed`'s "
        "`output.structured`.",
    )
    replaces: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="The id of the session's latest run: this run takes the place of its turn "
        "(regenerate, or edit and resend). That turn is removed from the conversation before "
        "this run reads it; 409 `turn_not_latest` when the run is not the session's latest "
        "(the conversation moved on), 404 when it is no run of the session.",
    )
    branch_from: str | SkipJsonSchema[None] = _optional(
        min_length=1,
        max_length=128,
        description="The run whose turn this run continues, in place of the session's latest "
        "turn: the model sees the conversation up to that turn on its branch, and this turn is "
        "a new branch beside the turns that already follow it (edit an earlier message, or "
        "regenerate an answer, keeping the old ones). `start`: a new first turn. 404 when it is "
        "no run of the session, 422 `not_a_turn` when it is one that stored no turn (failed, "
        "or not ended). Not with `replaces`. See `GET /v1/sessions/{session_id}/messages` for "
        "the tree.",
    )
    webhook_url: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        # the shape check_url enforces first, said in the schema so that clients see it
        pattern=r"^[Hh][Tt][Tt][Pp][Ss]?://[!-~]+$",
        description="An http(s) URL the run's end (`run.completed`, `run.failed`, "
        "`run.cancelled`) and its confirmation requests (`run.confirmation_requested`) are "
        "posted to, signed as Standard Webhooks do; replaces the agent's own. A host that "
        "resolves to a non-public address is refused: 422 `webhook_url_refused`.",
    )
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback"] = Field(
        "reject",
        description="What the start does while the session has an active run: `reject` "
        "(409 `session_busy`), `enqueue` (wait behind it, first come first served; 429 "
        "`overloaded` past AGENT_MAX_SESSION_QUEUE), `interrupt` (cancel it, reason "
        "`superseded`, keeping its turn as a stopped turn, then start) or `rollback` (cancel "
        "it and remove its turn, then start).",
    )

    # JSON's own types only: pydantic would read "yes" or 0 as a bool and "3" as a number,
    # which the schema says are errors (an integral 3.0 is a JSON integer and stays valid)
    @field_validator("stream", "background", mode="before")
    @classmethod
    def _a_boolean(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value

    @field_validator("run_timeout", "max_iterations", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, str | bool):
            raise ValueError("must be a number")
        return value

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return unicode_text(data)

    @field_validator("branch_from", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("leave it out rather than null")
        return value

    @model_validator(mode="after")
    def _one_place(self) -> Any:
        # as the schema says it (``not`` both members), whatever their values
        if {"replaces", "branch_from"} <= self.model_fields_set:
            raise ValueError("give replaces or branch_from, not both")
        return self


class ExternalEventRequest(BaseModel):
    """``POST /external-events``: a front end's answer to a waiting run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    session_id: str = Field(min_length=1, max_length=128, pattern=SESSION_ID_PATTERN)
    run_id: str | None = Field(None, max_length=128)
    # at least one character that is not blank, as the runtime (str.strip) and every regex
    # engine reading the schema agree: Unicode's and ECMAScript's white space, and the
    # separators U+001C-U+001F that Python also strips
    name: str = Field(min_length=1, max_length=200, pattern=r"[^\s\x1c-\x1f\x85\ufeff]")
    payload: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return unicode_text(data, stored=False)


class Usage(BaseModel):
    input_tokens: int = Field(description="Every input token, cached or not.")
    output_tokens: int = Field(description="Every output token, reasoning included.")
    model: str | None = Field(
        None, description="The model that answered (a fallback's, after a failover)."
    )
    cached_input_tokens: int | None = Field(
        None, description="Of input_tokens, those read from a prompt cache (where reported)."
    )
    cache_write_tokens: int | None = Field(
        None, description="Of input_tokens, those written to a prompt cache (where reported)."
    )
    reasoning_tokens: int | None = Field(
        None, description="Of output_tokens, those spent reasoning (where reported)."
    )


class Output(BaseModel):
    content: str
    structured: Any = Field(
        None, description="The validated answer, when the run asked for a response_format."
    )


class RunError(BaseModel):
    code: str
    message: str


RunStatusName = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]


class RunResult(BaseModel):
    """A blocking run's answer."""

    run_id: str
    session_id: str
    status: RunStatusName
    output: Output | None
    error: RunError | None
    usage: Usage | None


class ShownPart(BaseModel):
    """A content part as stored and shown: media by ``file_id`` (its bytes at
    ``GET /v1/files/{file_id}/content``) or by its ``https`` URL, never inline."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "image", "document"] = Field(
        description="`image`, or `document` for any other file (an input's `file` part is "
        "shown as the one it is)."
    )
    text: str | None = Field(None, description="A text part's text.")
    file_id: str | None = None
    url: str | None = Field(None, description="An `https` URL given as it is.")
    media_type: str | None = None
    filename: str | None = None
    bytes: int | None = Field(None, description="The file's size.")
    sha256: str | None = Field(None, description="The file's SHA-256, in hex.")


class RunView(RunResult):
    """``GET /v1/runs/{run_id}``."""

    agent: str
    input: str = Field(
        description="The prompt the run was started with: its text parts joined by a blank "
        "line when it was given as parts."
    )
    input_parts: list[ShownPart] | None = Field(
        None, description="The prompt's content parts, when it was given as parts; else null."
    )
    model: str | None = Field(
        description="The model that answered the run's latest model call, once there was one."
    )
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    metadata: dict[str, Any]
    events_url: str
    queue_position: int | None = Field(
        None,
        description="While the run waits in its session's queue (`multitask_strategy: "
        "enqueue`): its place, 1 being next; else null.",
    )


class BackgroundAccepted(BaseModel):
    """``202`` for ``background: true``."""

    run_id: str
    status: RunStatusName
    events_url: str
    queue_position: int | None = Field(
        None, description="Set when the run waits in its session's queue (1: next)."
    )


class CancelAnswer(BaseModel):
    """``POST /v1/runs/{run_id}/cancel``."""

    run_id: str
    status: str


class AcceptedBy(BaseModel):
    """``202`` of ``POST /external-events``."""

    accepted_by: list[str]


class SessionView(BaseModel):
    """``GET /v1/sessions/{session_id}``."""

    session_id: str
    created_at: str
    updated_at: str
    message_count: int
    last_run_id: str | None
    active_run_id: str | None
    title: str | None = Field(
        description="The session's first input (one line, at most 200 characters) until "
        "renamed with PATCH; null before its first run."
    )
    stateless: bool = Field(
        description="Made by a stateless protocol call (a chat completion, say): never "
        "listed, and deleted once idle for AGENT_STATELESS_RETENTION seconds."
    )


class SessionPatch(BaseModel):
    """``PATCH /v1/sessions/{session_id}``."""

    model_config = ConfigDict(extra="forbid")

    # not blank by either side's reckoning (Python's str.split and ECMAScript's \s name
    # different blanks), and no NUL, which no backend stores: the schema says what is checked
    title: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00]*[^\s\x00\x1c-\x1f\x85\ufeff][^\x00]*$",
        description="The session's new title.",
    )

    @field_validator("title", mode="after")
    @classmethod
    def _one_line(cls, value: str) -> str:
        line = " ".join(value.split())
        if not line:
            raise ValueError("must not be blank")
        return line

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return unicode_text(data)


class SessionList(BaseModel):
    """``GET /v1/sessions``: a page of the caller's sessions, most recently updated first."""

    sessions: list[SessionView]
    next: str | None = Field(
        pattern=SESSION_CURSOR_PATTERN,
        description="The cursor of the next page (pass it as ?before=), or null on the last.",
    )


class MessageView(BaseModel):
    """One stored message: its JSON form (``role``, ``content``...) and where it came from."""

    model_config = ConfigDict(extra="allow")

    position: int
    run_id: str
    created_at: str
    role: str
    content: str | list[ShownPart] | None = Field(
        None,
        description="The message's text, or (a user's message given as parts) its content "
        "parts, media by `file_id`. A tool result's images are its `parts`, alike.",
    )
    stopped: str | None = Field(
        None,
        description="On every message of a stopped turn (a cancelled run's): the run.cancelled "
        "reason. Absent otherwise. A stopped turn goes back to the model like any other.",
    )
    approval: Literal["approved", "denied"] | None = Field(
        None, description="On a tool result whose call needed approval: how it was decided."
    )
    reasoning: str | None = Field(
        None,
        description="On an assistant message of a model that reasoned: the text of its "
        "reasoning (never the provider's signed reasoning state). Absent otherwise.",
    )
    parent_run: str | None = Field(
        None,
        description="On the first message of each turn: the run whose turn this turn "
        "continues (null: a first turn). Turns with the same parent are branches of the "
        "conversation (a run started with `branch_from`), in the order they were stored. "
        "Absent on a turn's other messages.",
    )


class TurnRun(BaseModel):
    """The run behind a stored turn: what a front end shows beside its messages."""

    run_id: str
    agent: str
    status: RunStatusName
    model: str | None
    usage: Usage | None
    created_at: str | None
    finished_at: str | None


class MessagesView(BaseModel):
    """``GET /v1/sessions/{session_id}/messages``."""

    session_id: str
    messages: list[MessageView]
    runs: list[TurnRun] = Field(
        description="The runs whose messages are listed, oldest first: each turn's agent, "
        "status, model and token usage."
    )


class AgentSkill(BaseModel):
    name: str
    description: str


class AgentView(BaseModel):
    """One configured agent."""

    name: str
    description: str | None
    model: str = Field(description="The agent's primary model.")
    skills: list[AgentSkill]
    ready: bool = Field(description="Warmed up, and the server takes runs (not draining).")


class AgentList(BaseModel):
    """``GET /v1/agents``."""

    agents: list[AgentView]


class Problem(BaseModel):
    """``application/problem+json``."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
