"""Checks of AG-UI streams with the protocol's own Python models (PyPI ``ag-ui-protocol``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ag_ui.core import Event
from pydantic import BaseModel, TypeAdapter

__all__ = ["data_frames", "validate_agui"]

_EVENT: TypeAdapter[Any] = TypeAdapter(Event)


def data_frames(body: bytes | str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, decoded (``[DONE]`` kept as the string)."""
    text = body.decode() if isinstance(body, bytes) else body
    out: list[Any] = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line.startswith("data: ")]
        if lines:
            data = "\n".join(line[6:] for line in lines)
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _no_extras(model: Any) -> None:
    if isinstance(model, BaseModel):
        assert not model.model_extra, f"{type(model).__name__} carries {model.model_extra}"
        for name in type(model).model_fields:
            _no_extras(getattr(model, name))
    elif isinstance(model, list):
        for item in model:
            _no_extras(item)


def validate_agui(events: Sequence[dict[str, Any]]) -> None:
    """Each event is a valid AG-UI 1.0 event carrying nothing the protocol does not define."""
    for event in events:
        _no_extras(_EVENT.validate_python(event))
