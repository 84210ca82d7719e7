"""Ready-made bindings for common OpenAI-compatible hosts (filled in with the providers)."""

from __future__ import annotations

__all__: list[str] = []
