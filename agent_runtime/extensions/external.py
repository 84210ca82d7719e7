"""External event envelopes and the request-response extension base (in progress)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ExternalEvent"]


@dataclass(frozen=True, slots=True)
class ExternalEvent:
    """An answer from outside the run (a person, a front end) addressed to an extension."""

    name: str
    payload: dict[str, Any]
