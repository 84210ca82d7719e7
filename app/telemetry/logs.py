"""Structured logs on stderr: one JSON object per line, or one readable line on a terminal.

Each record has ``ts``, ``level``, ``logger`` and ``msg``, plus its extra fields (``run_id``,
``session_id``, ``status``...). ``AGENT_LOG_FORMAT`` picks the form: ``json``, ``text``
(``2026-11-30T12:00:00.000Z WARNING app.server.lifespan warm-up failed; retrying error="..."
retry_in=0.5``), or ``auto`` (the default: text when stderr is a terminal, JSON otherwise).
Both forms carry the same fields; uvicorn's own loggers use the same formatter. Prompts, tool
arguments and keys are never logged unless ``AGENT_LOG_LEVEL=debug`` (the run manager adds
``input`` only then).
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import sys
from typing import IO, Any

from app.bus.wire import iso_ms

__all__ = [
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "logging_config",
    "make_formatter",
    "resolve_format",
]

# attributes every LogRecord has: anything else was passed as ``extra``
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime"}
)
# uvicorn's own extras, for its coloured console output
_SKIP = frozenset({"color_message"})
# a stream token in a URL (uvicorn's access log at debug): masked, never written
_TOKEN = re.compile(r"([?&]token=)[^&\s\"']+")
# a text value written bare: anything else is quoted as a JSON string
_BARE = re.compile(r"[^\s\"=\\]+")
# what every record repeats, worked out once: the encoder (``json.dumps`` with options builds
# one per call), the level names, and which of a record's attributes are extras
_dumps = json.JSONEncoder(ensure_ascii=False, default=str).encode
_LEVELS: dict[str, str] = {}
_NOT_EXTRA = _STANDARD | _SKIP


def _level(name: str) -> str:
    level = _LEVELS.get(name)
    if level is None:
        level = _LEVELS[name] = name.lower()
    return level


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record as the fields both forms write: ``ts``, ``level``, ``logger``, ``msg``, the
    extras, and ``exc`` (the traceback) when there is one."""
    entry: dict[str, Any] = {
        "ts": iso_ms(record.created),
        "level": _level(record.levelname),
        "logger": record.name,
        "msg": _mask(record.getMessage()),
    }
    for key, value in record.__dict__.items():
        if key not in _NOT_EXTRA and not key.startswith("_"):
            entry[key] = _mask(value) if isinstance(value, str) else value
    return entry


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = _fields(record)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _dumps(entry)


class TextFormatter(logging.Formatter):
    """Formats a record as one readable line: time, level, logger, message, then every extra
    field as ``key=value`` (a value with spaces, quotes or ``=`` quoted as a JSON string); a
    traceback follows on the next lines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = _fields(record)
        head = f"{entry.pop('ts')} {entry.pop('level').upper():<7} {entry.pop('logger')}"
        parts = [head, entry.pop("msg")]
        parts.extend(f"{key}={_text_value(value)}" for key, value in entry.items())
        line = " ".join(parts)
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def _text_value(value: Any) -> str:
    if isinstance(value, str) and _BARE.fullmatch(value):
        return value
    return _dumps(value)


def _mask(text: str) -> str:
    return _TOKEN.sub(r"\1[redacted]", text) if "token=" in text else text


def resolve_format(log_format: str, stream: IO[str] | None = None) -> str:
    """``text`` or ``json``: ``auto`` is text when ``stream`` (stderr) is a terminal."""
    if log_format != "auto":
        return log_format
    stream = sys.stderr if stream is None else stream
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no stream, or a closed one
        return "json"


def make_formatter(log_format: str = "auto") -> logging.Formatter:
    """The formatter of ``AGENT_LOG_FORMAT`` (``auto`` decided here, for this process's
    stderr: each worker of ``--workers N`` decides for itself)."""
    if resolve_format(log_format) == "text":
        return TextFormatter()
    return JsonFormatter()


def logging_config(level: str, log_format: str = "auto") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the service and uvicorn, at ``level``, in
    ``log_format`` (``AGENT_LOG_FORMAT``)."""
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "agent": {"()": "app.telemetry.logs.make_formatter", "log_format": log_format}
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "agent",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "app": {"handlers": ["stderr"], "level": upper, "propagate": False},
            "agent_runtime": {"handlers": ["stderr"], "level": upper, "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            "uvicorn.access": {"handlers": ["stderr"], "level": upper, "propagate": False},
        },
    }


def configure_logging(level: str, log_format: str = "auto") -> None:
    """Install the handler on the service's loggers (idempotent)."""
    logging.config.dictConfig(logging_config(level, log_format))
