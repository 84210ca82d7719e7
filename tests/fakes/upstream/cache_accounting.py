"""Prompt cache accounting: the usage a provider's prompt cache would report for a request.

With ``FakeUpstream(prompt_cache=True)``, an answer whose behaviour scripts neither ``usage``
nor ``details`` counts its input from the request, one token per four characters of JSON, and
reports what a cache of the earlier requests (to this server, for the same model) would save:

- Anthropic Messages: the request is a sequence of blocks (each tool, each system block, each
  message's content block, in that order); the prefixes ending at a ``cache_control``
  breakpoint are cached once written. The longest earlier-written prefix that this request
  begins with is read (``cache_read_input_tokens``); what lies between it and the last
  breakpoint is written (``cache_creation_input_tokens``); ``input_tokens`` is what follows the
  last breakpoint (the uncached rest, as Anthropic counts it). Without a breakpoint nothing is
  cached.
- OpenAI (Chat Completions and Responses): caching is automatic. Every message (or item)
  boundary of a request is cached; ``cached_tokens`` is the longest earlier prefix this
  request begins with, within the same ``prompt_cache_key``; ``prompt_tokens`` (or
  ``input_tokens``) count all input.

A prefix shorter than ``min_tokens`` (1024 by default, as the real APIs) is never cached.
``cache_control`` marks and the volatile fields (``stream``, ``stream_options``) do not count
as content.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from .behaviours import UsageDetails

__all__ = ["PromptCache", "count_tokens"]


def count_tokens(text: str) -> int:
    """The fake's token count of ``text``: one per four characters, at least one."""
    return max(1, -(-len(text) // 4))


def _canonical(value: Any) -> str:
    return json.dumps(_unmarked(value), sort_keys=True, ensure_ascii=False)


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


class PromptCache:
    """The prefixes cached so far, by model (and prompt cache key); safe across threads."""

    def __init__(self, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._cached: set[str] = set()
        self._lock = threading.Lock()

    def account(self, protocol: str, body: dict[str, Any]) -> tuple[int, UsageDetails]:
        """``(input_tokens, details)`` for one request, as its wire counts them; the request's
        cacheable prefixes are cached from now on."""
        if protocol == "anthropic":
            return self._anthropic(body)
        return self._openai(protocol, body)

    # Anthropic --------------------------------------------------------------------------------

    def _anthropic(self, body: dict[str, Any]) -> tuple[int, UsageDetails]:
        units = list(_anthropic_units(body))
        scope = f"anthropic|{body.get('model')}"
        prefixes = list(_prefixes(scope, [text for text, _ in units]))
        total = prefixes[-1][1] if prefixes else 0
        breakpoints = [index for index, (_, marked) in enumerate(units) if marked]
        with self._lock:
            read = max((tokens for digest, tokens in prefixes if digest in self._cached), default=0)
            last = prefixes[breakpoints[-1]][1] if breakpoints else 0
            for index in breakpoints:
                digest, tokens = prefixes[index]
                if tokens >= self.min_tokens:
                    self._cached.add(digest)
        if last < self.min_tokens:
            return total, UsageDetails(cached=0, cache_write=0)
        written = max(last - read, 0)
        uncached = total - max(read, last)
        return uncached, UsageDetails(cached=read, cache_write=written)

    # OpenAI -----------------------------------------------------------------------------------

    def _openai(self, protocol: str, body: dict[str, Any]) -> tuple[int, UsageDetails]:
        key = body.get("prompt_cache_key")
        scope = f"{protocol}|{body.get('model')}|{key}"
        prefixes = list(_prefixes(scope, list(_openai_units(protocol, body))))
        total = prefixes[-1][1] if prefixes else 0
        with self._lock:
            read = max((tokens for digest, tokens in prefixes if digest in self._cached), default=0)
            for digest, tokens in prefixes:
                if tokens >= self.min_tokens:
                    self._cached.add(digest)
        return total, UsageDetails(cached=read if read >= self.min_tokens else 0)


def _prefixes(scope: str, units: list[str]) -> Iterator[tuple[str, int]]:
    """Each prefix's digest and token count, one per unit."""
    digest = hashlib.sha256(scope.encode()).hexdigest()
    tokens = 0
    for unit in units:
        digest = hashlib.sha256(f"{digest}|{unit}".encode()).hexdigest()
        tokens += count_tokens(unit)
        yield digest, tokens


def _anthropic_units(body: dict[str, Any]) -> Iterator[tuple[str, bool]]:
    """The request's blocks in cache order, each with whether a breakpoint ends it."""
    for tool in body.get("tools") or ():
        yield _canonical(tool), isinstance(tool, dict) and "cache_control" in tool
    system = body.get("system")
    if isinstance(system, str) and system:
        yield _canonical({"type": "text", "text": system}), False
    elif isinstance(system, list):
        for block in system:
            yield _canonical(block), isinstance(block, dict) and "cache_control" in block
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        role = message.get("role") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield _canonical({"role": role, "text": content}), False
            continue
        for block in content or ():
            marked = isinstance(block, dict) and "cache_control" in block
            yield _canonical({"role": role, "block": block}), marked


def _openai_units(protocol: str, body: dict[str, Any]) -> Iterator[str]:
    if protocol == "responses":
        yield _canonical({"tools": body.get("tools"), "instructions": body.get("instructions")})
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        for item in items or ():
            yield _canonical(item)
        return
    yield _canonical({"tools": body.get("tools")})
    for message in body.get("messages") or ():
        yield _canonical(message)
