"""Structured logs: one JSON object per line on stderr.

Each line has ``ts``, ``level``, ``logger`` and ``msg``, plus the record's extra fields
(``run_id``, ``session_id``, ``status``...). Prompts, tool arguments and keys are never logged
unless ``AGENT_LOG_LEVEL=debug`` (the run manager adds ``input`` only then).
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
from typing import Any

from app.wire import iso_ms

__all__ = ["JsonFormatter", "configure_logging", "logging_config"]

# attributes every LogRecord has: anything else was passed as ``extra``
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime"}
)
# uvicorn's own extras, for its coloured console output
_SKIP = frozenset({"color_message"})
# a stream token in a URL (uvicorn's access log at debug): masked, never written
_TOKEN = re.compile(r"([?&]token=)[^&\s\"']+")


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": iso_ms(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _mask(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in _SKIP and not key.startswith("_"):
                entry[key] = _mask(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _mask(text: str) -> str:
    return _TOKEN.sub(r"\1[redacted]", text) if "token=" in text else text


def logging_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the service and uvicorn, at ``level``."""
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "app.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
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


def configure_logging(level: str) -> None:
    """Install the JSON handler on the service's loggers (idempotent)."""
    logging.config.dictConfig(logging_config(level))
