"""Foreign failures of the SDKs and HTTP clients, translated into ``ProviderError``.

This module is the only place that knows the exception types of ``openai``, ``anthropic``,
``httpx`` and ``httpx2`` (the HTTP client the SDKs run on). Everything a provider raises goes
through ``translate_errors`` on its way out::

    foreign exception                                  raised as
    ------------------------------------------------   -------------------------------------------
    APIStatusError (an HTTP status >= 400)             ProviderStatusError; retryable for 408, 409,
                                                       429 and 5xx (529 included), honouring an
                                                       ``x-should-retry`` header; ``retry_after``
                                                       from ``retry-after-ms`` / ``retry-after``
    APIStatusError / APIError raised by an error       ProviderStatusError; retryable when the
      event inside a 200 stream                        error type is server-side (overloaded, ...)
    an error event a provider reads itself             the same (``stream_error``): the Responses
      (Responses ``error``, ``response.failed``)         API's error events are not the SDK's
    APITimeoutError, httpx(2).TimeoutException         ProviderTimeoutError (retryable)
    APIConnectionError, httpx(2).TransportError,       ProviderConnectionError (retryable; not for
      a dropped stream, TLS failure                      an unsupported URL scheme)
    a stream that ends without its end marker          ProviderConnectionError (retryable), from
      (``stream_cut_short``)                             the provider itself
    a 200 whose body is not the protocol's JSON or     ProviderError with reason
      SSE: an event that is not JSON, data that does     ``malformed_response`` (not retryable: the
      not match the schema, a stream answered with       upstream answered, and what it answered
      another content type (``stream_ended_early``)      is broken; no failover)
    other SDK errors                                   ProviderError (not retryable)

Secrets never travel further than this module. Messages are built here from what is safe to
show whoever reads a run's failure: the status, and the upstream's error type and code when
they are short identifiers. The upstream's own error text (which may quote a key, masked or not,
or the request) is not part of a message: it is logged, redacted, at debug level on the
``agent_runtime.providers`` logger. The foreign exception kept as ``__cause__`` is scrubbed in
place first: its ``args``,
the SDK's ``message``/``body`` attributes and the ``Authorization``-like headers of the request
it holds, along its whole ``__cause__``/``__context__`` chain.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import json
import logging
import math
import re
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias

from ..errors import (
    ConfigurationError,
    ProviderConnectionError,
    ProviderError,
    ProviderStatusError,
    ProviderTimeoutError,
)

__all__ = [
    "MALFORMED_RESPONSE",
    "REDACTED",
    "RETRYABLE_STATUS",
    "ErrorTranslator",
    "configuration_error",
    "is_retryable_status",
    "map_exception",
    "parse_retry_after",
    "redact",
    "scrub_exception",
    "stream_cut_short",
    "stream_ended_early",
    "stream_error",
    "translate_errors",
]

REDACTED = "[REDACTED]"

#: ``ProviderError.reason`` of a 200 answer whose body is not the protocol's JSON or SSE.
MALFORMED_RESPONSE = "malformed_response"

#: Statuses another attempt may not repeat: timeout, conflict (lock contention), rate limit.
#: Every 5xx is retryable too (529 is Anthropic's "overloaded").
RETRYABLE_STATUS = frozenset({408, 409, 429})

# error types carried by an error event inside a stream (or a body) that are worth another try
_RETRYABLE_ERROR_TYPES = frozenset(
    {
        "api_error",
        "internal_error",
        "overloaded_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "server_error",
        "service_unavailable",
        "timeout",
        "timeout_error",
    }
)

# headers that carry credentials; scrubbed from requests attached to foreign exceptions
_SECRET_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")

# generic credential shapes, redacted even when the exact secret is not known
_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s'\",;}\]]+")
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")
_KEY_FIELD = re.compile(
    r"(?i)\b(x-api-key|api[-_]?key|access[-_]?token)(['\"]?\s*[:=]\s*['\"]?)[^\s'\",;}\]]+"
)

# a key as upstreams quote it, masked: "sk-canar*****7f3a9", "sk-abc...wxyz", "****7f3a"
_MASKED_KEY = re.compile(r"[A-Za-z0-9_\-]*(?:\*{3,}|\.{3,}|…)[A-Za-z0-9_\-]*[A-Za-z0-9]")
_MASKED_SK = re.compile(r"\bsk-[A-Za-z0-9_\-]*(?:\*+|\.{3,}|…)[A-Za-z0-9_\-]*")
# an upstream's error type or code shown in messages: an identifier, never free text
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
# a media type shown in messages (``application/json``): never free text
_IDENTIFIER_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.+\-]{0,63}/[A-Za-z0-9_.+\-]{1,64}")

logger = logging.getLogger("agent_runtime.providers")

# a secret shorter than this is a placeholder ("ollama", "EMPTY"), not worth redacting
_MIN_SECRET_LENGTH = 8
_MAX_DETAIL = 300

ErrorTypes: TypeAlias = tuple[type[BaseException], ...]


@dataclass(frozen=True, slots=True)
class _Foreign:
    """The foreign exception types, grouped by what they mean."""

    status: ErrorTypes
    timeout: ErrorTypes
    bad_url: ErrorTypes
    connection: ErrorTypes
    validation: ErrorTypes
    api: ErrorTypes
    sdk: ErrorTypes
    transport: ErrorTypes


_FOREIGN_MODULES = ("openai", "anthropic", "httpx", "httpx2", "anyio")


def _foreign() -> _Foreign:
    """The foreign types of the modules imported so far.

    An exception can only come from a module that was imported, so a module not imported yet
    is simply left out: importing an SDK here would stall the event loop for seconds.
    """
    return _foreign_of(tuple(name in sys.modules for name in _FOREIGN_MODULES))


@functools.cache
def _foreign_of(loaded: tuple[bool, ...]) -> _Foreign:
    modules = {
        name: sys.modules[name]
        for name, present in zip(_FOREIGN_MODULES, loaded, strict=True)
        if present
    }

    def types(*paths: str) -> ErrorTypes:
        found: list[type[BaseException]] = []
        for path in paths:
            module_name, _, attribute = path.partition(".")
            module = modules.get(module_name)
            if module is not None:
                found.append(getattr(module, attribute))
        return tuple(found)

    return _Foreign(
        status=types("openai.APIStatusError", "anthropic.APIStatusError"),
        timeout=types(
            "openai.APITimeoutError",
            "anthropic.APITimeoutError",
            "httpx2.TimeoutException",
            "httpx.TimeoutException",
        ),
        bad_url=types(
            "httpx2.UnsupportedProtocol",
            "httpx.UnsupportedProtocol",
            "httpx2.InvalidURL",
            "httpx.InvalidURL",
        ),
        connection=(
            *types(
                "openai.APIConnectionError",
                "anthropic.APIConnectionError",
                "httpx2.TransportError",
                "httpx.TransportError",
                "httpx2.DecodingError",
                "httpx.DecodingError",
                "anyio.EndOfStream",
                "anyio.BrokenResourceError",
            ),
            ssl.SSLError,
            ConnectionError,
        ),
        validation=types(
            "openai.APIResponseValidationError", "anthropic.APIResponseValidationError"
        ),
        api=types("openai.APIError", "anthropic.APIError"),
        sdk=types("openai.OpenAIError", "anthropic.AnthropicError"),
        transport=(*types("httpx2.HTTPError", "httpx.HTTPError"), OSError),
    )


Secrets = Sequence[str] | Callable[[], Sequence[str]]


# redaction --------------------------------------------------------------------------------------


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret and every credential-looking token replaced."""
    for secret in secrets:
        if secret and len(secret) >= _MIN_SECRET_LENGTH and secret in text:
            text = text.replace(secret, REDACTED)
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    text = _MASKED_SK.sub(f"sk-{REDACTED}", text)
    text = _SK_KEY.sub(f"sk-{REDACTED}", text)
    text = _MASKED_KEY.sub(_masked, text)
    return _KEY_FIELD.sub(rf"\1\2{REDACTED}", text)


def _masked(match: re.Match[str]) -> str:
    token = match.group(0)
    # a masked key shows some of its characters around the mask; plain ellipses do not
    visible = sum(char.isalnum() for char in token)
    return REDACTED if visible >= 4 else token


def _redact_value(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {key: _redact_value(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_value(item, secrets) for item in value]
    if isinstance(value, tuple):
        return tuple(_redact_value(item, secrets) for item in value)
    return value


def _scrub_request(request: object) -> None:
    headers = getattr(request, "headers", None)
    if headers is None or not hasattr(headers, "__setitem__"):
        return
    for name in _SECRET_HEADERS:
        with contextlib.suppress(Exception):  # case-insensitive Headers of httpx or httpx2
            if name in headers:
                headers[name] = REDACTED


def _scrub_content(response: object, secrets: Sequence[str]) -> None:
    """Redact a secret the upstream echoed in the body an SDK error keeps."""
    content = getattr(response, "_content", None)
    if not isinstance(content, bytes):
        return
    for secret in secrets:
        if secret and len(secret) >= _MIN_SECRET_LENGTH:
            content = content.replace(secret.encode(), REDACTED.encode())
    with contextlib.suppress(AttributeError, TypeError):
        response._content = content  # type: ignore[attr-defined]


def scrub_exception(exc: BaseException, secrets: Sequence[str] = ()) -> None:
    """Redact secrets from ``exc`` and every exception chained to it, in place.

    Covers what ``str``, ``repr`` and a formatted traceback show (``args``, notes), the
    attributes that hold upstream text (the SDK's ``message``, ``body``, ``api_message``, a JSON
    decoder's ``doc``), a body the upstream echoed, and the credential headers of the request an
    SDK or httpx exception keeps a reference to.
    """
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        with contextlib.suppress(AttributeError, TypeError):  # exotic exception types
            current.args = tuple(_redact_value(arg, secrets) for arg in current.args)
        notes = getattr(current, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [redact(note, secrets) if isinstance(note, str) else note for note in notes]
        attributes = getattr(current, "__dict__", {})
        for name in ("message", "body", "api_message", "doc"):
            if name in attributes:
                with contextlib.suppress(AttributeError, TypeError):  # a read-only attribute
                    setattr(current, name, _redact_value(attributes[name], secrets))
        for name in ("_request", "request"):
            if name in attributes:
                _scrub_request(attributes[name])
        response = attributes.get("response")
        if response is not None:
            _scrub_request(getattr(response, "_request", None))
            _scrub_content(response, secrets)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        if current.__cause__ is not None:
            pending.append(current.__cause__)
        if current.__context__ is not None:
            pending.append(current.__context__)


# status helpers -----------------------------------------------------------------------------


def is_retryable_status(status: int) -> bool:
    """True for the statuses worth another attempt: 408, 409, 429 and every 5xx."""
    return status in RETRYABLE_STATUS or 500 <= status <= 599


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds the upstream asked to wait: ``retry-after-ms``, else ``retry-after``.

    ``retry-after`` may be seconds (a float is accepted) or an HTTP date. Unparseable, negative
    or infinite values give None.
    """
    if not headers:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    value = headers.get("retry-after")
    if value:
        parsed = email.utils.parsedate_tz(value)
        if parsed is not None:
            moment = email.utils.mktime_tz(parsed)
            return max(0.0, moment - (time.time() if now is None else now))
    return None


def _should_retry_header(headers: Mapping[str, str] | None) -> bool | None:
    if not headers:
        return None
    value = (headers.get("x-should-retry") or "").strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None


def _error_fields(body: object) -> tuple[str | None, str | None]:
    """``(type, message)`` of an error body: ``{"error": {...}}`` or the inner object itself."""
    inner = body.get("error", body) if isinstance(body, Mapping) else body
    if isinstance(inner, Mapping):
        kind = inner.get("type") or inner.get("code")
        message = inner.get("message")
        return (
            str(kind) if kind is not None else None,
            str(message) if message is not None else None,
        )
    if isinstance(inner, str):
        return None, inner
    return None, None


def _detail(text: str | None, secrets: Sequence[str], subject: str) -> str | None:
    """The upstream's own error text, redacted, logged at debug: for ``upstream_detail``,
    never for a message."""
    if not text:
        return None
    text = " ".join(redact(text, secrets).split())
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 3] + "..."
    logger.debug("%s: upstream error text: %s", subject, text)
    return text


def _kind(kind: str | None, code: str | None = None) -> str:
    """`` (type)`` or `` (type, code)`` for a message: identifiers only, never free text."""
    shown = [
        value
        for value in dict.fromkeys((kind, code))
        if value is not None and _IDENTIFIER.fullmatch(value)
    ]
    return f" ({', '.join(shown)})" if shown else ""


def stream_cut_short(*, provider: str, model: str, marker: str) -> ProviderConnectionError:
    """The error for a stream whose body ended cleanly before the model's end ``marker``.

    The SDKs take the end of the body as the end of the answer, so a proxy or server that
    closes the connection mid-answer would otherwise pass for a complete (partial) answer.
    Retryable like any dropped connection: the runtime retries it only if none of the call's
    text reached the consumer yet.
    """
    return ProviderConnectionError(
        f"{provider} model {model!r}: the stream ended before the answer did (no {marker});"
        " the connection was cut",
        retryable=True,
        provider=provider,
    )


def stream_ended_early(
    response: object, *, provider: str, model: str, marker: str
) -> ProviderError:
    """The error for a 200 stream that ended before the model's end ``marker``.

    A body of another content type than ``text/event-stream`` (a JSON or HTML body where a
    stream was asked for, as a broken proxy or a chaos upstream sends) was never a stream: the
    SDK's SSE decoder found no event in it, which is not a cut connection but a malformed
    answer. A real event stream that stopped early is ``stream_cut_short``.
    """
    headers = getattr(response, "headers", None)
    content_type = ""
    if headers is not None:
        with contextlib.suppress(Exception):  # a stand-in response without real headers
            content_type = str(headers.get("content-type") or "")
    if content_type and not content_type.lower().startswith("text/event-stream"):
        kind = content_type.split(";")[0].strip()
        shown = f" ({kind})" if _IDENTIFIER_TYPE.fullmatch(kind) else ""
        return ProviderError(
            f"{provider} model {model!r} sent a malformed response: a 200 that is not an event "
            f"stream{shown}",
            retryable=False,
            provider=provider,
            reason=MALFORMED_RESPONSE,
        )
    return stream_cut_short(provider=provider, model=model, marker=marker)


def stream_error(
    kind: str | None,
    message: str | None,
    *,
    provider: str,
    model: str,
    secrets: Sequence[str] = (),
) -> ProviderStatusError:
    """The error for an error event that a provider reads from a 200 stream itself (the
    Responses API's ``error`` and ``response.failed`` events, which the SDK passes on as
    data): as ``map_exception`` makes one of an SDK's error event, ``kind`` the upstream's
    error type or code, its ``message`` kept out of the error's text."""
    subject = f"{provider} model {model!r}"
    return ProviderStatusError(
        f"{subject} reported an error in its stream{_kind(kind)}",
        retryable=kind in _RETRYABLE_ERROR_TYPES,
        provider=provider,
        upstream_detail=_detail(message, secrets, subject),
    )


# the mapping ------------------------------------------------------------------------------------


def map_exception(
    exc: BaseException, *, provider: str, model: str, secrets: Sequence[str] = ()
) -> ProviderError | None:
    """The ProviderError for a foreign failure, or None if ``exc`` is not one.

    Scrubs ``exc`` (and its chain) in place, so raising the result ``from exc`` is safe.
    """
    if isinstance(exc, ProviderError) or not isinstance(exc, Exception):
        return None
    mapped = _map(exc, provider=provider, model=model, secrets=secrets)
    if mapped is not None:
        scrub_exception(exc, secrets)
    return mapped


def _map(
    exc: Exception, *, provider: str, model: str, secrets: Sequence[str]
) -> ProviderError | None:
    subject = f"{provider} model {model!r}"
    foreign = _foreign()
    if isinstance(exc, foreign.status):
        return _status_error(exc, provider=provider, subject=subject, secrets=secrets)
    if isinstance(exc, foreign.timeout):
        return ProviderTimeoutError(
            f"{subject} did not answer within the client timeout", retryable=True, provider=provider
        )
    if isinstance(exc, foreign.bad_url):
        return ProviderConnectionError(
            f"{subject}: the endpoint URL is not usable ({type(exc).__name__}); check base_url",
            retryable=False,
            provider=provider,
        )
    if isinstance(exc, foreign.connection):
        return ProviderConnectionError(
            f"{subject}: the connection failed or dropped ({_root_name(exc)})",
            retryable=True,
            provider=provider,
        )
    if isinstance(exc, foreign.validation):
        return ProviderError(
            f"{subject} sent a malformed response: data that does not match the API schema",
            retryable=False,
            provider=provider,
            reason=MALFORMED_RESPONSE,
        )
    if isinstance(exc, foreign.api):
        # an error event inside an otherwise successful stream
        kind, message = _error_fields(getattr(exc, "body", None))
        return ProviderStatusError(
            f"{subject} reported an error in its stream{_kind(kind)}",
            retryable=kind in _RETRYABLE_ERROR_TYPES,
            provider=provider,
            upstream_detail=_detail(message, secrets, subject),
        )
    if isinstance(exc, json.JSONDecodeError):
        return ProviderError(
            f"{subject} sent a malformed response: an event that is not JSON",
            retryable=False,
            provider=provider,
            reason=MALFORMED_RESPONSE,
        )
    if isinstance(exc, foreign.sdk):
        return ProviderError(
            f"{subject}: {type(exc).__name__}",
            retryable=False,
            provider=provider,
            upstream_detail=_detail(str(exc), secrets, subject),
        )
    return None


def _status_error(
    exc: Exception, *, provider: str, subject: str, secrets: Sequence[str]
) -> ProviderStatusError:
    status = int(getattr(exc, "status_code", 0) or 0)
    response = getattr(exc, "response", None)
    headers: Mapping[str, str] | None = getattr(response, "headers", None)
    kind, message = _error_fields(getattr(exc, "body", None))
    retry_after = parse_retry_after(headers)
    if status >= 400:
        retryable = is_retryable_status(status)
        override = _should_retry_header(headers)
        if override is not None:
            retryable = override
        text = f"{subject} answered HTTP {status}{_kind(kind, _error_code(exc))}"
        code: int | None = status
    else:
        # Anthropic raises an error event of a 200 stream as a status error of that response
        retryable = kind in _RETRYABLE_ERROR_TYPES
        text = f"{subject} reported an error in its stream{_kind(kind, _error_code(exc))}"
        code = None
    if retry_after is not None and retryable:
        text += f", retry after {retry_after:g} s"
    return ProviderStatusError(
        text,
        upstream_detail=_detail(message, secrets, subject),
        retryable=retryable,
        status_code=code,
        retry_after=retry_after,
        provider=provider,
    )


def _error_code(exc: Exception) -> str | None:
    """The upstream's ``code`` beside its ``type`` (OpenAI: ``invalid_api_key``)."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, Mapping) else None
    code = inner.get("code") if isinstance(inner, Mapping) else None
    return code if isinstance(code, str) else None


def _root_name(exc: BaseException) -> str:
    """The name of the innermost transport error, more telling than the SDK's wrapper."""
    names = [type(exc).__name__]
    current: BaseException | None = exc.__cause__ or exc.__context__
    depth = 0
    while current is not None and depth < 8:
        if isinstance(current, _foreign().transport):
            names.append(type(current).__name__)
        current = current.__cause__ or current.__context__
        depth += 1
    return names[-1]


def configuration_error(
    exc: Exception, *, what: str, secrets: Sequence[str] = ()
) -> ConfigurationError:
    """A ConfigurationError for a client that could not be built, ``exc`` scrubbed."""
    scrub_exception(exc, secrets)
    # for the operator starting the service: the text says what to fix (redacted)
    text = " ".join(redact(str(exc), secrets).split())[:_MAX_DETAIL]
    return ConfigurationError(f"{what}: {type(exc).__name__}{f': {text}' if text else ''}")


# the context manager ------------------------------------------------------------------------------


class ErrorTranslator:
    """``with ErrorTranslator(...)``: foreign failures inside leave as ProviderError.

    Works across ``yield`` in an async generator; ``GeneratorExit`` and ``CancelledError`` pass
    through untouched.
    """

    __slots__ = ("_model", "_provider", "_secrets")

    def __init__(self, *, provider: str, model: str, secrets: Secrets = ()) -> None:
        self._provider = provider
        self._model = model
        self._secrets = secrets

    def __enter__(self) -> ErrorTranslator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        secrets = self._secrets() if callable(self._secrets) else self._secrets
        mapped = map_exception(exc, provider=self._provider, model=self._model, secrets=secrets)
        if mapped is not None:
            raise mapped from exc


def translate_errors(*, provider: str, model: str, secrets: Secrets = ()) -> ErrorTranslator:
    """The context manager form of ``map_exception``."""
    return ErrorTranslator(provider=provider, model=model, secrets=secrets)
